"""Continuous batching: which sequences compute how many tokens in the next step."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from pagoda.engine.config import SchedulerConfig
from pagoda.engine.core.checkpoint_store import Checkpoint
from pagoda.engine.core.image_spans import chunk_end
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.sequence import Sequence, SequenceStatus
from pagoda.engine.core.state_pool import StatePool
from pagoda.engine.outputs import FinishReason
from pagoda.engine.spec_decode.draft_policy import DraftCandidate, DraftingTrend, plan_drafts
from pagoda.engine.spec_decode.draft_sources import DraftSources
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer
from pagoda.engine.spec_decode.step_cost import StepCost


@dataclass(slots=True)
class ScheduledSequence:
    seq: Sequence
    num_computed_tokens: int  # where this step's tokens start
    num_new_tokens: int  # including the drafts
    # Proposed tokens to verify after the sequence's last one; they are not in the sequence yet.
    spec_token_ids: list[int] = field(default_factory=list)
    # A proposal's first draft that was not worth verifying, checked against the sampled token.
    shadow_draft: int | None = None

    @property
    def reaches_end(self) -> bool:
        """Whether this step computes the sequence up to its last token."""
        end = self.num_computed_tokens + self.num_new_tokens - len(self.spec_token_ids)
        return end == self.seq.num_tokens

    @property
    def samples(self) -> bool:
        """Whether a next token is sampled after this step: it reaches the end of a sequence
        that is not a pooling one (those are read, never continued)."""
        return self.reaches_end and not self.seq.is_pooling


@dataclass(slots=True)
class SchedulerOutput:
    """restore_states: (checkpoint slot, sequence's state slot) copies of the recurrent layers'
    states to make before the step's forward (sequences starting from a cached prefix);
    save_states: (sequence's state slot, checkpoint slot) copies to make after it (sequences
    whose step ends at a block boundary worth a checkpoint)."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    restore_states: list[tuple[int, int]] = field(default_factory=list)
    save_states: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Running sequences first (decodes and unfinished prefills), then new prompts, in chunks."""

    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager,
                 proposer: NgramProposer | DraftSources | None = None,
                 step_cost: StepCost | None = None, states: StatePool | None = None) -> None:
        """step_cost: what steps cost here by rows, which decides how many drafts pay (without
        it, rows are taken as free: every draft found is verified). states: the recurrent
        layers' slots, for a model that has them: a sequence runs only while it holds one."""
        self.config = config
        self.kv_cache = kv_cache
        self.states = states
        self.proposer = proposer
        self.step_cost = step_cost or StepCost()
        self.drafting = DraftingTrend()  # the latest step's drafting decision, and the trend
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._finished: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.kv_cache.prefetch(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        # A step that had to preempt is short of blocks: admitting new prompts would thrash.
        if not out.preempted:
            budget = self._schedule_waiting(out, budget)
        if self.proposer is not None:
            self._add_drafts(out, budget)
        return out

    def update_from_output(self, out: SchedulerOutput,
                           sampled: list[list[int]]) -> list[tuple[Sequence, int]]:
        """Apply one step's results: per scheduled sequence the tokens it produced (none
        mid-prefill; after speculation, the kept drafts and one more). Returns the sequences that
        received tokens, each with how many."""
        advanced = []
        for item, token_ids in zip(out.scheduled, sampled, strict=True):
            seq = item.seq
            if seq.is_finished:  # aborted while the step ran
                continue
            if item.spec_token_ids:
                self.proposer.record(seq, len(item.spec_token_ids), len(token_ids) - 1)
            elif item.shadow_draft is not None and token_ids:
                self.proposer.record_shadow(seq, token_ids[0] == item.shadow_draft)
            num_appended, reason = self._append_until_stop(seq, token_ids)
            # The KV cache holds every token before the last one appended: the step's own
            # tokens and the kept drafts. Rejected drafts' blocks go back before anything is
            # hashed, so the prefix cache only ever sees tokens of the sequence.
            seq.num_computed_tokens = (item.num_computed_tokens + item.num_new_tokens
                                       - len(item.spec_token_ids) + max(num_appended - 1, 0))
            if item.spec_token_ids:
                self.kv_cache.trim(seq)
            self.kv_cache.cache_full_blocks(seq)
            if seq.pending_checkpoint is not None:
                self._keep_checkpoint(seq)
            if num_appended:
                advanced.append((seq, num_appended))
            if seq.is_pooling and item.reaches_end:
                reason = "stop"  # the whole prompt is read: its vector is made
            if reason is not None:
                self.finish(seq, reason)
        self.kv_cache.save_to_disk()
        return advanced

    def offer_drafts(self, out: SchedulerOutput, drafts: list[list[int]]) -> None:
        """The model's own drafts for each scheduled sequence's next step (a multi-token-
        prediction block's), for the proposer to offer then."""
        for item, proposed in zip(out.scheduled, drafts, strict=True):
            if proposed and not item.seq.is_finished:
                self.proposer.offer(item.seq, proposed)

    def _append_until_stop(self, seq: Sequence,
                           token_ids: list[int]) -> tuple[int, FinishReason | None]:
        """Append one token at a time; those after the first that ends the sequence are dropped."""
        for n, token_id in enumerate(token_ids, 1):
            seq.append_token(token_id)
            reason = seq.token_stop_reason(self.config.max_model_len)
            if reason is not None:
                return n, reason
        return len(token_ids), None

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
        if self.states is not None:
            self.states.free(seq)
        self._store_checkpoints(seq)
        if self.proposer is not None:
            self.proposer.forget(seq)
        self._finished.append(seq)

    def take_finished(self) -> list[Sequence]:
        """The sequences finished since the last call."""
        finished, self._finished = self._finished, []
        return finished

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, seq.num_computed_tokens,
                            min(seq.num_tokens - seq.num_computed_tokens, budget))
            if not self._allocate_or_preempt(seq, n, out):
                break  # seq itself left: everything after it already was preempted
            self._plan_checkpoint(seq, seq.num_computed_tokens, n, out)
            out.scheduled.append(ScheduledSequence(seq, seq.num_computed_tokens, n))
            budget -= n
            i += 1
        return budget

    def _add_drafts(self, out: SchedulerOutput, budget: int) -> None:
        """Speculate with what the step leaves over: the token budget no decode or prompt chunk
        wanted and blocks that are free, so speculation never delays or preempts anyone. How
        many drafts, if any, is plan_drafts' choice from the step cost and each sequence's
        acceptance; a proposal left unverified is shadow-checked."""
        max_batch = self.config.speculative_disable_by_batch_size
        if budget <= 0 or (max_batch is not None and len(self.running) > max_batch):
            return
        # A sequence whose states this step copies to a checkpoint reads no drafts: the copy
        # must hold its states at the block boundary, not past tokens it has not accepted.
        items = [item for item in out.scheduled if item.num_new_tokens == 1 and item.samples
                 and item.seq.pending_checkpoint is None]
        proposals = [self._propose(item.seq, budget) for item in items]
        if not any(proposals):
            return
        candidates = [DraftCandidate(self.proposer.acceptance(item.seq), len(drafts))
                      for item, drafts in zip(items, proposals, strict=True)]
        plan = plan_drafts(self.step_cost, out.num_batched_tokens,
                           sum(1 for item in out.scheduled if item.samples), candidates, budget)
        self.drafting.record(plan)
        for item, drafts, num in zip(items, proposals, plan.num_drafts, strict=True):
            if num and self.kv_cache.allocate_slots(item.seq, 1 + num):
                item.spec_token_ids = drafts[:num]
                item.num_new_tokens += num
            elif drafts:
                item.shadow_draft = drafts[0]

    def _propose(self, seq: Sequence, max_drafts: int) -> list[int]:
        """Drafts for a decoding sequence, never more than max_tokens or the context leave room
        for (a bonus token comes on top of them)."""
        limit = min(max_drafts, self.config.max_model_len - seq.num_tokens - 1)
        if seq.params.max_tokens is not None:
            limit = min(limit, seq.params.max_tokens - seq.num_output_tokens - 1)
        return self.proposer.propose(seq, limit)

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
        """Recompute later: free the blocks now; the prefix cache usually brings them back. A
        recurrent state is dropped with its slot: the sequence restarts from its latest
        checkpoint if the prefix cache still has it and its blocks, else from its first
        token."""
        self.kv_cache.free(seq)
        if self.states is not None:
            self.states.free(seq)
        self._store_checkpoints(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if self.states is not None and not self.states.can_allocate():
                break
            seq = self.waiting[0]
            computed = self.kv_cache.get_computed_blocks(seq)
            num_hit = computed.num_tokens
            n = self._chunk(seq, num_hit, min(seq.num_tokens - num_hit, budget))
            if not self.kv_cache.allocate_slots(seq, n, computed):
                break
            self.waiting.popleft()
            if self.states is not None:
                self.states.allocate(seq)
            if computed.checkpoint_slot is not None:
                out.restore_states.append((computed.checkpoint_slot, seq.state_slot))
            seq.num_computed_tokens = num_hit
            self._plan_checkpoint(seq, num_hit, n, out)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_hit
                self.kv_cache.record_prefix_query(seq.num_tokens, num_hit)
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_hit, n))
            budget -= n
        return budget

    # Recurrent state checkpoints (pagoda.engine.core.checkpoint_store): where a model has
    # recurrent layers, a prompt's states are kept at its last block boundary, and a running
    # sequence's at the latest boundary it reached, so a later prompt sharing the prefix (a
    # chat's next turn, the same system prompt) starts there instead of at its first token.

    def _checkpoints_wanted(self, seq: Sequence) -> bool:
        return self.kv_cache.checkpoints is not None and not seq.is_pooling

    def _last_boundary(self, seq: Sequence) -> int:
        """The last block boundary at or before the sequence's end."""
        return seq.num_tokens // self.kv_cache.block_size * self.kv_cache.block_size

    def _chunk(self, seq: Sequence, start: int, n: int) -> int:
        """n tokens from `start`, ended at the sequence's last block boundary when they would
        pass it, so that the states there can be copied out after the step; the rest (less than
        a block) comes in the next step. Never ending inside an image (image_spans.chunk_end)."""
        if seq.images:
            n = chunk_end(seq.images, start, n)
        if not self._checkpoints_wanted(seq):
            return n
        boundary = self._last_boundary(seq)
        return boundary - start if start < boundary < start + n else n

    def _plan_checkpoint(self, seq: Sequence, start: int, n: int, out: SchedulerOutput) -> None:
        """Order the copy of the sequence's states into a checkpoint slot after this step when
        it ends at the sequence's last block boundary: the prompt's end, or a decode reaching a
        new block. No slot to spare (all held by running sequences): no checkpoint."""
        end = start + n
        if (not self._checkpoints_wanted(seq) or end == start or end % self.kv_cache.block_size
                or end != self._last_boundary(seq)):
            return
        store, index = self.kv_cache.checkpoints, end // self.kv_cache.block_size - 1
        if index < len(seq.block_hashes) and store.find(seq.block_hashes[index]) is not None:
            return  # the same prefix checkpointed already (a repeated prompt)
        slot = store.allocate()
        if slot is None:
            return
        seq.pending_checkpoint = Checkpoint(slot, end, prompt_end=not seq.num_output_tokens)
        out.save_states.append((seq.state_slot, slot))

    def _keep_checkpoint(self, seq: Sequence) -> None:
        """After the step copied it: a prompt's checkpoint is findable at once (the blocks before
        it are registered), a decode's replaces the sequence's latest, kept until it stops."""
        new, seq.pending_checkpoint = seq.pending_checkpoint, None
        if new.prompt_end:
            self.kv_cache.commit_checkpoint(seq, new)
            return
        if seq.checkpoint is not None:
            self.kv_cache.checkpoints.release(seq.checkpoint.slot)
        seq.checkpoint = new

    def _store_checkpoints(self, seq: Sequence) -> None:
        """A sequence that stops (finish, abort, preemption) leaves its latest checkpoint in the
        store; one whose copy a step still has to make is dropped."""
        store = self.kv_cache.checkpoints
        if store is None:
            return
        if seq.pending_checkpoint is not None:
            store.release(seq.pending_checkpoint.slot)
            seq.pending_checkpoint = None
        if seq.checkpoint is not None:
            self.kv_cache.commit_checkpoint(seq, seq.checkpoint)
            seq.checkpoint = None
