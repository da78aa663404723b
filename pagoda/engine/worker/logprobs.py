"""Log-probabilities of sampled tokens and of the best tokens beside them, from a step's raw
logits (before penalties, biases, constraints and temperature change them in place)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class SampledLogprobs:
    """One sampled token: its log-probability and rank, and the best tokens at its position."""

    token_id: int
    logprob: float
    rank: int
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(slots=True, frozen=True)
class LogprobsRequest:
    """A sequence that wants logprobs: its rows in the step's logits and how many best tokens."""

    order: int  # its index among the step's scheduled sequences
    first_row: int
    num_rows: int
    num_top: int
    first_position: int = 0  # for prompt logprobs: the position of the first token scored


class StepLogprobs:
    """The log-softmax of the rows that asked, taken before sampling changes the logits."""

    def __init__(self, logits: torch.Tensor, requests: list[LogprobsRequest]) -> None:
        rows = [r.first_row + i for r in requests for i in range(r.num_rows)]
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        self._requests = requests
        self._logprobs = logits[index].float().log_softmax(dim=-1)
        most = max(r.num_top for r in requests)
        self._top = self._logprobs.topk(most, dim=-1) if most else None

    def for_runs(self, runs: list[list[int]], num_scheduled: int
                 ) -> list[list[SampledLogprobs] | None]:
        """Per scheduled sequence, one entry per token of its run (None where not asked)."""
        out: list[list[SampledLogprobs] | None] = [None] * num_scheduled
        offset = 0
        for request in self._requests:
            run = runs[request.order]
            out[request.order] = [self._entry(offset + i, token, request.num_top)
                                  for i, token in enumerate(run)]
            offset += request.num_rows
        return out

    def _entry(self, row: int, token: int, num_top: int) -> SampledLogprobs:
        logprobs = self._logprobs[row]
        chosen = logprobs[token]
        rank = int((logprobs > chosen).sum()) + 1
        top_ids: tuple[int, ...] = ()
        top_values: tuple[float, ...] = ()
        if num_top and self._top is not None:
            top_ids = tuple(self._top.indices[row, :num_top].tolist())
            top_values = tuple(self._top.values[row, :num_top].tolist())
        return SampledLogprobs(token, float(chosen), rank, top_ids, top_values)
