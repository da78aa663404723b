"""Gemma 3's image side (a SigLIP tower, then the pooled projector) gives transformers' image
token embeddings for the same pixels."""

import pytest
import torch

from pagoda.engine.layers.linear import Placement
from pagoda.engine.layers.vision_encoder import patches_of
from pagoda.engine.models.vision_tower import gemma3_image_tower
from pagoda.kernels.kernel_ops import TORCH_OPS
from tests.engine.tiny_vision import GEMMA3_TOKENS_PER_IMAGE, tiny_gemma3_vision

CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)


@pytest.fixture(scope="module")
def gemma3():
    return tiny_gemma3_vision()


def test_patches_are_read_as_the_conv_kernel_reads_them():
    pixels = torch.randn(2, 3, 8, 12)
    kernel = torch.randn(5, 3, 4, 4)
    want = torch.nn.functional.conv2d(pixels, kernel, stride=4).flatten(2).transpose(1, 2)
    got = patches_of(pixels, 4) @ kernel.reshape(5, -1).T
    torch.testing.assert_close(got, want)


def test_gemma3_image_tokens_equal_transformers(gemma3):
    weights = {name: t.detach() for name, t in gemma3.state_dict().items()}
    tower = gemma3_image_tower(gemma3.config, weights, CPU)
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = gemma3.model.get_image_features(pixels).pooler_output
        got = tower(pixels)
    assert got.shape == (2, GEMMA3_TOKENS_PER_IMAGE, 64) == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_an_image_of_another_size_than_the_tower_takes_is_refused(gemma3):
    weights = {name: t.detach() for name, t in gemma3.state_dict().items()}
    tower = gemma3_image_tower(gemma3.config, weights, CPU)
    with pytest.raises(ValueError, match=r"\[images, 3, 32, 32\] pixels"):
        tower(torch.randn(1, 3, 16, 16))
