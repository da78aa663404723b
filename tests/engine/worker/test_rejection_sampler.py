"""Verification of drafts: greedy keeps the argmax run; sampling keeps the distribution p."""

from __future__ import annotations

import pytest
import torch

from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.worker.rejection_sampler import RejectionSampler
from pagoda.engine.worker.sampler import Sampler, SamplingMetadata, SamplingRow

CPU = torch.device("cpu")
VOCAB = 6
DRAWS = 20000
# The chi-square statistic's 99.9% quantile for VOCAB - 1 = 5 degrees of freedom.
CHI2_999_DF5 = 20.52


def rows_for(params: SamplingParams, n: int, seed: int | None = None) -> list[SamplingRow]:
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return [SamplingRow(params, [], [], generator)] * n


def verify(logits: torch.Tensor, rows: list[SamplingRow], drafts: list[list[int]]):
    metadata = SamplingMetadata.build(rows, logits.shape[-1], CPU)
    return RejectionSampler()(logits.clone(), metadata, drafts)


def test_greedy_keeps_drafts_while_they_equal_the_argmax_then_adds_the_argmax():
    argmax = [3, 1, 4, 0]
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), VOCAB).float()
    greedy = SamplingParams(temperature=0)
    assert verify(logits, rows_for(greedy, 4), [[3, 1, 5]]) == [[3, 1, 4]]
    assert verify(logits, rows_for(greedy, 4), [[2, 1, 4]]) == [[3]]
    assert verify(logits, rows_for(greedy, 4), [[3, 1, 4]]) == [[3, 1, 4, 0]]


def test_sequences_with_and_without_drafts_share_a_step():
    logits = torch.nn.functional.one_hot(torch.tensor([2, 2, 5, 1]), VOCAB).float()
    greedy = SamplingParams(temperature=0)
    assert verify(logits, rows_for(greedy, 4), [[2, 2], []]) == [[2, 2, 5], [1]]


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    expected = probs.double() * len(tokens)
    seen = expected > 0
    assert counts[~seen].sum() == 0, "drew a token of probability 0"
    return float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())


PROBS = torch.tensor([0.05, 0.4, 0.25, 0.15, 0.1, 0.05])


@pytest.mark.parametrize("draft", [1, 3, 5])
@pytest.mark.parametrize("mixed_with_greedy", [False, True])
def test_first_token_is_distributed_as_p_whatever_the_draft(draft, mixed_with_greedy):
    logits = PROBS.log().expand(2 * DRAWS, -1).contiguous()
    rows = rows_for(SamplingParams(temperature=1.0), 2 * DRAWS)
    drafts = [[draft]] * DRAWS
    if mixed_with_greedy:  # greedy rows in the batch take the other code path for random rows
        rows = rows + rows_for(SamplingParams(temperature=0), 2)
        logits = torch.cat([logits, PROBS.log().expand(2, -1)])
        drafts = drafts + [[0]]
    runs = verify(logits, rows, drafts)[:DRAWS]
    first = torch.tensor([run[0] for run in runs])
    assert chi_square(first, PROBS) < CHI2_999_DF5
    # The draft is kept exactly when the first token is the draft, with probability p(draft).
    kept = sum(len(run) == 2 for run in runs) / DRAWS
    assert abs(kept - PROBS[draft].item()) < 0.015


def test_a_kept_draft_is_followed_by_a_token_from_the_next_rows_distribution():
    second_probs = torch.tensor([0.3, 0.0, 0.0, 0.2, 0.5, 0.0])
    one_row = torch.stack([torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0]), second_probs]).log()
    logits = one_row.repeat(DRAWS, 1)
    runs = verify(logits, rows_for(SamplingParams(temperature=1.0), 2 * DRAWS), [[2]] * DRAWS)
    assert all(len(run) == 2 and run[0] == 2 for run in runs)
    assert chi_square(torch.tensor([run[1] for run in runs]), second_probs) < CHI2_999_DF5


def test_temperature_and_top_k_define_the_distribution_drafts_are_judged_by():
    params = SamplingParams(temperature=0.5, top_k=3)
    filtered = PROBS.log() / 0.5
    filtered[filtered < filtered.topk(3).values[-1]] = float("-inf")
    target = filtered.softmax(-1)
    logits = PROBS.log().expand(2 * DRAWS, -1).contiguous()
    # Token 4 is outside the top 3: it is never kept, and never drawn in its place.
    runs = verify(logits, rows_for(params, 2 * DRAWS), [[4]] * DRAWS)
    first = torch.tensor([run[0] for run in runs])
    assert all(len(run) == 1 for run in runs)
    assert chi_square(first, target) < CHI2_999_DF5


def test_penalties_count_earlier_drafts_as_output():
    logits = torch.tensor([[0.0, 5.0, 4.9, 0.0, 0.0, 0.0]]).repeat(2, 1)
    params = SamplingParams(temperature=0, presence_penalty=1.0)
    generator = None
    rows = [SamplingRow(params, [], [], generator), SamplingRow(params, [], [1], generator)]
    # After draft 1 the second row penalizes token 1, so its argmax becomes 2.
    assert verify(logits, rows, [[1]]) == [[1, 2]]


def test_a_seed_gives_the_same_verification_every_time():
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=7)
    results = {str(verify(logits, rows_for(params, 5, seed=7), [[1, 2, 3, 4]])) for _ in range(5)}
    assert len(results) == 1


def test_a_seeded_row_without_drafts_draws_what_the_sampler_draws():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.9, seed=5)
    alone_row = rows_for(params, 1, seed=5)
    alone = Sampler()(logits[3:].clone(), SamplingMetadata.build(alone_row, VOCAB, CPU))
    # Next to a sequence verifying two drafts, the same seeded row gets the same token and
    # leaves its generator where the sampler leaves it, so its later tokens match too.
    beside_row = rows_for(params, 1, seed=5)
    rows = rows_for(SamplingParams(temperature=1.0), 3) + beside_row
    assert verify(logits, rows, [[1, 2], []])[1] == alone.tolist()
    assert torch.equal(beside_row[0].generator.get_state(), alone_row[0].generator.get_state())
