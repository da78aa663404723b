"""The sampler's behaviour: greedy, filters, penalties, seeds and the sampled distribution."""

from __future__ import annotations

import math

import pytest
import torch

from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.worker.sampler import (
    TOP_P_CANDIDATES,
    Sampler,
    SamplingMetadata,
    SamplingRow,
    filter_logits,
    row_argmax,
)

CPU = torch.device("cpu")


def row(
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    seed: int | None = None,
    **params: float,
) -> SamplingRow:
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return SamplingRow(SamplingParams(seed=seed, **params), prompt or [], output or [], generator)


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """One sampler step on a copy, so a test can reuse its logits."""
    metadata = SamplingMetadata.build(rows, logits.shape[-1], CPU)
    return Sampler()(logits.clone(), metadata)


def draws(logits: torch.Tensor, params: dict, steps: int) -> torch.Tensor:
    """Tokens drawn for one row, repeated across a batch of rows and several steps."""
    batch = logits.expand(64, -1)
    return torch.cat([sample(batch, [row(**params) for _ in range(64)]) for _ in range(steps)])


def probabilities_logits(probs: list[float], vocab: int = 8) -> torch.Tensor:
    """Logits whose softmax is `probs`, followed by tokens of negligible probability."""
    logits = torch.full((vocab,), -50.0)
    logits[: len(probs)] = torch.tensor(probs).log()
    return logits


@pytest.fixture(autouse=True)
def fixed_seed() -> None:
    torch.manual_seed(1234)


def test_greedy_rows_pick_the_argmax() -> None:
    logits = torch.randn(16, 1000)
    tokens = sample(logits, [row(temperature=0.0) for _ in range(16)])
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_all_greedy_batch_without_penalties_runs_only_a_max() -> None:
    logits = torch.randn(8, 1000)
    metadata = SamplingMetadata.build([row(temperature=0.0, top_k=5) for _ in range(8)], 1000, CPU)
    assert metadata.sampling is None and metadata.greedy_rows is None
    assert metadata.repetition is None and metadata.output_penalty is None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        Sampler()(logits, metadata)
    top_level = [e.name for e in profile.events() if e.cpu_parent is None and "aten::" in e.name]
    assert top_level == ["aten::max"]  # row_argmax


def test_top_k_of_one_matches_greedy() -> None:
    logits = torch.randn(16, 1000)
    tokens = sample(logits, [row(temperature=1.5, top_k=1) for _ in range(16)])
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_top_k_never_samples_outside_the_k_best() -> None:
    logits = torch.randn(32, 500) * 0.1  # nearly flat, so the draws spread over all k
    top_ks = [1 + 3 * i for i in range(32)]
    rows_seen: list[set[int]] = [set() for _ in range(32)]
    for _ in range(30):
        tokens = sample(logits, [row(top_k=k) for k in top_ks])
        for i, token in enumerate(tokens.tolist()):
            rows_seen[i].add(token)
    for i, k in enumerate(top_ks):
        best = set(logits[i].topk(k).indices.tolist())
        assert rows_seen[i] <= best
    assert len(rows_seen[-1]) > 20  # a wide k really samples widely


def test_top_p_keeps_the_smallest_nucleus() -> None:
    logits = probabilities_logits([0.5, 0.3, 0.15, 0.05])
    tokens = draws(logits, {"top_p": 0.75}, steps=40)
    # 0.5 alone is short of 0.75; 0.5 + 0.3 reaches it, so the nucleus is the first two tokens,
    # renormalized to 0.5 / 0.8.
    assert set(tokens.tolist()) == {0, 1}
    assert (tokens == 0).float().mean().item() == pytest.approx(0.625, abs=0.03)


def test_top_p_applies_to_what_top_k_leaves_renormalized() -> None:
    logits = probabilities_logits([0.4, 0.3, 0.2, 0.1])
    # After top-k 2 the probabilities are 4/7 and 3/7: 4/7 alone already covers top-p 0.5.
    tokens = draws(logits, {"top_k": 2, "top_p": 0.5}, steps=10)
    assert set(tokens.tolist()) == {0}


