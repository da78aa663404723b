"""Continuous batching: which sequences compute how many tokens in the next step."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.kv_cache_manager import KVCacheManager
from engine.outputs import FinishReason
from engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSequence:
    seq: Sequence
    num_computed_tokens: int  # where this step's tokens start
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the sequence, so a next token is sampled."""
        return self.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Running sequences first (decodes and unfinished prefills), then new prompts, in chunks."""

    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._finished: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        # A step that had to preempt is short of blocks: admitting new prompts would thrash.
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def update_from_output(self, out: SchedulerOutput,
                           sampled: list[int | None]) -> list[Sequence]:
        """Apply one step's results; returns the sequences that received a token."""
        advanced = []
        for item, token_id in zip(out.scheduled, sampled, strict=True):
            seq = item.seq
            if seq.is_finished:  # aborted while the step ran
                continue
            seq.num_computed_tokens = item.num_computed_tokens + item.num_new_tokens
            self.kv_cache.cache_full_blocks(seq)
            if token_id is None:
                continue
            seq.append_token(token_id)
            advanced.append(seq)
            reason = seq.token_stop_reason(self.config.max_model_len)
            if reason is not None:
                self.finish(seq, reason)
        return advanced

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence now and give its blocks back."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.metrics.finished_time = time.monotonic()
        self.kv_cache.free(seq)
        self._finished.append(seq)

    def take_finished(self) -> list[Sequence]:
        """The sequences finished since the last call."""
        finished, self._finished = self._finished, []
        return finished

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, n, out):
                break  # seq itself left: everything after it already was preempted
            out.scheduled.append(ScheduledSequence(seq, seq.num_computed_tokens, n))
            budget -= n
            i += 1
        return budget

    def _allocate_or_preempt(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        while not self.kv_cache.allocate_slots(seq, n):
            victim = self.running.pop()  # the newest running sequence
            if victim is seq and not self.running:
                # Alone and still out of blocks: it has outgrown the whole KV cache.
                self.running.append(seq)
                self.finish(seq, "length")
                return False
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: free the blocks now; the prefix cache usually brings them back."""
        self.kv_cache.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            computed = self.kv_cache.get_computed_blocks(seq)
            num_hit = len(computed) * self.kv_cache.block_size
            n = min(seq.num_tokens - num_hit, budget)
            if not self.kv_cache.allocate_slots(seq, n, computed):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = num_hit
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_hit
                self.kv_cache.record_prefix_query(seq.num_tokens, num_hit)
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_hit, n))
            budget -= n
