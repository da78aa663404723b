"""What a vision tower computes in (EngineConfig.vision_dtype).

The tower is the first turn's cost of a chat with an image: a SigLIP-400M encodes an 896-pixel
image in ~5.4 TFLOP of matmuls and attention over 4,096 patches. A CPU that multiplies bf16
natively (AVX512-BF16, AMX) runs its linears ~3.5x faster than fp32 (the 27-layer tower: 16.4 s
against 26.0 s on a Zen 5, where attention gains little; docs/BENCHMARKS.md), its output ~0.7%
(relative norm) from fp32's, which the projector's norm and the language model absorb; a CPU
without runs bf16 several times slower than fp32, so "auto" keeps fp32 there.
"""

from __future__ import annotations

import torch

_NAMED = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def vision_dtype(setting: str, device: torch.device, compute_dtype: torch.dtype) -> torch.dtype:
    """The tower's dtype for EngineConfig.vision_dtype on this device (compute_dtype: the
    language model's)."""
    if setting != "auto":
        return _NAMED[setting]
    if device.type == "cuda":
        half = compute_dtype in (torch.float16, torch.bfloat16)
        return compute_dtype if half else torch.bfloat16
    return torch.bfloat16 if device.type == "cpu" and cpu_multiplies_bf16() else torch.float32


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU has bf16 dot products (AVX512-BF16, or AMX's bf16 tiles), which
    oneDNN's bf16 GEMM runs on; torch's own probes (private, hence guarded)."""
    probes = [getattr(torch.cpu, name, None)
              for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe is not None and probe() for probe in probes)