def test_top_p_nucleus_wider_than_the_candidate_shortlist_is_kept_whole() -> None:
    vocab = 4096
    logits = -torch.arange(vocab, dtype=torch.float32) * 1e-4  # nearly flat, slowly decreasing
    probs = logits.softmax(dim=-1)
    nucleus = int(((probs.cumsum(dim=-1) - probs) < 0.5).sum())
    assert nucleus > 4 * TOP_P_CANDIDATES
    tokens = draws(logits, {"top_p": 0.5}, steps=8)
    assert tokens.max().item() < nucleus
    assert tokens.max().item() > 0.9 * nucleus


def test_min_p_drops_tokens_below_its_fraction_of_the_top_probability() -> None:
    logits = probabilities_logits([0.4, 0.3, 0.15, 0.1, 0.05])
    # min_p 0.3 of the top 0.4 is 0.12: tokens 3 and 4 go.
    tokens = draws(logits, {"min_p": 0.3}, steps=20)
    assert set(tokens.tolist()) == {0, 1, 2}


def typical_set(probs: list[float], mass: float) -> set[int]:
    """Locally typical sampling written out: the tokens nearest the entropy in surprise, added
    one by one until their probabilities reach `mass`."""
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    ranked = sorted((i for i, p in enumerate(probs) if p > 0),
                    key=lambda i: abs(-math.log(probs[i]) - entropy))
    kept, total = set(), 0.0
    for i in ranked:
        kept.add(i)
        total += probs[i]
        if total >= mass:
            break
    return kept


def test_typical_p_can_leave_out_the_likeliest_token() -> None:
    probs = [0.5, 0.25, 0.15, 0.1]
    # The entropy is 1.21 nats: token 1's surprise (1.39) is nearest, then token 0's (0.69).
    logits = probabilities_logits(probs)
    tokens = draws(logits, {"typical_p": 0.2}, steps=10)
    assert set(tokens.tolist()) == {1} == typical_set(probs, 0.2)
    tokens = draws(logits, {"typical_p": 0.5}, steps=40)
    assert set(tokens.tolist()) == {0, 1} == typical_set(probs, 0.5)
    assert (tokens == 0).float().mean().item() == pytest.approx(0.5 / 0.75, abs=0.03)


def test_typical_p_keeps_what_the_reference_computation_keeps() -> None:
    logits = torch.randn(24, 300) * 2.0
    masses = [0.05 + 0.04 * i for i in range(23)] + [1.0]
    metadata = SamplingMetadata.build([row(typical_p=m) for m in masses], 300, CPU)
    kept = filter_logits(logits.clone(), metadata.sampling).isfinite()
    for i, mass in enumerate(masses):
        probs = logits[i].double().softmax(dim=-1).tolist()
        expected = typical_set(probs, mass) if mass < 1.0 else set(range(300))
        assert set(kept[i].nonzero().squeeze(1).tolist()) == expected, f"row {i}"


def test_typical_p_applies_to_what_top_k_leaves() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    logits = probabilities_logits(probs)
    # Top-k 2 leaves 4/7 and 3/7, whose entropy (0.68) is nearer token 0's surprise (0.56).
    tokens = draws(logits, {"top_k": 2, "typical_p": 0.3}, steps=10)
    assert set(tokens.tolist()) == {0} == typical_set([4 / 7, 3 / 7], 0.3)


def ending_row(output: list[int], min_tokens: int, **params) -> SamplingRow:
    """A greedy row whose model ends with token 2 (its EOS), stopping at token 3 too."""
    params = SamplingParams(temperature=0.0, min_tokens=min_tokens, stop_token_ids=[3], **params)
    return SamplingRow(params, [], output, eos_token_ids=frozenset({2}))


def test_a_row_short_of_min_tokens_never_samples_its_end_or_stop_tokens() -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.0, 3.0]])  # EOS first, then the stop token
    assert sample(logits, [ending_row([7, 7], min_tokens=3)]).item() == 4
    assert sample(logits, [ending_row([7, 7, 7], min_tokens=3)]).item() == 2


def test_min_tokens_leaves_eos_alone_when_the_row_ignores_it() -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.0, 3.0]])
    row_ = ending_row([], min_tokens=2, ignore_eos=True)
    assert sample(logits, [row_]).item() == 2
    logits[0, 2] = -1.0
    assert sample(logits, [row_]).item() == 4  # the stop token is still banned


