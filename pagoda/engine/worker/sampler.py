"""Turns one step's logits into next tokens: penalties, greedy or filtered random sampling.

The knobs each row may set are the table's (pagoda.engine.sampling.fields); each is honoured
here, and a row at its neutral value costs nothing.

Every row carries its own parameters, so the work is vectorized over rows with per-row tensors
built once per step by `SamplingMetadata.build`. Work a batch does not need is skipped: an
all-greedy batch without penalties is a single argmax.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import torch

from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.structured_output.matcher import GrammarRows
from pagoda.engine.worker.logits_controls import LogitsControls, RowControls
from pagoda.kernels.torch_ref import row_argmax

# A top-p row without top-k first looks for its nucleus among this many best tokens, since a
# partial top-k is far cheaper than sorting the whole vocabulary; rows whose nucleus turns out to
# be wider are sorted in full.
TOP_P_CANDIDATES = 256

_NEG_INF = float("-inf")


@dataclass(slots=True)
class SamplingRow:
    """What the sampler needs to know about one sequence that samples this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    # Owned by the request (set when params.seed is given) so its draws continue across steps
    # and do not depend on the other rows. It may live on another device than the logits.
    generator: torch.Generator | None = None
    # The request's bad words as token ids (SamplingParams.bad_words, tokenized once).
    bad_words_token_ids: list[list[int]] | None = None
    # The model's end tokens, banned with the stop tokens until min_tokens are written.
    eos_token_ids: frozenset[int] = frozenset()
    # The one token this position may be: the reasoning budget closing the reasoning
    # (pagoda.engine.sampling.reasoning_budget); None where the model picks.
    forced_token: int | None = None


@dataclass(slots=True)
class RepetitionPenalty:
    """Rows with a repetition penalty: every prompt or output token, once per occurrence."""

    positions: torch.Tensor  # flat index row * vocab + token into the logits
    penalty: torch.Tensor  # the owning row's repetition_penalty, per position


@dataclass(slots=True)
class OutputPenalty:
    """Rows with a presence or frequency penalty: every output token, once per occurrence."""

    positions: torch.Tensor  # flat index row * vocab + token into the logits
    presence: torch.Tensor  # the owning row's presence_penalty, per position
    frequency: torch.Tensor  # the owning row's frequency_penalty, per position


@dataclass(slots=True)
class TopKTopP:
    """Per-row top-k and top-p of the sampled rows, as [rows, 1] columns."""

    top_k: torch.Tensor  # int64, vocab where the row has no top-k
    top_p: torch.Tensor  # inf where the row has no top-p
    unfiltered: torch.Tensor  # bool, the row has neither and keeps every token
    top_p_only: torch.Tensor | None  # bool, top-p without top-k; None when no row is so
    candidate_count: int  # how many best logits per row to look at before any full sort


@dataclass(slots=True)
class RandomSampling:
    """Parameters of the rows that sample at random, in their order in the sampled logits."""

    temperature: torch.Tensor | None  # [rows, 1]; None when every row uses temperature 1
    top_k_top_p: TopKTopP | None  # None when no row uses either
    min_p_log: torch.Tensor | None  # [rows, 1] log(min_p), -inf where off; None when all off
    typical_p: torch.Tensor | None  # [rows, 1], inf where off; None when all off
    generators: list[torch.Generator | None]
    any_unseeded: bool


