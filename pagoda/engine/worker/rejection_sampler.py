"""Verification: which drafts the model keeps, and the one token it adds after them.

Each sequence that speculated has one logits row per position: after its last token and after
each of its drafts. Greedy rows keep the longest run of drafts equal to the argmax. Random rows use
speculative sampling with a point-mass proposal: draft x is kept with probability p(x); on the first
rejection the token is drawn from p with x removed (renormalized), so every emitted token has
exactly the distribution p that sampling without speculation would have used. When every draft is
kept, the last row gives a bonus token.

p is the distribution `Sampler` draws from: penalties (with the drafts before a row counted as
output), temperature, top-k, top-p and min-p, computed by the sampler's own functions.
"""

from __future__ import annotations

import torch

from pagoda.engine.worker.sampler import (
    RandomSampling,
    RowArgmax,
    SamplingMetadata,
    draw,
    filter_logits,
    process_logits,
    uniform_like,
)
from pagoda.kernels.torch_ref import row_argmax

_NO_DRAFT = -1
_NEG_INF = float("-inf")


class RejectionSampler:
    def __init__(self, argmax: RowArgmax = row_argmax) -> None:
        self.argmax = argmax

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata,
                 drafts: list[list[int]]) -> list[list[int]]:
        """logits [sum(len(d) + 1 for d in drafts), vocab] float32, modified in place ->
        per sequence, the drafts it keeps followed by the model's own next token."""
        draft_ids = torch.tensor([t for d in drafts for t in (*d, _NO_DRAFT)], dtype=torch.long,
                                 device=logits.device)
        targets, accepted = self._verify_rows(process_logits(logits, metadata), metadata,
                                              draft_ids)
        return _accepted_runs(drafts, targets.tolist(), accepted.tolist())

    def _verify_rows(self, logits: torch.Tensor, metadata: SamplingMetadata,
                     draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: the token emitted if the run stops there, and whether its draft is kept."""
        sampling = metadata.sampling
        if sampling is None:
            targets = self.argmax(logits)
            return targets, targets == draft_ids
        if metadata.sampled_rows is None:
            return _verify_random(logits, draft_ids, sampling, self.argmax)
        greedy, sampled = metadata.greedy_rows, metadata.sampled_rows
        targets = torch.empty(metadata.num_rows, dtype=torch.long, device=logits.device)
        accepted = torch.empty(metadata.num_rows, dtype=torch.bool, device=logits.device)
        targets[greedy] = self.argmax(logits[greedy])
        accepted[greedy] = targets[greedy] == draft_ids[greedy]
        targets[sampled], accepted[sampled] = _verify_random(logits[sampled], draft_ids[sampled],
                                                             sampling, self.argmax)
        return targets, accepted


def _verify_random(logits: torch.Tensor, draft_ids: torch.Tensor, sampling: RandomSampling,
                   argmax: RowArgmax) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept draft x with probability p(x); the fallback token comes from p without x."""
    filtered = filter_logits(logits, sampling)
    has_draft = draft_ids != _NO_DRAFT
    safe_ids = draft_ids.clamp(min=0).unsqueeze(1)
    p_draft = torch.softmax(filtered, dim=-1).gather(1, safe_ids).squeeze(1)
    rows = has_draft.nonzero().squeeze(1)
    filtered[rows, draft_ids[rows]] = _NEG_INF
    # Rows without a draft keep all of p: their draw is the bonus token, from the same random
    # numbers `Sampler` would use, so a seeded request that does not speculate draws as usual.
    fallback = draw(filtered, sampling, argmax)
    u = torch.ones_like(p_draft)
    generators = [sampling.generators[r] for r in rows.tolist()]
    u[rows] = uniform_like(p_draft[rows].unsqueeze(1), generators).squeeze(1)
    return fallback, u < p_draft


def _accepted_runs(drafts: list[list[int]], targets: list[int],
                   accepted: list[bool]) -> list[list[int]]:
    runs = []
    row = 0
    for draft in drafts:
        run = []
        for j, token in enumerate(draft):
            if not accepted[row + j]:
                run.append(targets[row + j])
                break
            run.append(token)
        else:
            run.append(targets[row + len(draft)])
        runs.append(run)
        row += len(draft) + 1
    return runs
