"""Our pixels for an image are the ones transformers' processor gives the same model."""

import torch
import transformers
from PIL import Image

from pagoda.engine.multimodal.image_processing import SquareResize


def photo(width: int, height: int) -> Image.Image:
    gen = torch.Generator().manual_seed(width * 7 + height)
    data = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(data.numpy(), "RGB")


def test_gemma3_pixels_equal_transformers_processor():
    processor = transformers.Gemma3ImageProcessorPil(size={"height": 64, "width": 64})
    for image in (photo(100, 37), photo(40, 90), photo(64, 64)):
        want = processor(images=image, return_tensors="pt")["pixel_values"][0]
        got = SquareResize(64)(image)
        assert got.shape == (3, 64, 64)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
