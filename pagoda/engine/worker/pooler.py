"""Pooling requests' vectors: the final-normed hidden states of each prompt chunk, summed
across the chunks a long prompt is read in, then averaged (see
pagoda.engine.sampling.params.PoolingParams)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagoda.engine.core.sequence import Sequence


@dataclass(slots=True)
class PoolingChunk:
    """One pooling sequence's tokens in a step: from position `start` of the sequence, rows
    [first_row, first_row + num_rows) of the step's flat tokens."""

    seq: Sequence
    start: int
    first_row: int
    num_rows: int


class MeanPooler:
    """The running sum of one sequence's final hidden states (in fp32) and how many it holds."""

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None
        self._count = 0

    def add(self, start: int, rows: torch.Tensor) -> None:
        if start == 0:  # read from its start again (after a preemption): what it had is stale
            self._sum, self._count = None, 0
        chunk = rows.float().sum(dim=0)
        self._sum = chunk if self._sum is None else self._sum + chunk
        self._count += rows.shape[0]

    def vector(self, num_tokens: int, normalize: bool) -> list[float]:
        assert self._sum is not None and self._count == num_tokens, (self._count, num_tokens)
        mean = self._sum / self._count
        if normalize:
            mean = torch.nn.functional.normalize(mean, dim=0)
        return mean.tolist()


def pool_chunks(hidden: torch.Tensor, chunks: list[PoolingChunk],
                final_norm: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Add each chunk's final-normed rows to its sequence's pooler (made at its first)."""
    for chunk in chunks:
        rows = final_norm(hidden[chunk.first_row:chunk.first_row + chunk.num_rows])
        if chunk.seq.pooler is None:
            chunk.seq.pooler = MeanPooler()
        chunk.seq.pooler.add(chunk.start, rows)


def pooled_vector(seq: Sequence) -> list[float]:
    """A pooling sequence's vector, once its whole prompt is read."""
    return seq.pooler.vector(seq.num_prompt_tokens, seq.pooling.normalize)
