"""Mamba-2's selective state space update (state space duality, SSD) on one sequence's run of
tokens (chunked) and on one token for each of a batch of sequences (recurrent).

Per head h the state S [head_dim, state_size] evolves, token by token, as
    dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max)
    S  = exp(dt * A) * S + dt * outer(x, B)        y = S @ C + D * x
with B and C shared by the heads of a group (head h reads group h // (heads / n_groups)).
A run is cut into chunks of `chunk_size` tokens: within a chunk the outputs are a masked,
decay-weighted attention of C against B (one matmul), and only the chunk's last state is carried
to the next. Both forms compute in float32 (float64 where the inputs are) whatever the
activations' dtype, since the state sums decays over the whole sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagoda.kernels.kernel_ops import TORCH_OPS, KernelOps


@dataclass(slots=True, frozen=True)
class SsmParams:
    """One layer's input-independent SSM parameters: A = -exp(A_log) [heads] (float32), the skip
    D [heads], dt_bias [heads], the time step's limits (config.json's time_step_limit)."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    n_groups: int
    chunk_size: int
    dt_min: float = 0.0
    dt_max: float = math.inf


@dataclass(slots=True)
class SsdRun:
    """A run's outputs y [T, heads, head_dim] (the compute dtype), the state after its last token,
    and the states after each of the offsets asked for (`states_at`), in their order."""

    y: torch.Tensor
    final_state: torch.Tensor
    states_at: tuple[torch.Tensor, ...] = ()


def time_steps(dt_raw: torch.Tensor, params: SsmParams, dtype: torch.dtype) -> torch.Tensor:
    """The discretization's step per token and head, from in_proj's dt [..., heads]."""
    dt = F.softplus(dt_raw.to(dtype) + params.dt_bias.to(dtype))
    if params.dt_min > 0.0 or params.dt_max < math.inf:
        dt = dt.clamp(params.dt_min, params.dt_max)
    return dt


def ssd_prefill(x: torch.Tensor, dt_raw: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                params: SsmParams, state: torch.Tensor | None,
                states_at: tuple[int, ...] = ()) -> SsdRun:
    """One sequence's run of T tokens: x [T, heads, head_dim], dt_raw [T, heads], B and C
    [T, n_groups, state_size], after `state` [heads, head_dim, state_size] (None: zeros, the
    sequence starts here). states_at: offsets 0..T; the state after that many of the run's
    tokens is returned for each (0: the state it started from)."""
    length, heads, head_dim = x.shape
    for offset in states_at:
        if not 0 <= offset <= length:
            raise ValueError(f"states_at offset {offset} is outside the run of {length} tokens")
    dtype = _compute_dtype(x)
    dt = time_steps(dt_raw, params, dtype)
    # Heads (and groups) first, so that each chunk's products are batched matmuls.
    x_dt = (x.to(dtype) * dt[..., None]).transpose(0, 1)
    dA = (dt * params.A.to(dtype)).t()
    B, C = B.to(dtype).transpose(0, 1), C.to(dtype).transpose(0, 1)
    if state is None:
        state = x.new_zeros(heads, head_dim, B.shape[-1], dtype=dtype)
    state = state.to(dtype)
    wanted = {offset: None for offset in states_at}
    if 0 in wanted:
        wanted[0] = state.clone()
    outputs = []
    for start in range(0, length, params.chunk_size):
        end = min(start + params.chunk_size, length)
        chunk = _Chunk.of(x_dt[:, start:end], dA[:, start:end], B[:, start:end],
                          C[:, start:end])
        outputs.append(chunk.outputs(state))
        for offset in wanted:
            if start < offset < end:
                wanted[offset] = chunk.state_after(state, offset - start - 1)
        state = chunk.state_after(state, end - start - 1)
        if end in wanted:
            wanted[end] = state
    y = (torch.cat(outputs, dim=1).transpose(0, 1) if outputs
         else x.new_zeros(0, heads, head_dim, dtype=dtype))
    y = y + params.D.to(dtype)[:, None] * x.to(dtype)
    return SsdRun(y, state, tuple(wanted[offset] for offset in states_at))


def ssd_step(x: torch.Tensor, dt_raw: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             params: SsmParams, states: torch.Tensor, slots: torch.Tensor,
             ops: KernelOps = TORCH_OPS) -> torch.Tensor:
    """One token for each of n sequences: x [n, heads, head_dim], dt_raw [n, heads], B and C
    [n, n_groups, state_size]; states [num_slots, heads, head_dim, state_size] holds every
    slot's state, and rows `slots` [n] are advanced in place (ops.mamba2_step: in C on a CPU).
    Returns y [n, heads, head_dim] in the compute dtype."""
    dtype = torch.promote_types(_compute_dtype(x), states.dtype)
    dt = time_steps(dt_raw, params, dtype)  # [n, heads]
    y = ops.mamba2_step(states, slots, x, dt, params.A, B, C, params.D)
    return y.to(dtype)


@dataclass(slots=True)
class _Chunk:
    """One chunk of q tokens, ready for the scan: x * dt [heads, q, head_dim], B and C
    [n_groups, q, state_size], the running sum of dt * A from the chunk's start [heads, q], and
    decay [heads, q, q]: exp of the sum of dt * A over tokens (s, l] where s <= l, else 0.
    A group's heads share its C.B scores; the products run per group, its heads batched."""

    x_dt: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    log_decay: torch.Tensor
    decay: torch.Tensor

    @classmethod
    def of(cls, x_dt: torch.Tensor, dA: torch.Tensor, B: torch.Tensor,
           C: torch.Tensor) -> _Chunk:
        log_decay = dA.cumsum(-1)
        return cls(x_dt, B, C, log_decay, _decays(log_decay))

    def outputs(self, state: torch.Tensor) -> torch.Tensor:
        """y [heads, q, head_dim] without the D skip, the chunk entered with `state`."""
        scores = (self.C @ self.B.transpose(1, 2))[:, None] * self._by_group(self.decay)
        within = scores @ self._by_group(self.x_dt)
        carried = self.C[:, None] @ self._by_group(state).transpose(-1, -2)
        decayed = carried * self._by_group(torch.exp(self.log_decay))[..., None]
        return (within + decayed).flatten(0, 1)

    def state_after(self, state: torch.Tensor, last: int) -> torch.Tensor:
        """The state after the chunk's token `last` (0-based), the chunk entered with `state`."""
        weights = self.decay[:, last, :last + 1]  # [heads, s]: decay from token s to `last`
        weighted = (self.x_dt[:, :last + 1] * weights[..., None]).transpose(1, 2)
        added = self._by_group(weighted) @ self.B[:, None, :last + 1]
        return torch.exp(self.log_decay[:, last])[:, None, None] * state + added.flatten(0, 1)

    def _by_group(self, per_head: torch.Tensor) -> torch.Tensor:
        """[heads, ...] -> [n_groups, heads per group, ...] (a group's heads are adjacent)."""
        return per_head.unflatten(0, (self.B.shape[0], -1))


def _decays(log_decay: torch.Tensor) -> torch.Tensor:
    """[heads, q, q]: entry (l, s) exp(sum of dt * A over tokens s+1..l) where s <= l, else 0,
    from the running sums (as mamba_ssm's kernels do: a chunk's sums stay small enough in float32
    that their differences lose no more than rounding)."""
    q = log_decay.shape[-1]
    diff = log_decay[:, :, None] - log_decay[:, None, :]
    future = torch.ones(q, q, dtype=torch.bool, device=log_decay.device).triu(1)
    return torch.exp(diff.masked_fill_(future, -math.inf))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)
