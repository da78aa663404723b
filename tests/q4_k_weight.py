"""A Q4_K layer's weight as the GGUF loader gives it, with the parts llama.cpp wrote: for the
tests of q4_gemv's Q4_K records (kernels) and of finding those parts again (engine)."""

from __future__ import annotations

import torch

from pagoda.engine.quantization.tensors import Int4Weight, KQuantScales, pack_int4


def q4_k_weight(n: int, k: int, seed: int = 0) -> tuple[Int4Weight, KQuantScales]:
    """Per super-block of 256 inputs an fp16 d and dmin, per block of 32 a six-bit sc and m,
    each super-block's largest 63 (as llama.cpp's quantizer makes them), one super-block all
    zero; the Int4Weight holds scale = d * sc and min = -(dmin * m) in fp32, as the loader."""
    gen = torch.Generator().manual_seed(seed)
    supers, groups = k // 256, k // 32
    d = (torch.rand(n, supers, generator=gen) * 2e-3 + 1e-4).half()
    dmin = (torch.rand(n, supers, generator=gen) * 2e-3).half()
    sc = torch.randint(0, 64, (n, groups), generator=gen, dtype=torch.uint8)
    m = torch.randint(0, 64, (n, groups), generator=gen, dtype=torch.uint8)
    sc.view(n, supers, 8)[:, :, 0] = 63
    m.view(n, supers, 8)[:, :, 5] = 63
    d[0, 0], dmin[0, 0] = 0, 0
    sc.view(n, supers, 8)[0, 0], m.view(n, supers, 8)[0, 0] = 0, 0
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = d.float().repeat_interleave(8, dim=1) * sc.float()
    mins = -(dmin.float().repeat_interleave(8, dim=1) * m.float())
    return Int4Weight(pack_int4(q), scales, mins), KQuantScales(d, dmin, sc, m)
