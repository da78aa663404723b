"""The vocabulary projection: logits for every token, exact for the likeliest ones.

A quantized kernel returns bf16 outputs, and at logits of 10 to 30 bf16's spacing is 0.06 to
0.125: more than the gap between the two likeliest tokens at many steps, so greedy choices would
follow the rounding (the default model agreed with its dequantized self on only 96.6% of next
tokens). The kernel's logits pick the candidates; the top few are recomputed in fp32 from the
weight's exact rows, which costs a gather of a few rows per sampled position, widened by our C
kernel where it builds (`DequantWorkspace.gather`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagoda.engine.layers.linear import Linear
from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace
from pagoda.engine.quantization.tensors import Weight, dequantize_rows
from pagoda.kernels.torch_ref import top_k_indices

TopK = Callable[[torch.Tensor, int], torch.Tensor]

REFINED_CANDIDATES = 32
# The candidates' rows go into one buffer kept from step to step up to this many floats (4 MB:
# a decode batch of 16 rows of a 2048-wide model), where a fresh 256 KB tensor per step cost
# more in page faults than the widening; a larger batch gets a new tensor, so the buffer kept
# stays small.
_REUSED_FLOATS = 1 << 20


@dataclass(slots=True)
class LMHead:
    linear: Linear
    # The weight in its exact layout where the kernel approximates it; None for float weights.
    exact: Weight | None
    # What widens the gathered rows; None: torch's dequantize.
    widen: DequantWorkspace | None = None
    # What picks the candidates: the kernel backend's (KernelOps.top_k_indices).
    top_k: TopK = top_k_indices

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.linear(x)
        if self.exact is None or x.shape[0] == 0:
            return logits
        return refine_top_logits(logits, x, self.exact, widen=self.widen, top_k=self.top_k)


def refine_top_logits(logits: torch.Tensor, x: torch.Tensor, exact: Weight,
                      k: int = REFINED_CANDIDATES,
                      widen: DequantWorkspace | None = None,
                      top_k: TopK = top_k_indices) -> torch.Tensor:
    """logits [M, V] with the top k of each row replaced by x's product with exact's rows."""
    top = top_k(logits, min(k, logits.shape[1]))
    if widen is None:
        rows = dequantize_rows(exact, top, x.dtype)  # [M, k, hidden]
    else:
        small = top.numel() * x.shape[1] <= _REUSED_FLOATS
        rows = widen.gather(exact, top, x.dtype, reuse_buffer=small)
    refined = torch.bmm(rows, x.unsqueeze(-1)).squeeze(-1)
    return logits.scatter_(1, top, refined.to(logits.dtype))