def test_min_tokens_outweighs_a_logit_bias_and_spares_other_rows() -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.0, 3.0]] * 2)
    short = ending_row([], min_tokens=4, logit_bias={2: 100.0, 3: 100.0})
    done = ending_row([7, 7, 7, 7], min_tokens=4)
    assert sample(logits, [short, done]).tolist() == [4, 2]


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = torch.tensor([2.0, 0.99, -1.0, -1.5, -5.0])
    # 2.0 / 2 = 1.0 still beats 0.99.
    assert sample(logits[None], [row(prompt=[0], temperature=0, repetition_penalty=2.0)]) == 0
    # 2.0 / 2.1 < 0.99.
    assert sample(logits[None], [row(output=[0], temperature=0, repetition_penalty=2.1)]) == 1
    negative = torch.tensor([-1.0, -1.5, -5.0])
    # -1.0 * 2 = -2.0 falls below -1.5; dividing would have raised it instead.
    assert sample(negative[None], [row(prompt=[0], temperature=0, repetition_penalty=2.0)]) == 1


def test_frequency_penalty_grows_with_each_output_occurrence() -> None:
    logits = torch.tensor([5.0, 4.5, 0.0])[None]
    three_times = [0, 0, 0]
    # 5.0 - 3 * 0.1 = 4.7 > 4.5; 5.0 - 3 * 0.2 = 4.4 < 4.5.
    assert sample(logits, [row(output=three_times, temperature=0, frequency_penalty=0.1)]) == 0
    assert sample(logits, [row(output=three_times, temperature=0, frequency_penalty=0.2)]) == 1
    assert sample(logits, [row(output=[0], temperature=0, frequency_penalty=0.2)]) == 0


def test_presence_penalty_counts_an_output_token_once() -> None:
    logits = torch.tensor([5.0, 4.5, 0.0])[None]
    many = [0] * 10
    assert sample(logits, [row(output=many, temperature=0, presence_penalty=0.4)]) == 0
    assert sample(logits, [row(output=many, temperature=0, presence_penalty=0.6)]) == 1


def test_presence_and_frequency_penalties_ignore_prompt_tokens() -> None:
    logits = torch.tensor([5.0, 4.5, 0.0])[None]
    prompt_only = row(prompt=[0, 0, 0], temperature=0, presence_penalty=2.0, frequency_penalty=2.0)
    assert sample(logits, [prompt_only]) == 0


def reference_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """vLLM's penalties written plainly, one row and one token at a time."""
    out = logits.clone()
    for i, r in enumerate(rows):
        p = r.params
        for token in set(r.prompt_token_ids) | set(r.output_token_ids):
            value = out[i, token]
            out[i, token] = (
                value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
            )
        for token in set(r.output_token_ids):
            count = r.output_token_ids.count(token)
            out[i, token] -= p.presence_penalty + p.frequency_penalty * count
    return out


def test_penalties_match_the_reference_formulas_on_random_batches() -> None:
    vocab = 50
    logits = torch.randn(24, vocab) * 2
    rng = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, 12, (n,), generator=rng).tolist()  # small ids, many repeats

    def penalty(low: float, high: float) -> float:
        return low + (high - low) * torch.rand((), generator=rng).item()

    rows = [
        row(
            prompt=tokens(20),
            output=tokens(15),
            temperature=0,
            repetition_penalty=penalty(0.5, 2.0),
            presence_penalty=penalty(-2, 2),
            frequency_penalty=penalty(-2, 2),
        )
        if i % 3
        else row(prompt=tokens(20), output=tokens(15), temperature=0)
        for i in range(24)
    ]
    expected = reference_penalties(logits, rows).argmax(dim=-1)
    assert torch.equal(sample(logits, rows), expected)


def test_penalties_of_one_row_never_touch_another_row() -> None:
    vocab = 10
    logits = torch.zeros(2, vocab)
    logits[:, 3] = 1.0
    logits[:, 5] = 0.9  # any penalty on token 3 hands the win to token 5
    # In a flat [rows * vocab] index, row 0's out-of-vocabulary id vocab + 3 is row 1's token 3.
    penalized = row(
        prompt=[3, vocab + 3],
        output=[3, 3],
        temperature=0,
        repetition_penalty=2.0,
        presence_penalty=2.0,
        frequency_penalty=2.0,
    )
    tokens = sample(logits, [penalized, row(temperature=0)])
    assert tokens.tolist() == [5, 3]


