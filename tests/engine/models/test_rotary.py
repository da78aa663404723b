"""Our rotary tables hold, bit for bit, the cos and sin Hugging Face computes for each rope type."""

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from pagoda.engine.layers.rotary import RotaryTables, inverse_frequencies, rope_spec

MAX_POSITIONS = 512
HEAD_DIM = 16
# Each type's extra parameters, sized so that the scaling changes frequencies at these positions.
ROPE_TYPES = {
    "default": {},
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 2.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 128},
}


def llama_config(rope_type: str) -> transformers.PretrainedConfig:
    rope = {"rope_type": rope_type, "rope_theta": 500000.0, **ROPE_TYPES[rope_type]}
    return transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                                    max_position_embeddings=MAX_POSITIONS, rope_parameters=rope)


def spec(config: transformers.PretrainedConfig):
    return rope_spec(config, HEAD_DIM)


def hf_cos_sin(rope_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = LlamaRotaryEmbedding(llama_config(rope_type))
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = rotary(x, torch.arange(MAX_POSITIONS)[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_rotary_tables_equal_transformers_cos_and_sin(rope_type):
    ours = RotaryTables(llama_config(rope_type), spec(llama_config(rope_type)), MAX_POSITIONS, torch.float32,
                        torch.device("cpu"))
    cos, sin = hf_cos_sin(rope_type)
    half = HEAD_DIM // 2
    assert torch.equal(ours.cos, cos)
    assert torch.equal(ours.sin_signed[:, half:], sin[:, half:])
    assert torch.equal(-ours.sin_signed[:, :half], sin[:, :half])


def test_llama3_scaling_slows_only_the_long_wavelengths():
    plain, _ = inverse_frequencies(llama_config("default"), spec(llama_config("default")))
    scaled, scaling = inverse_frequencies(llama_config("llama3"), spec(llama_config("llama3")))
    assert scaling == 1.0
    # Wavelength 2 pi is under the high-frequency cut (64 / 4): kept. The next (~33) lies
    # between the cuts: smoothed. The rest exceed 64 tokens: divided by the factor of 8.
    assert scaled[0] == plain[0]
    assert plain[1] / 8 < scaled[1] < plain[1]
    assert torch.equal(scaled[2:], plain[2:] / 8)


def test_yarn_attention_factor_scales_cos_and_sin():
    ours = RotaryTables(llama_config("yarn"), spec(llama_config("yarn")), MAX_POSITIONS, torch.float32,
                        torch.device("cpu"))
    _, scaling = inverse_frequencies(llama_config("yarn"), spec(llama_config("yarn")))
    assert scaling > 1.0
    assert torch.allclose(ours.cos[0], torch.full((HEAD_DIM,), scaling))
    assert torch.allclose(ours.cos.square() + ours.sin_signed.square(),
                          torch.tensor(scaling ** 2))
