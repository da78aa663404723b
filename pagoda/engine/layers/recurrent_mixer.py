"""What every recurrent layer (LFM2's short convolution, Gated DeltaNet, Mamba-2) offers the
decoder and the runner: the shape of the state it keeps per sequence, and a forward over a
step's flat batch that reads and advances those states in place.

The runner allocates, per recurrent layer, one float32 tensor per entry of `state_shapes()`,
[num_slots, *shape]; a sequence owns the same slot in all of them (pagoda.engine.core.state_pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from pagoda.kernels.kernel_ops import KernelOps
from pagoda.kernels.recurrent_metadata import RecurrentMetadata

STATE_DTYPE = torch.float32


class RecurrentMixer(Protocol):
    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Each state tensor's shape for one slot, e.g. ((hidden, kernel - 1),)."""
        ...

    def forward(self, x: torch.Tensor, meta: RecurrentMetadata,
                states: tuple[torch.Tensor, ...], ops: KernelOps) -> torch.Tensor:
        """x [num_tokens, hidden] -> [num_tokens, hidden]; states[i] is
        [num_slots, *state_shapes()[i]], float32, updated in place; ops: the model's kernels
        (the state updates' C versions on a CPU: pagoda/kernels/ops.py)."""
        ...


def fused_decodes_then_rest(
        projected: torch.Tensor, meta: RecurrentMetadata,
        fused: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None],
        rest: Callable[[torch.Tensor, RecurrentMetadata], torch.Tensor]) -> torch.Tensor:
    """A mixer's rows between its two linears from in_proj's output: the decodes' rows through
    `fused` (rows, slots: the backend's one call, C on a CPU, which the one-call decode step
    runs too; None where it has none or does not take these tensors), so a decode rounds the
    same whatever else is in the step; the prefill segments, or every row where `fused` gives
    None, through `rest` (rows, their metadata: the mixer's torch ops)."""
    d = meta.num_decodes
    decoded = fused(projected[:d], meta.decode_slots) if d else None
    if decoded is None:
        return rest(projected, meta)
    if not meta.prefills:
        return decoded
    return torch.cat([decoded, rest(projected[d:], meta.prefills_only())])


def state_bytes(mixer: RecurrentMixer) -> int:
    """What one slot of the mixer's states takes."""
    floats = 0
    for shape in mixer.state_shapes():
        n = 1
        for d in shape:
            n *= d
        floats += n
    return floats * STATE_DTYPE.itemsize