def test_same_seed_gives_same_tokens_across_runs() -> None:
    logits = torch.randn(1, 1000)

    def run() -> list[int]:
        seeded = row(seed=42, temperature=1.0)  # one generator, carried across steps
        return [sample(logits, [seeded]).item() for _ in range(20)]

    first = run()
    torch.manual_seed(999)  # the default RNG must not matter
    assert run() == first
    assert len(set(first)) > 5


def test_same_seed_gives_same_tokens_whatever_shares_the_batch() -> None:
    vocab = 1000
    logits = torch.randn(1, vocab)
    params = {"temperature": 0.8, "top_k": 200, "top_p": 0.9, "min_p": 0.01}
    alone_row = row(seed=7, **params)
    alone = [sample(logits, [alone_row]).item() for _ in range(20)]

    batched_row = row(seed=7, **params)
    batched = []
    for step in range(20):
        others = torch.randn(5, vocab)
        batch = torch.cat([others[:3], logits, others[3:]])
        rows = [
            row(temperature=0),
            row(top_k=700),
            row(seed=step, top_p=0.3),
            batched_row,
            row(temperature=2.0),
            row(min_p=0.5, repetition_penalty=1.3),
        ]
        batched.append(sample(batch, rows)[3].item())
    assert batched == alone


def test_different_seeds_give_different_tokens() -> None:
    logits = torch.zeros(1, 1000)
    runs = set()
    for seed in range(8):
        seeded = row(seed=seed)
        runs.add(tuple(sample(logits, [seeded]).item() for _ in range(10)))
    assert len(runs) == 8


def test_mixed_batch_keeps_each_rows_own_parameters() -> None:
    logits = torch.randn(6, 300)
    rows = [
        row(temperature=0),
        row(top_k=1, temperature=3.0),
        row(temperature=0, top_k=50),
        row(min_p=1.0),
        row(temperature=0),
        row(top_p=0.3, temperature=5.0),
    ]
    for _ in range(20):
        tokens = sample(logits, rows)
        argmax = logits.argmax(dim=-1)
        # Greedy rows, top-k 1 and min-p 1 all pick the argmax; top-p 0.3 stays in its nucleus.
        assert torch.equal(tokens[:5], argmax[:5])
        probs = (logits[5] / 5.0).softmax(dim=-1)
        ordered = probs.sort(descending=True)
        nucleus = ordered.indices[(ordered.values.cumsum(0) - ordered.values) < 0.3]
        assert tokens[5].item() in nucleus.tolist()


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sampling_follows_the_softmax(temperature: float) -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
    tokens = draws(logits, {"temperature": temperature}, steps=100)
    probs = (logits / temperature).softmax(dim=-1)
    # 8 categories, 7 degrees of freedom: 24.3 is the 0.1% tail. The seed is fixed, so this
    # cannot flake; a sampler that ignored the temperature lands far above it.
    assert chi_square(tokens, probs) < 24.3
    assert chi_square(tokens, logits.softmax(dim=-1)) > 24.3 or temperature == 1.0


def test_seeded_rows_follow_the_softmax_too() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, math.log(0.5)])
    seeded = row(seed=3)
    tokens = torch.cat([sample(logits[None], [seeded]) for _ in range(3000)])
    assert chi_square(tokens, logits.softmax(dim=-1)) < 16.3  # 3 degrees of freedom, 0.1%


def test_row_argmax_is_argmax_first_of_ties_and_nan_counting_as_largest():
    torch.manual_seed(0)
    logits = torch.randint(0, 4, (64, 49152)).float()  # many ties for the largest value
    logits[5, 777] = logits[5, 40000] = float("nan")
    logits[6, -1] = float("inf")
    tokens = row_argmax(logits)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert tokens[5] == 777 and tokens[6] == 49151
    assert tokens[0] == (logits[0] == 3).nonzero()[0, 0]
