"""A request's state inside the engine: tokens, progress and the blocks it holds."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from pagoda.engine.core.checkpoint_store import Checkpoint
from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.outputs import FinishReason, RequestMetrics
from pagoda.engine.sampling.params import PoolingParams, SamplingParams

# A windowed KV cache group's table entry for a block released behind the window.
NULL_BLOCK = -1


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(slots=True, eq=False)
class Sequence:
    """One request. The scheduler and KV cache manager only do bookkeeping on it."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    prompt: str | None = None
    # Names the blocks this request used on disk (a chat), so deleting it can remove them.
    cache_tag: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    # The block table of the first KV cache group (every layer's, when they all attend alike).
    block_ids: list[int] = field(default_factory=list)
    # One table per windowed KV cache group (pagoda.engine.core.kv_cache_manager), NULL_BLOCK behind
    # its window.
    windowed_block_ids: list[list[int]] = field(default_factory=list)
    # Hashes of the full blocks of all_token_ids, chained block to block.
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Its slot in the recurrent layers' states (pagoda.engine.core.state_pool) while it runs on
    # a model that has them; None otherwise.
    state_slot: int | None = None
    # Checkpoints of those states (pagoda.engine.core.checkpoint_store): the latest block
    # boundary's, held while it runs and put in the store when it stops, and the one the
    # current step copies its states into (kept when the step's results come back).
    checkpoint: Checkpoint | None = None
    pending_checkpoint: Checkpoint | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # The worker's random generator for a seeded request (a torch.Generator), made when it first
    # samples and kept across steps and preemptions; bookkeeping here never touches it.
    generator: object | None = None
    # Its place in its grammar (an pagoda.engine.structured_output GrammarState) when the request is
    # constrained; the worker advances it, bookkeeping here never touches it.
    grammar: object | None = None
    # SamplingParams.bad_words as token ids, tokenized once when the request is added.
    bad_words_token_ids: list[list[int]] | None = None
    # The reply's reasoning budget (a pagoda.engine.sampling.reasoning_budget ReasoningBudget)
    # where SamplingParams.thinking_token_budget is set and the model reasons; the worker asks
    # it which tokens to force, bookkeeping here never touches it.
    reasoning_budget: object | None = None
    # Set for a pooling request: its prompt is read into one vector and nothing is sampled
    # (`params` is then the defaults, never read for sampling).
    pooling: PoolingParams | None = None
    # A pooling request's running sum of hidden states (an pagoda.engine.worker.pooler MeanPooler),
    # made at its first chunk; the worker adds to it, bookkeeping here never touches it.
    pooler: object | None = None
    # The prompt's images, in order, each with the placeholder tokens it fills
    # (pagoda.engine.core.image_spans); empty for a prompt of text.
    images: tuple[ImageSpan, ...] = ()
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.monotonic()))
    all_token_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_pooling(self) -> bool:
        return self.pooling is not None

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Drop the output tokens after the first `num_output_tokens` (a stop string ended it)."""
        del self.output_token_ids[num_output_tokens:]
        del self.all_token_ids[self.num_prompt_tokens + num_output_tokens:]

    def token_stop_reason(self, max_model_len: int) -> FinishReason | None:
        """Why the last sampled token ends this sequence, if it does (stop strings are elsewhere)."""
        last = self.output_token_ids[-1]
        if not self.params.ignore_eos and last in self.eos_token_ids:
            return "stop"
        if last in self.params.stop_token_ids:
            return "stop"
        if self.params.max_tokens is not None and self.num_output_tokens >= self.params.max_tokens:
            return "length"
        if self.num_tokens >= max_model_len:
            return "length"
        return None
