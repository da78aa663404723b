"""int4 weights (groups of 32) on the CPU through PyTorch's `_weight_int4pack_mm_for_cpu`.

The kernel is vectorized only for bfloat16 activations (fp32 ones fall to a scalar loop about
10x slower), so activations go in and out as bf16. Its packed layout depends on the CPU's
instruction set: it is built at load from our canonical layout, never stored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.quantization import cpu_paths
from engine.quantization.cpu_paths import CpuPathPolicy
from engine.quantization.tensors import Int4Weight, dequantize, unpack_int4

# The kernel's packing wants the output dimension in multiples of this.
_ROW_MULTIPLE = 16


class CpuInt4Method:
    __slots__ = (
        "group_size",
        "out_features",
        "packed",
        "policy",
        "scales_and_zeros",
        "source",
    )

    def __init__(self, weight: Int4Weight, policy: CpuPathPolicy | None = None) -> None:
        n = weight.shape[0]
        pad = -n % _ROW_MULTIPLE
        q = F.pad(unpack_int4(weight.packed).to(torch.int32), (0, 0, 0, pad))
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # The kernel computes (q - 8) * scale + zero; ours is q * scale + min.
        scales = F.pad(weight.scales.float(), (0, 0, 0, pad))
        zeros = F.pad(weight.mins.float(), (0, 0, 0, pad)) + 8 * scales
        self.scales_and_zeros = torch.stack((scales, zeros), -1).transpose(0, 1).contiguous()
        self.scales_and_zeros = self.scales_and_zeros.to(torch.bfloat16)
        self.group_size = weight.group_size
        self.out_features = n
        self.policy = policy or CpuPathPolicy()
        # Kept only where steps dequantize: a 7B model's copy is 3.5 GB.
        self.source = weight if self.policy.dequantize_from_rows is not None else None

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_paths.apply(self, x, bias)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, self.group_size, self.scales_and_zeros)
        if y.shape[1] != self.out_features:
            y = y[:, :self.out_features]
        return y.to(x.dtype)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        assert self.source is not None, "built with a policy that never dequantizes"
        return dequantize(self.source, dtype)
