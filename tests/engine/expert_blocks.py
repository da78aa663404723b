"""Random GGUF rows of every block type the expert kernel reads, and gguf-py's values of them:
for the expert weights' and the expert kernels' tests; and the routed experts' reference."""

from __future__ import annotations

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from tiny_gguf import random_blocks

from pagoda.engine.quantization.tensors import dequantize
from pagoda.kernels.kernel_ops import TORCH_OPS

EXPERT_TYPES = ("Q4_K", "Q4_0", "Q8_0", "MXFP4", "Q6_K", "Q5_K", "IQ4_XS", "Q3_K")


def expert_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw rows [rows, bytes]: random bits, with every scale small and positive (MXFP4's
    exponents 2^-8..2^-3, Q4_0's and Q8_0's fp16 d about 1e-3)."""
    qtype, rng = QType[kind], np.random.default_rng(seed)
    if kind not in ("Q4_0", "Q8_0", "MXFP4"):
        return np.ascontiguousarray(random_blocks(qtype, rows, cols, rng))
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block_size, type_size), dtype=np.uint8)
    if kind == "MXFP4":
        blocks[..., 0] = rng.integers(120, 126, size=blocks.shape[:2], dtype=np.uint8)
    else:
        d = rng.uniform(1e-3, 4e-3, size=blocks.shape[:2]).astype(np.float16)
        blocks[..., 0:2] = d[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def gguf_values(kind: str, blocks: np.ndarray | torch.Tensor) -> torch.Tensor:
    """gguf-py's float32 values of the rows, [rows, values]."""
    raw = blocks.numpy() if isinstance(blocks, torch.Tensor) else blocks
    values = np.array(gguf.quants.dequantize(raw, QType[kind]), dtype=np.float32)
    return torch.from_numpy(values).reshape(raw.shape[0], -1)


def experts_reference(experts, activation, x, weights, ids) -> torch.Tensor:
    """A layer's routed experts (`pagoda.engine.layers.moe.ExpertWeights`, `ExpertActivation`) on rows
    x: each row alone, each of its experts in turn, in float64 on the dequantized weights."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for r in range(x.shape[0]):
        for s in range(ids.shape[1]):
            w = experts[int(ids[r, s])]
            xr = x[r].cpu().double()
            g = xr @ dequantize(w.gate).double().T
            u = xr @ dequantize(w.up).double().T
            if w.gate_bias is not None:
                g, u = g + w.gate_bias, u + w.up_bias
            h = activation(torch.cat([g, u]).unsqueeze(0), TORCH_OPS)[0]
            y = h @ dequantize(w.down).double().T
            out[r] += float(weights[r, s]) * (y if w.down_bias is None else y + w.down_bias)
    return out
