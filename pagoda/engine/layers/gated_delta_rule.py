"""The gated delta rule, the state update of Gated DeltaNet (Qwen3-Next, Qwen3.5), on one
sequence's run of prompt tokens (chunked) and on single tokens of many sequences (a step).

Per head, with a state S [k_dim, v_dim], each token t decays the state by exp(g_t), corrects
what the state recalls for its key toward its value, then reads it with its query:

    S = exp(g_t) * S
    S = S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t = S^T q_t

Inputs, per token: q and k [heads, k_dim] (l2-normed, q already scaled by k_dim^-1/2, their heads
repeated to the value heads), v [heads, v_dim], g [heads] (log decay, <= 0), beta [heads].
Everything runs in float32 whatever the inputs' dtype (float64 inputs stay float64, for tests),
and outputs come back at that precision.

The chunked form (the DeltaNet paper's WY/UT representation) turns C tokens' rank-1 corrections
into triangular solves and matmuls, so a run costs T/C sequential steps instead of T.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK = 64


@dataclass(slots=True)
class DeltaRuleRun:
    """outputs [T, heads, v_dim]; state [heads, k_dim, v_dim] after the run's last token;
    checkpoints: the state after each of `states_at`'s token counts, in the same order."""

    outputs: torch.Tensor
    state: torch.Tensor
    checkpoints: list[torch.Tensor]


