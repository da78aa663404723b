"""A chat with images on Qwen2.5-VL: each image, at its own size, becomes a grid of tokens that
the windowed tower's merged patches fill, placed on that grid by multimodal RoPE; the engine
gives transformers' logits whatever the prefill chunk (chunks end inside an image, whose tokens
attend causally), its greedy tokens after an image, and the same image again hits the prefix
cache and is not encoded again."""

import io

import pytest
import torch
import transformers
from PIL import Image

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ImageInputError
from pagoda.engine.layers.grid_vision_encoder import window_order
from pagoda.engine.loading.loader import load_model
from pagoda.engine.multimodal.image_processing import GridResize, image_processor
from pagoda.engine.multimodal.images import DecodedImage, decode_image_bytes
from pagoda.engine.multimodal.placeholders import image_spans
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.family_parity import assert_same_argmax
from tests.engine.tiny_vision import (
    QWEN2_5_VL_MAX_PIXELS,
    QWEN2_5_VL_MIN_PIXELS,
    qwen2_5_vl_tokenizer,
    save_qwen2_5_vl,
    tiny_qwen2_5_vl,
)

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
# Two sizes whose grids differ (9 x 7 and 11 x 5 merge units), each more than one window wide.
SIZES = ((250, 200), (150, 300))


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_5_vl()


@pytest.fixture(scope="module")
def folder(qwen, tmp_path_factory):
    return save_qwen2_5_vl(qwen, tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf_model(folder):
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def runner(folder):
    return ModelRunner(load_model(folder, quantization="none"),
                       EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1))


def photo(seed: int, size: tuple[int, int] = SIZES[0]) -> DecodedImage:
    gen = torch.Generator().manual_seed(seed)
    width, height = size
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(png, format="PNG")
    return decode_image_bytes(png.getvalue(), "image/png", f"photo {seed}")


def photos(count: int) -> list[DecodedImage]:
    return [photo(i, SIZES[i % len(SIZES)]) for i in range(count)]


def processor(model) -> GridResize:
    vision = model.config.vision_config
    return GridResize(vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size,
                      QWEN2_5_VL_MIN_PIXELS, QWEN2_5_VL_MAX_PIXELS)


def prompt(qwen, images: list[DecodedImage], words: str = "the cat sat on the mat") -> list[int]:
    """Text, then each image as Qwen's template lays it out (its start, a placeholder per merge
    unit, its end) followed by text, then text again."""
    tokenizer = qwen2_5_vl_tokenizer()
    c = qwen.config
    text = tokenizer.encode(words, add_special_tokens=False)
    ids = [*text]
    for image in images:
        tokens = processor(qwen).process(image.image).tokens
        ids += [c.vision_start_token_id, *[c.image_token_id] * tokens, c.vision_end_token_id,
                *text]
    return ids + text


def spans_of(runner, ids: list[int], images: list[DecodedImage]):
    tower = runner.image_tower
    return image_spans(ids, images, tower.image_token_id, image_processor(tower), whole=False)


@torch.inference_mode()
def hf_logits(hf_model, ids: list[int], spans) -> torch.Tensor:
    image_token = hf_model.config.image_token_id
    grids = torch.tensor([[1, s.pixels.rows, s.pixels.columns] for s in spans])
    return hf_model(input_ids=torch.tensor([ids]),
                    pixel_values=torch.cat([s.pixels.patches for s in spans]),
                    image_grid_thw=grids,
                    mm_token_type_ids=torch.tensor([[int(t == image_token) for t in ids]])
                    ).logits[0]


def test_pixels_equal_transformers_processor(qwen):
    vision = qwen.config.vision_config
    theirs = transformers.Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
        temporal_patch_size=vision.temporal_patch_size,
        size={"shortest_edge": QWEN2_5_VL_MIN_PIXELS, "longest_edge": QWEN2_5_VL_MAX_PIXELS})
    for size in (*SIZES, (20, 30), (2000, 900)):
        image = photo(1, size).image
        want = theirs(images=image, return_tensors="pt")
        got = processor(qwen)(image)
        assert [1, got.rows, got.columns] == want["image_grid_thw"][0].tolist()
        torch.testing.assert_close(got.patches, want["pixel_values"], atol=1e-5, rtol=0)


def test_an_image_too_long_for_its_width_is_refused(qwen):
    with pytest.raises(ImageInputError, match="at most 200 times longer than wide"):
        processor(qwen).size(2010, 10)


def test_windows_follow_transformers_order():
    """A 5 x 7 grid of merge units in windows of 2: six windows row by row, the last of each
    row one unit wide, the last row one unit high."""
    order, lengths = window_order(5, 7, 2)
    assert lengths == [4, 4, 4, 2, 4, 4, 4, 2, 2, 2, 2, 1]
    assert order[:8].tolist() == [0, 1, 7, 8, 2, 3, 9, 10]


@pytest.mark.parametrize("chunk", [512, 13])
@pytest.mark.parametrize("num_images", [1, 2])
def test_qwen2_5_vl_with_images_gives_transformers_logits(qwen, runner, hf_model, chunk,
                                                          num_images):
    """13-token chunks end inside the images: a chunk's image tokens take their rows of the
    image's embeddings, and their grid positions."""
    images = photos(num_images)
    ids = prompt(qwen, images)
    spans = spans_of(runner, ids, images)
    ours = prompt_logits(runner, ids, chunk=chunk, images=spans)
    theirs = hf_logits(hf_model, ids, spans)
    assert_same_argmax(ours, theirs, f"{num_images} image(s), chunks of {chunk}")
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
