"""int4 weights (groups of 32) on the CPU through PyTorch's `_weight_int4pack_mm_for_cpu`, or
through our q4_gemv (`cpu_q4`) for the step sizes where the load-time calibration chose it.

PyTorch's kernel is vectorized only for bfloat16 activations (fp32 ones fall to a scalar loop
about 10x slower), so activations go in and out as bf16. Its packed layout depends on the CPU's
instruction set: it is built at load from our canonical layout, never stored, and not at all
where q4_gemv runs every step that does not dequantize.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.cpu_q4 import Q4Context, Q4Kernel
from pagoda.engine.quantization.tensors import Int4Weight, unpack_int4, with_compact_scales

# The kernel's packing wants the output dimension in multiples of this.
_ROW_MULTIPLE = 16


class CpuInt4Method:
    __slots__ = (
        "group_size",
        "native",
        "native_below_rows",
        "out_features",
        "packed",
        "policy",
        "scales_and_zeros",
        "source",
        "split_activations",
    )

    def __init__(self, weight: Int4Weight, policy: CpuPathPolicy | None = None,
                 split_activations: bool = False, q4: Q4Context | None = None,
                 precise: bool = True, reuse_output: bool = True) -> None:
        """split_activations: pass x as the sum of two bf16 parts to PyTorch's kernel (see
        `kernel`). q4: our kernel's library, used where the policy says (`cpu_paths`), with
        int16 activations if precise, and reuse_output as `Q4Kernel` describes."""
        self.policy = policy or CpuPathPolicy()
        self.group_size = weight.group_size
        self.out_features = weight.shape[0]
        use_native = q4 is not None and self.policy.native_below_rows > 0
        self.native = (Q4Kernel(weight, q4, precise, reuse_output, self.policy.amx_from_rows)
                       if use_native else None)
        self.native_below_rows = self.policy.native_below_rows if use_native else 0
        self.packed = self.scales_and_zeros = None
        if self.native is None or self.policy.runs_int4pack:
            self.packed, self.scales_and_zeros = _int4pack_layout(weight)
        # Kept only where steps dequantize and cannot widen q4_gemv's layout instead (our
        # dequant kernel does that): a 7B model's copy is 3.5 GB.
        dequantizes = self.policy.dequantize_from_rows is not None
        from_native = self.native is not None and self.policy.workspace.native
        self.source = with_compact_scales(weight) if dequantizes and not from_native else None
        self.split_activations = split_activations

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_paths.apply(self, x, bias)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < self.native_below_rows:
            return self.native.kernel(x)
        if self.split_activations:
            return self._kernel_on_split_activations(x)
        return self._multiply(x.to(torch.bfloat16)).to(x.dtype)

    def c_kernel(self, rows: int) -> Q4Kernel | None:
        """Our kernel where it is what steps of `rows` rows run (for callers in C), else None."""
        threshold = self.policy.dequantize_from_rows
        if (self.native is None or rows >= self.native_below_rows
                or (threshold is not None and rows >= threshold)):
            return None
        return self.native

    def _kernel_on_split_activations(self, x: torch.Tensor) -> torch.Tensor:
        """x = high + low, both bf16: 16 bits of mantissa reach the kernel instead of 8, for
        twice the rows, which a decode step (bound by reading the weights) barely notices. On
        the default model at int8 this took top-1 agreement from 98.98% to 99.34%."""
        high = x.to(torch.bfloat16)
        low = (x - high.to(x.dtype)).to(torch.bfloat16)
        y = self._multiply(torch.cat((high, low)))
        rows = x.shape[0]
        return y[:rows].to(x.dtype) + y[rows:].to(x.dtype)

    def _multiply(self, x_bf16: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x_bf16, self.packed, self.group_size,
                                                       self.scales_and_zeros)
        return y if y.shape[1] == self.out_features else y[:, :self.out_features]

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight at dtype, valid until the next layer dequantizes (`DequantWorkspace`)."""
        workspace = self.policy.workspace
        if self.source is None:
            assert self.native is not None and workspace.native, (
                "built with a policy that never dequantizes")
            return workspace.dequantize_repacked(self.native.repacked, dtype)
        return workspace.dequantize(self.source, dtype)


def _int4pack_layout(weight: Int4Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's packed int4 and its bf16 [groups, N, 2] scales and zeros."""
    pad = -weight.shape[0] % _ROW_MULTIPLE
    q = F.pad(unpack_int4(weight.packed).to(torch.int32), (0, 0, 0, pad))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    # The kernel computes (q - 8) * scale + zero; ours is q * scale + min.
    scales = F.pad(weight.scales.float(), (0, 0, 0, pad))
    zeros = F.pad(weight.mins.float(), (0, 0, 0, pad)) + 8 * scales
    scales_and_zeros = torch.stack((scales, zeros), -1).transpose(0, 1).contiguous()
    return packed, scales_and_zeros.to(torch.bfloat16)