@dataclass(slots=True)
class SamplingMetadata:
    """One step's sampling tensors, built once by `build` and read by `Sampler`."""

    num_rows: int
    sampling: RandomSampling | None  # None when every row is greedy
    # Row indices into the logits; set only when greedy and sampled rows share the batch.
    greedy_rows: torch.Tensor | None
    sampled_rows: torch.Tensor | None
    repetition: RepetitionPenalty | None
    output_penalty: OutputPenalty | None
    grammar: GrammarRows | None = None  # the constrained rows' allowed tokens
    controls: LogitsControls | None = None  # biased, allowed-only and bad-word rows
    # Flat positions (row * vocab + token) of the end and stop tokens of the rows short of
    # their min_tokens: not sampled yet.
    early_ends: torch.Tensor | None = None

    @classmethod
    def build(
        cls, rows: list[SamplingRow], vocab_size: int, device: torch.device,
        grammar: GrammarRows | None = None,
    ) -> SamplingMetadata:
        sampled = [i for i, row in enumerate(rows) if not row.params.greedy]
        greedy_rows = sampled_rows = None
        if 0 < len(sampled) < len(rows):
            greedy = [i for i, row in enumerate(rows) if row.params.greedy]
            greedy_rows = torch.tensor(greedy, dtype=torch.long, device=device)
            sampled_rows = torch.tensor(sampled, dtype=torch.long, device=device)
        sampling = None
        if sampled:
            sampling = _build_random_sampling([rows[i] for i in sampled], vocab_size, device)
        penalized = any(row.params.uses_penalties for row in rows)
        return cls(
            num_rows=len(rows),
            sampling=sampling,
            greedy_rows=greedy_rows,
            sampled_rows=sampled_rows,
            repetition=_build_repetition(rows, vocab_size, device) if penalized else None,
            output_penalty=_build_output_penalty(rows, vocab_size, device) if penalized else None,
            grammar=grammar,
            controls=_build_controls(rows, vocab_size, device),
            early_ends=_build_early_ends(rows, vocab_size, device),
        )


# Each row's argmax (the first of equal largest values; NaN largest): a kernel backend's
# (`KernelOps.row_argmax`), torch's by default.
RowArgmax = Callable[[torch.Tensor], torch.Tensor]


class Sampler:
    """Picks the next token of every row from its logits, following the row's SamplingParams."""

    def __init__(self, argmax: RowArgmax = row_argmax) -> None:
        self.argmax = argmax

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """logits [num_rows, vocab] float32 -> next token ids [num_rows] int64.

        The logits are modified in place, which saves a copy of [num_rows, vocab] per step.
        """
        logits = process_logits(logits, metadata)
        if metadata.sampling is None:
            return self.argmax(logits)
        if metadata.sampled_rows is None:
            return _sample(logits, metadata.sampling, self.argmax)
        tokens = torch.empty(metadata.num_rows, dtype=torch.long, device=logits.device)
        tokens[metadata.greedy_rows] = self.argmax(logits[metadata.greedy_rows])
        tokens[metadata.sampled_rows] = _sample(logits[metadata.sampled_rows], metadata.sampling,
                                                self.argmax)
        return tokens


