"""What every recurrent layer (LFM2's short convolution, Gated DeltaNet, Mamba-2) offers the
decoder and the runner: the shape of the state it keeps per sequence, and a forward over a
step's flat batch that reads and advances those states in place.

The runner allocates, per recurrent layer, one float32 tensor per entry of `state_shapes()`,
[num_slots, *shape]; a sequence owns the same slot in all of them (pagoda.engine.core.state_pool).
"""

from __future__ import annotations

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


def state_bytes(mixer: RecurrentMixer) -> int:
    """What one slot of the mixer's states takes."""
    floats = 0
    for shape in mixer.state_shapes():
        n = 1
        for d in shape:
            n *= d
        floats += n
    return floats * STATE_DTYPE.itemsize
