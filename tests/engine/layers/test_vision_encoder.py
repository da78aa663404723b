"""Gemma 3's image side (a SigLIP tower, then the pooled projector) gives transformers' image
token embeddings for the same pixels."""

import pytest
import torch
import transformers

from pagoda.engine.layers.linear import Placement
from pagoda.engine.layers.vision_encoder import patches_of
from pagoda.engine.models.vision_tower import gemma3_image_tower
from pagoda.kernels.kernel_ops import TORCH_OPS

# A tiny tower: 32-pixel images of 4-pixel patches (8 x 8), pooled to 4 x 4 image tokens.
VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4, "image_size": 32, "patch_size": 4,
          "layer_norm_eps": 1e-6}
TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300}


@pytest.fixture(scope="module")
def gemma3():
    torch.manual_seed(0)
    config = transformers.Gemma3Config(text_config=TEXT, vision_config=VISION,
                                       mm_tokens_per_image=16, image_token_index=299,
                                       boi_token_index=297, eoi_token_index=298)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the projection and norm start at zeros
        for name, p in model.named_parameters():
            if "multi_modal_projector" in name or "norm" in name:
                p.normal_(0, 0.2)
    return model


def test_patches_are_read_as_the_conv_kernel_reads_them():
    pixels = torch.randn(2, 3, 8, 12)
    kernel = torch.randn(5, 3, 4, 4)
    want = torch.nn.functional.conv2d(pixels, kernel, stride=4).flatten(2).transpose(1, 2)
    got = patches_of(pixels, 4) @ kernel.reshape(5, -1).T
    torch.testing.assert_close(got, want)


def test_gemma3_image_tokens_equal_transformers(gemma3):
    weights = {name: t.detach() for name, t in gemma3.state_dict().items()}
    tower = gemma3_image_tower(gemma3.config, weights,
                               Placement(torch.device("cpu"), torch.float32, TORCH_OPS))
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = gemma3.model.get_image_features(pixels).pooler_output
        got = tower(pixels)
    assert got.shape == (2, 16, 64) == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