def _build_random_sampling(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> RandomSampling:
    params = [row.params for row in rows]
    temperatures = [p.temperature for p in params]
    temperature = None
    if any(t != 1.0 for t in temperatures):
        temperature = torch.tensor(temperatures, device=device).unsqueeze(1)
    min_p_log = None
    if any(p.min_p > 0.0 for p in params):
        logs = [math.log(p.min_p) if p.min_p > 0.0 else _NEG_INF for p in params]
        min_p_log = torch.tensor(logs, device=device).unsqueeze(1)
    typical_p = None
    if any(p.typical_p < 1.0 for p in params):
        masses = [p.typical_p if p.typical_p < 1.0 else math.inf for p in params]
        typical_p = torch.tensor(masses, device=device).unsqueeze(1)
    generators = [row.generator for row in rows]
    return RandomSampling(
        temperature=temperature,
        top_k_top_p=_build_top_k_top_p(params, vocab_size, device),
        min_p_log=min_p_log,
        typical_p=typical_p,
        generators=generators,
        any_unseeded=any(g is None for g in generators),
    )


def _build_top_k_top_p(
    params: list[SamplingParams], vocab_size: int, device: torch.device
) -> TopKTopP | None:
    top_k = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
    top_p = [p.top_p if p.top_p < 1.0 else math.inf for p in params]
    unfiltered = [k >= vocab_size and p > 1.0 for k, p in zip(top_k, top_p)]
    if all(unfiltered):
        return None
    top_p_only = [k >= vocab_size and p <= 1.0 for k, p in zip(top_k, top_p)]
    # A row with top-k never needs more than k candidates, even for its top-p.
    needed = [
        k if k < vocab_size else TOP_P_CANDIDATES if p <= 1.0 else 1 for k, p in zip(top_k, top_p)
    ]
    return TopKTopP(
        top_k=torch.tensor(top_k, dtype=torch.long, device=device).unsqueeze(1),
        top_p=torch.tensor(top_p, device=device).unsqueeze(1),
        unfiltered=_bool_column(unfiltered, device),
        top_p_only=_bool_column(top_p_only, device) if any(top_p_only) else None,
        candidate_count=min(max(needed), vocab_size),
    )


def _bool_column(values: list[bool], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool, device=device).unsqueeze(1)


def _build_controls(rows: list[SamplingRow], vocab_size: int,
                    device: torch.device) -> LogitsControls | None:
    controlled = [_row_controls(i, row) for i, row in enumerate(rows)
                  if row.params.processes_logits or row.forced_token is not None]
    return LogitsControls.build(controlled, vocab_size, device) if controlled else None


def _row_controls(index: int, row: SamplingRow) -> RowControls:
    if row.forced_token is not None:
        # The forced token alone: no bias or bad word of the request may take it away.
        return RowControls(index, None, [row.forced_token], None, row.output_token_ids)
    return RowControls(index, row.params.logit_bias, row.params.allowed_token_ids,
                       row.bad_words_token_ids, row.output_token_ids)


def _build_early_ends(rows: list[SamplingRow], vocab_size: int,
                      device: torch.device) -> torch.Tensor | None:
    """The tokens that would end each row short of its min_tokens: its stop tokens, and its
    end tokens unless it ignores them (vLLM's rule)."""
    short = [i for i, row in enumerate(rows) if len(row.output_token_ids) < row.params.min_tokens]
    if not short:
        return None
    ends = [sorted(set(rows[i].params.stop_token_ids)
                   | (frozenset() if rows[i].params.ignore_eos else rows[i].eos_token_ids))
            for i in short]
    return _flat_positions(ends, short, vocab_size, device)[0]


def _build_repetition(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> RepetitionPenalty | None:
    chosen = [i for i, row in enumerate(rows) if row.params.repetition_penalty != 1.0]
    if not chosen:
        return None
    tokens = [rows[i].prompt_token_ids + rows[i].output_token_ids for i in chosen]
    positions, owner = _flat_positions(tokens, chosen, vocab_size, device)
    penalty = torch.tensor([rows[i].params.repetition_penalty for i in chosen], device=device)
    return RepetitionPenalty(positions=positions, penalty=penalty[owner])


def _build_output_penalty(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> OutputPenalty | None:
    chosen = [i for i, row in enumerate(rows) if row.output_token_ids and _penalizes_output(row)]
    if not chosen:
        return None
    positions, owner = _flat_positions(
        [rows[i].output_token_ids for i in chosen], chosen, vocab_size, device
    )
    values = torch.tensor(
        [[rows[i].params.presence_penalty, rows[i].params.frequency_penalty] for i in chosen],
        device=device,
    )[owner]
    return OutputPenalty(positions=positions, presence=values[:, 0], frequency=values[:, 1])


def _penalizes_output(row: SamplingRow) -> bool:
    return row.params.presence_penalty != 0.0 or row.params.frequency_penalty != 0.0


def _flat_positions(
    token_lists: list[list[int]], row_ids: list[int], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat logits index (row * vocab + token) of every token, and which listed row owns it.

    Ids outside the vocabulary are dropped: in a flat index they would land in another row.
    """
    tokens = _long_tensor(list(chain.from_iterable(token_lists)), device)
    lengths = torch.tensor([len(t) for t in token_lists], dtype=torch.long, device=device)
    owner = torch.repeat_interleave(
        torch.arange(len(token_lists), device=device), lengths, output_size=tokens.numel()
    )
    bases = torch.tensor(row_ids, dtype=torch.long, device=device) * vocab_size
    in_vocab = (tokens >= 0) & (tokens < vocab_size)
    return (bases[owner] + tokens)[in_vocab], owner[in_vocab]


def _long_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    # Through array('q') a long list converts about four times faster than with torch.tensor.
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.frombuffer(array("q", values), dtype=torch.long).to(device)


def process_logits(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """Every row's constraint, logit controls and penalties, in place where possible; what
    greedy rows take the argmax of."""
    assert logits.shape[0] == metadata.num_rows, "one logits row per sampling row"
    assert logits.dtype == torch.float32, "penalties and noise need float32 logits"
    if metadata.grammar is not None or metadata.controls is not None or \
            metadata.early_ends is not None:
        logits = logits.contiguous()
        if metadata.grammar is not None:
            metadata.grammar.apply(logits)
        if metadata.controls is not None:
            metadata.controls.apply(logits)
        if metadata.early_ends is not None:  # last, so no bias brings an end token back
            logits.view(-1)[metadata.early_ends] = _NEG_INF
    if metadata.repetition is None and metadata.output_penalty is None:
        return logits
    return _apply_penalties(logits, metadata.repetition, metadata.output_penalty)


def _apply_penalties(
    logits: torch.Tensor, repetition: RepetitionPenalty | None, output: OutputPenalty | None
) -> torch.Tensor:
    """vLLM's penalties, touching only the logits of tokens a row has seen.

    A token seen several times is read and written once per occurrence; the writes of the
    repetition and presence penalties all carry the same value, so repeats are harmless, and the
    frequency penalty accumulates exactly once per occurrence.
    """
    logits = logits.contiguous()
    flat = logits.view(-1)
    if repetition is not None:
        seen = flat[repetition.positions]
        flat[repetition.positions] = torch.where(
            seen > 0, seen / repetition.penalty, seen * repetition.penalty
        )
    if output is not None:
        flat[output.positions] = flat[output.positions] - output.presence
        flat.index_add_(0, output.positions, output.frequency, alpha=-1.0)
    return logits


def _sample(logits: torch.Tensor, sampling: RandomSampling, argmax: RowArgmax) -> torch.Tensor:
    return draw(filter_logits(logits, sampling), sampling, argmax)


def filter_logits(logits: torch.Tensor, sampling: RandomSampling) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p as one cut-off per row (-inf below it), then
    typical-p over what they leave (Hugging Face's order), in place.

    The result is the log of the distribution each random row draws from, up to a constant.
    """
    if sampling.temperature is not None:
        logits.div_(sampling.temperature)
    threshold = _keep_threshold(logits, sampling)
    if threshold is not None:
        logits.masked_fill_(logits < threshold, _NEG_INF)
    if sampling.typical_p is not None:
        _keep_typical(logits, sampling.typical_p)
    return logits


def _keep_typical(logits: torch.Tensor, typical_p: torch.Tensor) -> None:
    """Locally typical sampling (Meister et al., 2022): rank tokens by how far their surprise
    (-log p) is from the distribution's entropy, the expected surprise, and keep the fewest
    nearest ones whose probabilities reach typical_p (at least one); -inf for the rest."""
    log_probs = logits.log_softmax(dim=-1)
    probs = log_probs.exp()
    # p log p is 0 for a token already cut (0 * -inf would be NaN).
    entropy = -torch.where(probs > 0, probs * log_probs, 0.0).sum(dim=-1, keepdim=True)
    order = (-log_probs - entropy).abs_().argsort(dim=-1)
    ordered = probs.gather(-1, order)
    beyond = (ordered.cumsum(dim=-1) - ordered) >= typical_p
    logits.masked_fill_(beyond.scatter(-1, order, beyond), _NEG_INF)


def draw(logits: torch.Tensor, sampling: RandomSampling,
         argmax: RowArgmax = row_argmax) -> torch.Tensor:
    """One token per row from softmax(logits), consuming the logits."""
    # Exponential race: argmax(p / q) with q ~ Exp(1) is a draw from p, and in log space it
    # needs no softmax: argmax(logit - log q).
    logits.sub_(_log_exponential_noise(logits, sampling))
    return argmax(logits)


def _keep_threshold(logits: torch.Tensor, sampling: RandomSampling) -> torch.Tensor | None:
    """The lowest logit each row keeps, as [rows, 1], or None when no row filters."""
    threshold = None
    if sampling.top_k_top_p is not None:
        threshold = _top_k_top_p_threshold(logits, sampling.top_k_top_p)
    if sampling.min_p_log is not None:
        # p >= min_p * p_max is logit >= max_logit + log(min_p); renormalizing after top-k or
        # top-p does not change the ratio, so the order of the filters does not matter.
        min_p = logits.amax(dim=-1, keepdim=True) + sampling.min_p_log
        threshold = min_p if threshold is None else torch.maximum(threshold, min_p)
    return threshold


def _top_k_top_p_threshold(logits: torch.Tensor, filters: TopKTopP) -> torch.Tensor:
    vocab_size = logits.shape[-1]
    whole = filters.candidate_count >= vocab_size
    if whole:
        best = logits.sort(dim=-1, descending=True).values
    else:
        best = logits.topk(filters.candidate_count, dim=-1).values
    rank = torch.arange(best.shape[-1], device=best.device)
    best = best.masked_fill_(rank >= filters.top_k, _NEG_INF)
    # vLLM takes top-p over what top-k leaves, renormalized; without top-k, over the whole vocab.
    lse = best.logsumexp(dim=-1, keepdim=True)
    partial_nucleus = not whole and filters.top_p_only is not None
    if partial_nucleus:
        lse = torch.where(filters.top_p_only, logits.logsumexp(dim=-1, keepdim=True), lse)
    threshold, mass = _cutoff(best, lse, filters.top_k, filters.top_p)
    if partial_nucleus:
        _widen_cut_short_nuclei(threshold, mass, logits, filters)
    return threshold.masked_fill_(filters.unfiltered, _NEG_INF)


def _widen_cut_short_nuclei(
    threshold: torch.Tensor, mass: torch.Tensor, logits: torch.Tensor, filters: TopKTopP
) -> None:
    """Redo, over a full sort, the top-p-only rows whose nucleus is wider than the candidates."""
    short = (filters.top_p_only & (mass < filters.top_p)).squeeze(1).nonzero().squeeze(1)
    if short.numel() == 0:
        return
    ordered = logits[short].sort(dim=-1, descending=True).values
    lse = ordered.logsumexp(dim=-1, keepdim=True)
    threshold[short] = _cutoff(ordered, lse, filters.top_k[short], filters.top_p[short])[0]


def _cutoff(
    best: torch.Tensor, lse: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lowest kept logit per row from its best logits (sorted descending, -inf past top-k),
    and the probability mass those best logits hold under the normalizer `lse`.

    A token stays while the mass strictly above it is below top_p: the smallest nucleus.
    """
    probs = (best - lse).exp_()
    mass = probs.cumsum(dim=-1)
    within_top_p = (mass - probs) < top_p
    # Positions past top-k hold no mass, so a row without top-p would keep them; cap at k.
    kept = torch.minimum(within_top_p.sum(dim=-1, keepdim=True), top_k)
    return best.gather(1, kept - 1), mass[:, -1:]


def _log_exponential_noise(logits: torch.Tensor, sampling: RandomSampling) -> torch.Tensor:
    """log q with q ~ Exp(1) per logit.

    q = -log(u) with u ~ U[0, 1): on CPU uniform_ is several times faster than exponential_.
    u = 0 gives q = inf, which only removes that token from the race.
    """
    return uniform_like(logits, sampling.generators, sampling.any_unseeded).log_().neg_().log_()


def uniform_like(x: torch.Tensor, generators: list[torch.Generator | None],
                 any_unseeded: bool = True) -> torch.Tensor:
    """U[0, 1) in x's shape [rows, n]; seeded rows draw theirs from their own generator."""
    noise = torch.empty_like(x)
    if any_unseeded:
        noise.uniform_()
    for row, generator in enumerate(generators):
        if generator is None:
            continue
        if generator.device == noise.device:
            noise[row].uniform_(generator=generator)
        else:
            # A CPU generator on a GPU step: draw where it lives, so a seed means the same
            # tokens whichever device runs the model.
            drawn = torch.empty(noise.shape[-1], device=generator.device)
            noise[row].copy_(drawn.uniform_(generator=generator))
    return noise
