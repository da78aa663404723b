"""Rotary position embedding tables, computed once and indexed by position each step."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.errors import ModelLoadError
from engine.models.config import rope_theta


def _rope_parameters(config: PretrainedConfig) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return dict(params or {})


def inverse_frequencies(config: PretrainedConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Per-pair inverse frequencies and the attention scaling, for every rope type HF knows."""
    params = _rope_parameters(config)
    rope_type = params.get("rope_type", params.get("type"))
    if rope_type in (None, "default"):
        # fp32 like Hugging Face, so positions rotate bit-identically.
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (rope_theta(config) ** exponents), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ModelLoadError(f"rope type {rope_type!r} in config.json is not supported; "
                             f"known types: default, {', '.join(ROPE_INIT_FUNCTIONS)}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


class RotaryTables:
    """cos and signed sin for every position up to max_positions."""

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        inv_freq, scaling = inverse_frequencies(config, head_dim)
        # Same float path as Hugging Face: fp32 outer product, then cos/sin.
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * scaling).to(dtype=dtype, device=device)
        sin = emb.sin() * scaling
        half = head_dim // 2
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), -1).to(dtype=dtype, device=device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[tokens] -> cos, sin_signed each [tokens, 1, head_dim]."""
        return self.cos[positions].unsqueeze(1), self.sin_signed[positions].unsqueeze(1)
