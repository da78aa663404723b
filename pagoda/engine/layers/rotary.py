"""Rotary position embedding tables, computed once and indexed by position each step.

A model may hold several tables: Gemma 3's windowed layers rotate with a base of 10,000 and its
global layers with 1,000,000. `RopeSpec` names one table's parameters; a layer without RoPE
(SmolLM3's every fourth, "NoPE") reads none.

Multimodal RoPE (Qwen2.5-VL's M-RoPE, `mrope_section`): each rotated pair takes its angle from
one of three positions of the token, its time, row or column, in sections of pairs. A text
token's three are equal, and then the rotation is plain RoPE at that position: only a step
whose tokens include an image's passes [3, tokens] positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from pagoda.engine.errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """One rotary table: its parameters as config.json states them (rope_type, rope_theta and
    the type's own), the layer type they are keyed by in the config (Gemma 3) or None, and how
    many of each head's dimensions rotate (partial rotary: Phi-4-mini rotates 3/4)."""

    parameters: tuple[tuple[str, object], ...]
    layer_type: str | None
    rotary_dim: int

    @property
    def rope_type(self) -> str:
        params = dict(self.parameters)
        return params.get("rope_type", params.get("type")) or "default"

    @property
    def theta(self) -> float:
        theta = dict(self.parameters).get("rope_theta")
        return float(theta) if theta is not None else 10000.0

    @property
    def mrope_section(self) -> tuple[int, ...] | None:
        """Multimodal RoPE's pairs per position (time, row, column); None for plain RoPE, and
        for Qwen3.5's interleaved sections, whose text rotates as plain RoPE and whose images
        Pagoda does not read."""
        params = dict(self.parameters)
        section = params.get("mrope_section")
        return None if section is None or params.get("mrope_interleaved") else tuple(section)


def rope_parameters(config: PretrainedConfig, layer_type: str | None = None) -> dict:
    """config.json's rope settings (transformers 5.x's rope_parameters, or 4.x's rope_scaling
    beside rope_theta), for one layer type where the config keys them by type."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    if params.get("rope_theta") is None and getattr(config, "rope_theta", None) is not None:
        params["rope_theta"] = config.rope_theta
    return params


def rope_spec(config: PretrainedConfig, head_dim: int,
              layer_type: str | None = None) -> RopeSpec:
    params = rope_parameters(config, layer_type)
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if params.get("rope_type") == "proportional":
        # Gemma 4's global layers: pairs (i, i + head_dim / 2) across the whole head, those past
        # the rotated share at frequency 0 (transformers' tables say so), not a rotated prefix.
        factor = None
    rotary_dim = int(head_dim * float(factor)) if factor is not None else head_dim
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ModelLoadError(f"config.json rotates {rotary_dim} of each head's {head_dim} "
                             "dimensions (partial_rotary_factor): an even count up to head_dim "
                             "is needed.")
    section = params.get("mrope_section")
    if section is not None:
        params["mrope_section"] = _checked_mrope_section(section, rotary_dim)
    return RopeSpec(tuple(sorted(params.items(), key=lambda item: item[0])), layer_type,
                    rotary_dim)


def _checked_mrope_section(section: object, rotary_dim: int) -> tuple[int, ...]:
    if (not isinstance(section, (list, tuple)) or len(section) != 3
            or not all(isinstance(n, int) and n >= 0 for n in section)
            or sum(section) != rotary_dim // 2):
        raise ModelLoadError(f"config.json's mrope_section {section!r} does not split each "
                             f"head's {rotary_dim // 2} rotated pairs between time, rows and "
                             "columns. The model's settings are damaged.")
    return tuple(section)


def inverse_frequencies(config: PretrainedConfig, spec: RopeSpec,
                        seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Per-pair inverse frequencies and the attention scaling, for every rope type HF knows.
    seq_len: the length a length-dependent type (longrope) computes for; None for short."""
    if spec.rope_type == "default":
        # fp32 like Hugging Face, so positions rotate bit-identically.
        dim = spec.rotary_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (spec.theta ** exponents), 1.0
    if spec.rope_type not in ROPE_INIT_FUNCTIONS:
        raise ModelLoadError(f"rope type {spec.rope_type!r} in config.json is not supported; "
                             f"known types: default, {', '.join(ROPE_INIT_FUNCTIONS)}")
    init = ROPE_INIT_FUNCTIONS[spec.rope_type]
    kwargs = {"layer_type": spec.layer_type} if spec.layer_type is not None else {}
    if seq_len is not None:
        kwargs["seq_len"] = seq_len
    inv_freq, scaling = init(config, torch.device("cpu"), **kwargs)
    return inv_freq.float(), float(scaling)


class RotaryTables:
    """cos and signed sin for every position up to max_positions, over the rotated dims."""

    def __init__(self, config: PretrainedConfig, spec: RopeSpec, max_positions: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.rotary_dim = spec.rotary_dim
        cos, sin = _cos_sin(config, spec, torch.arange(max_positions))
        original = _longrope_original_length(config, spec)
        if original is not None and original < max_positions:
            # LongRoPE: short factors up to the trained length, long ones beyond it, by position
            # (as llama.cpp and vLLM choose per length, where transformers switches the whole
            # sequence once it grows past the trained length).
            long_cos, long_sin = _cos_sin(config, spec, torch.arange(original, max_positions),
                                          seq_len=max_positions)
            cos[original:], sin[original:] = long_cos, long_sin
        self.cos = cos.to(dtype=dtype, device=device)
        half = spec.rotary_dim // 2
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), -1).to(dtype=dtype,
                                                                            device=device)
        # M-RoPE: which of a token's three positions each rotated dimension reads.
        self.position_rows = (None if spec.mrope_section is None
                              else _position_rows(spec.mrope_section, device))

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[tokens], or [3, tokens] (time, row, column: M-RoPE) -> cos, sin_signed each
        [tokens, 1, rotary_dim]."""
        if positions.dim() == 2:
            return self._lookup_sections(positions)
        return self.cos[positions].unsqueeze(1), self.sin_signed[positions].unsqueeze(1)

    def _lookup_sections(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position_rows is None:
            raise ValueError("positions of three rows (M-RoPE) for a model that rotates by one")
        rows = positions[self.position_rows].t()  # [tokens, rotary_dim]
        dims = torch.arange(self.rotary_dim, device=positions.device)
        return self.cos[rows, dims].unsqueeze(1), self.sin_signed[rows, dims].unsqueeze(1)


def _position_rows(section: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Per rotated dimension, the row of [3, tokens] positions it rotates by: the pairs in
    sections of time, row and column, the same for both halves (cos and sin repeat them)."""
    pairs = torch.repeat_interleave(torch.arange(3), torch.tensor(section))
    return torch.cat((pairs, pairs)).to(device)


def _cos_sin(config: PretrainedConfig, spec: RopeSpec, positions: torch.Tensor,
             seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq, scaling = inverse_frequencies(config, spec, seq_len)
    # Same float path as Hugging Face: fp32 outer product, then cos/sin.
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def _longrope_original_length(config: PretrainedConfig, spec: RopeSpec) -> int | None:
    if spec.rope_type != "longrope":
        return None
    params = dict(spec.parameters)
    original = (params.get("original_max_position_embeddings")
                or getattr(config, "original_max_position_embeddings", None))
    return int(original) if original else None