@dataclass(slots=True)
class _Chunks:
    """A run cut into N chunks of C tokens ([N, heads, C, ...], each chunk's rows contiguous
    for the sequential pass's matmuls), with what that pass needs, solved for all chunks at
    once."""

    decayed_q: torch.Tensor  # q_i * exp(c_i): the query reading the chunk's incoming state
    k: torch.Tensor
    log_decay: torch.Tensor  # c: cumulative g inside each chunk [N, heads, C]
    values: torch.Tensor  # the corrected values if the incoming state were zero
    state_keys: torch.Tensor  # how much of the incoming state each correction removes
    attention: torch.Tensor  # q_i . k_j * exp(c_i - c_j), j <= i: reads inside the chunk
    # What a whole chunk does to the state: S * exp(c_last) + decayed_k @ corrected values.
    chunk_decay: torch.Tensor  # exp(c_last) [N, heads, 1, 1]
    decayed_k: torch.Tensor  # (k_j * exp(c_last - c_j))^T [N, heads, k_dim, C]


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor,
                             state: torch.Tensor | None = None,
                             states_at: tuple[int, ...] = (),
                             chunk: int = CHUNK) -> DeltaRuleRun:
    """One sequence's run of T tokens ([T, heads, ...] as in the module docstring) after `state`
    [heads, k_dim, v_dim] (None: zeros). states_at: token counts 0..T after which the state is
    also returned (prefix-cache checkpoints)."""
    length, heads, v_dim = v.shape
    if any(not 0 <= n <= length for n in states_at):
        raise ValueError(f"states_at {states_at} must lie within the run's {length} tokens")
    dtype = torch.promote_types(v.dtype, torch.float32)
    chunks = _prepare(*(t.to(dtype) for t in (q, k, v, g, beta)), chunk)
    if state is None:
        state = v.new_zeros(heads, k.shape[-1], v_dim, dtype=dtype)
    state = state.to(dtype)
    checkpoints = {0: state.clone()} if 0 in states_at else {}
    outputs = []
    for i in range(chunks.k.shape[0]):
        corrected = torch.baddbmm(chunks.values[i], chunks.state_keys[i], state, alpha=-1)
        outputs.append(torch.baddbmm(chunks.attention[i] @ corrected, chunks.decayed_q[i],
                                     state))
        for n in states_at:
            if n > 0 and (n - 1) // chunk == i:
                checkpoints[n] = _state_after(state, chunks, i, corrected, n - i * chunk)
        state = torch.baddbmm(state * chunks.chunk_decay[i], chunks.decayed_k[i], corrected)
    out = torch.stack(outputs).transpose(1, 2).flatten(0, 1)[:length]  # [T, heads, v_dim]
    return DeltaRuleRun(out, state, [checkpoints[n] for n in states_at])


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor, chunk: int) -> _Chunks:
    """Heads first, padded to whole chunks with tokens that change nothing (g = 0: no decay,
    beta = 0: no correction, k = q = 0), then every chunk's triangular systems solved."""
    length = v.shape[0]
    pad = -length % chunk
    q, k, v = (_to_chunks(F.pad(t, (0, 0, 0, 0, 0, pad)), chunk) for t in (q, k, v))
    g, beta = (F.pad(t, (0, 0, 0, pad)).unflatten(0, (-1, chunk)).transpose(1, 2).contiguous()
               for t in (g, beta))
    c = g.cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    # exp(c_i - c_j) for j <= i: the decay between two tokens of a chunk (0 above the diagonal,
    # masked before exp so that it never overflows).
    decay = (c.unsqueeze(-1) - c.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta.unsqueeze(-1)
    # Token i's correction depends on the corrections of tokens j < i of its chunk:
    # (I + strictly_lower(beta_i k_i . k_j exp(c_i - c_j)))^-1 solves them all at once.
    system = _unit_lower_inverse((k_beta @ k.transpose(-1, -2)) * decay)
    values = system @ (v * beta.unsqueeze(-1))
    state_keys = system @ (k_beta * c.exp().unsqueeze(-1))
    attention = (q @ k.transpose(-1, -2)) * decay
    last = c[..., -1:]
    decayed_k = (k * (last - c).exp().unsqueeze(-1)).transpose(-1, -2).contiguous()
    return _Chunks(q * c.exp().unsqueeze(-1), k, c, values, state_keys, attention,
                   last.exp().unsqueeze(-1), decayed_k)


def _unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """The inverse of [..., C, C] matrices taken as unit lower triangular (their strictly lower
    part read, 1 on the diagonal), C a power of two.

    By doubling: where the diagonal blocks of size b are inverted, each pair of them on the
    diagonal inverts as [[X, 0], [Y, Z]]^-1 = [[X^-1, 0], [-Z^-1 Y X^-1, Z^-1]], a few batched
    matmuls per level. Batched torch.linalg.solve_triangular on these small systems ran at
    about 1 GFLOP/s on CPU and took most of a prefill's time."""
    size = a.shape[-1]
    assert size & (size - 1) == 0, f"chunk size {size} is not a power of two"
    inverse = torch.eye(size, dtype=a.dtype, device=a.device).expand_as(a).clone()
    b = 1
    while b < size:
        pairs = _diagonal_blocks(inverse, 2 * b)
        lower = _diagonal_blocks(a, 2 * b)[..., b:, :b]
        pairs[..., b:, :b] = -(pairs[..., b:, b:] @ lower @ pairs[..., :b, :b])
        b *= 2
    return inverse


def _diagonal_blocks(x: torch.Tensor, b: int) -> torch.Tensor:
    """A view of the [..., C, C] matrices' diagonal blocks of size b: [..., C / b, b, b]."""
    n = x.shape[-1] // b
    blocks = x.unflatten(-1, (n, b)).unflatten(-3, (n, b))  # [..., n, b, n, b]
    return torch.diagonal(blocks, dim1=-4, dim2=-2).movedim(-1, -3)


def _to_chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """[T, heads, dim] -> [T / chunk, heads, chunk, dim]."""
    return x.unflatten(0, (-1, chunk)).transpose(1, 2).contiguous()


def _state_after(state: torch.Tensor, chunks: _Chunks, i: int, corrected: torch.Tensor,
                 n: int) -> torch.Tensor:
    """The state after the first n tokens of chunk i, from the state before it (a checkpoint
    inside the chunk: the chunk's own end uses the terms _prepare computed)."""
    c = chunks.log_decay[i, :, :n]
    last = c[:, -1:]
    keys = chunks.k[i, :, :n] * (last - c).exp().unsqueeze(-1)
    return state * last.exp().unsqueeze(-1) + keys.transpose(-1, -2) @ corrected[:, :n]
