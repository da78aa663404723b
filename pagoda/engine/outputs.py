"""What the engine hands back: plain dataclasses, vLLM-shaped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (time.monotonic seconds) of one request's life, and its speculation.

    num_draft_tokens: tokens proposed by speculative decoding; num_accepted_tokens: how many of
    them the model confirmed.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Accepted over proposed draft tokens; None when nothing was proposed."""
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens


@dataclass(slots=True, frozen=True)
class PromptProgress:
    """How far the engine has read a prompt: `num_computed_tokens` of its `num_prompt_tokens`
    are in the KV cache, `num_cached_tokens` of them found in the prefix cache; `elapsed` is the
    seconds since the request was first scheduled. Reported after each prefill chunk that does
    not finish the prompt, so a long prompt shows it is being read."""

    num_prompt_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    elapsed: float


@dataclass(slots=True, frozen=True)
class Logprob:
    """A token and the log-probability the model gave it: its text (alone, undecodable bytes
    replaced) and its exact bytes."""

    token_id: int
    token: str
    token_bytes: bytes
    logprob: float


@dataclass(slots=True, frozen=True)
class TokenLogprobs:
    """A sampled token's log-probability, its rank among all tokens (1 = the model's first
    choice) and the `SamplingParams.logprobs` best tokens at its position, best first.
    Log-probabilities are the model's own (log-softmax of its logits, in fp32), before any
    penalty, bias, constraint or temperature."""

    chosen: Logprob
    rank: int
    top: tuple[Logprob, ...]


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence. `text` and `token_ids` are cumulative; `delta_text` is new."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    # The stop string (of SamplingParams.stop) that ended it, if one did.
    stop_string: str | None = None
    # With SamplingParams.logprobs: one entry per token of token_ids, and those of this output.
    logprobs: list[TokenLogprobs] | None = None
    delta_logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int
    metrics: RequestMetrics
    # Set on the outputs sent mid-prefill (no new tokens): how much of the prompt is read.
    prompt_progress: PromptProgress | None = None
    # With SamplingParams.prompt_logprobs: per prompt token (None for the first, which nothing
    # predicts, and for those not read yet), from the first output after the prompt is read.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # A pooling request's vector (see PoolingParams), on its last output once the whole prompt
    # is read; None on any other output, and when it ended otherwise (aborted, failed).
    embedding: list[float] | None = None
