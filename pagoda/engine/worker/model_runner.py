"""Owns every tensor: the weights, the KV cache, each step's flat inputs, and sampling."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field, replace

import torch

from pagoda.engine.config import EngineConfig
from pagoda.engine.core.kv_cache_manager import KVCacheGroup
from pagoda.engine.core.scheduler import ScheduledSequence, SchedulerOutput
from pagoda.engine.core.sequence import NULL_BLOCK, Sequence
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.recurrent_mixer import STATE_DTYPE, state_bytes
from pagoda.engine.loading.loader import LoadedModel
from pagoda.engine.loading.model_info import available_memory
from pagoda.engine.models.architecture import ModelShape
from pagoda.engine.models.decoder import DecoderForCausalLM, RecurrentStep
from pagoda.engine.models.kv_cache_sizing import (
    blocks_and_slots,
    kv_cache_dtype,
    mtp_scratch_blocks_per_row,
    split_checkpoint_budget,
    split_kv_budget,
    split_state_budget,
    window_blocks_wanted,
)
from pagoda.engine.models.memory import release_freed_memory, zeroed_host_tensor
from pagoda.engine.models.registry import architecture_of
from pagoda.engine.models.vision_dtype import vision_dtype
from pagoda.engine.models.vision_tower import image_tower
from pagoda.engine.structured_output.matcher import GrammarRows, GrammarState
from pagoda.engine.worker.image_inputs import (
    ImageRows,
    KeptImages,
    embed_images,
    image_rows,
    images_among,
    within_images,
)
from pagoda.engine.worker.kernel_placement import place_kernels
from pagoda.engine.worker.logprobs import LogprobsRequest, SampledLogprobs, StepLogprobs
from pagoda.engine.worker.mrope_positions import chunk_positions, position_offset
from pagoda.engine.worker.pooler import PoolingChunk, pool_chunks
from pagoda.engine.worker.rejection_sampler import RejectionSampler
from pagoda.engine.worker.sampler import Sampler, SamplingMetadata, SamplingRow
from pagoda.kernels.attention_metadata import (
    AttentionMetadata,
    DecodeGroup,
    PrefillSegment,
    TritonAttentionMetadata,
    choose_num_kv_splits,
)
from pagoda.kernels.recurrent_metadata import RecurrentMetadata, RecurrentSegment

logger = logging.getLogger(__name__)


# Decodes are attended in groups of similar length, since each group pads to its longest.
_MAX_DECODE_GROUPS = 4
_GROUP_LENGTH_RATIO = 0.75
# GPU memory kept out of the KV pool for cuBLAS workspaces, CUDA graphs and fragmentation.
_GPU_RESERVE_BYTES = 512 << 20


@dataclass(slots=True)
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata | TritonAttentionMetadata
    logits_indices: torch.Tensor
    sampling_rows: list[SamplingRow]
    sampling_order: list[int]  # scheduler index of each sampling sequence
    # Per sampling sequence, the drafts its rows verify; None when no sequence speculates.
    draft_token_ids: list[list[int]] | None
    # Constrained sequences: (first logits row, grammar, drafts), and the index of their run.
    grammar_entries: list[tuple[int, GrammarState, list[int]]]
    grammar_runs: list[int]
    logprobs_requests: list[LogprobsRequest]  # `order` is the index among sampling sequences
    # Prompt chunks whose logprobs were asked for: their rows follow the sampling rows in the
    # logits (`order` is the scheduler index), and the tokens those rows predict.
    prompt_requests: list[LogprobsRequest]
    prompt_targets: list[list[int]]
    # The chunks of pooling sequences, whose final hidden states are summed (pagoda.engine.worker.pooler).
    pooling_chunks: list[PoolingChunk]
    # Each sequence's state slot, where the model has recurrent layers.
    recurrent: RecurrentMetadata | None = None
    # The rows of the step's prompt chunks that are images' placeholders.
    images: list[ImageRows] = field(default_factory=list)
    # The scheduler index of each item, in the flat batch's order.
    flat_order: list[int] = field(default_factory=list)


@dataclass(slots=True)
class RunnerOutput:
    """Per scheduled sequence: its new tokens (none mid-prefill; after speculation, the kept
    drafts and one more) and, where its request asked, their logprobs."""

    sampled: list[list[int]]
    logprobs: list[list[SampledLogprobs] | None]
    # Per scheduled sequence asking for prompt logprobs: the position of the first prompt token
    # this step scored, and each scored token's logprobs.
    prompt_logprobs: list[tuple[int, list[SampledLogprobs]] | None] | None = None
    # Per scheduled sequence, where the model drafts with its multi-token-prediction block:
    # the drafts for its next step (none for a sequence that sampled nothing), and the seconds
    # the block's chained passes took (those after its first draft).
    drafts: list[list[int]] | None = None
    draft_seconds: float = 0.0


@dataclass(slots=True)
class RecentSeconds:
    """A recent average of some work's seconds a step (each new one weighs a tenth)."""

    mean: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.mean = seconds if not self.count else 0.9 * self.mean + 0.1 * seconds
        self.count += 1


def group_by_length(lengths: list[int]) -> list[tuple[int, int]]:
    """Split lengths sorted longest first into [start, end) runs that pad little."""
    groups: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(lengths)):
        if (lengths[i] < lengths[start] * _GROUP_LENGTH_RATIO
                and len(groups) < _MAX_DECODE_GROUPS - 1):
            groups.append((start, i))
            start = i
    if lengths:
        groups.append((start, len(lengths)))
    return groups


def _causal_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int,
                 also: torch.Tensor | None = None) -> torch.Tensor:
    """True where a query attends a key: not after it (or where `also` says: an image's tokens
    see each other), and inside the window (0: no window)."""
    mask = key_pos <= query_pos
    if also is not None:
        mask |= also
    if window:
        mask &= key_pos > query_pos - window
    return mask


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: EngineConfig,
                 release_weights: bool = False) -> None:
        """release_weights: the model takes loaded.weights over, emptying it as it goes."""
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = config.dtype
        placement = place_kernels(config, loaded.weights)
        ops = placement.ops
        self.model = DecoderForCausalLM(architecture_of(loaded.config), loaded.config,
                                        loaded.weights, placement, release_weights,
                                        with_mtp=config.num_speculative_tokens > 0)
        # A multimodal model's image side, where Pagoda runs its images (None: text only), in
        # its own dtype: its output joins the language model's in the compute dtype.
        self.image_tower = (None if loaded.multimodal_config is None else image_tower(
            loaded.multimodal_config, loaded.vision_weights,
            replace(placement, dtype=vision_dtype(config.vision_dtype, self.device, self.dtype))))
        # Whether positions are multimodal RoPE's (Qwen2.5-VL): those of a sequence with images
        # then run behind its token indices (pagoda.engine.worker.mrope_positions).
        self.multimodal_rope = any(tables.position_rows is not None
                                   for tables in self.model.rotary.values())
        # Images a prefill chunk ended inside, encoded once for all their chunks.
        self.kept_images = KeptImages()
        self.kv_dtype = self._kv_dtype(ops.name)
        # The context this engine allows: the setting, within what the model was trained for.
        self.max_model_len = min(config.max_model_len or 1 << 62,
                                 self.model.shape.max_position_embeddings)
        # Chosen once: the Triton kernels read the flat varlen layout, the torch path groups.
        self._attention_metadata = (self._triton_metadata if ops.name == "triton"
                                    else self._grouped_metadata)
        self.block_size = config.block_size
        # (attention window, layers) of each KV cache group, and each group's pool.
        self.kv_layout = kv_cache_layout(self.model.shape)
        # One slot of every recurrent layer's states (0 for a model of attention layers only).
        self.bytes_per_state_slot = sum(state_bytes(layer.mixer) for layer in self.model.layers
                                        if layer.mixer is not None)
        # Checkpoints of them at block boundaries, for the prefix cache (0 with it off).
        self.keeps_checkpoints = bool(self.bytes_per_state_slot) and config.enable_prefix_caching
        self.kv_cache_groups, self.num_state_slots, self.num_checkpoint_slots = (
            self._kv_cache_groups())
        # The blocks of the group that keeps every block: the context the cache holds.
        self.num_blocks = self.kv_cache_groups[0].num_blocks
        self.kv_caches = self._allocate_kv_cache()
        # The multi-token-prediction block's keys and values, in the first group's blocks and
        # scratch blocks of its chained drafts' after them; whether it runs (the engine stops
        # it where its drafts do not pay), how many drafts it makes a step (the engine's
        # choice), and its time: its pass over the step's positions, and each chained pass.
        self.mtp_scratch_blocks_per_row = mtp_scratch_blocks_per_row(config)
        self.mtp_kv = self._allocate_mtp_kv() if self.model.mtp is not None else None
        self.drafts_with_mtp = self.mtp_kv is not None
        self.num_mtp_drafts = config.num_speculative_tokens
        self.mtp_seconds = RecentSeconds()
        self.mtp_chain_seconds = RecentSeconds()
        self.recurrent_states = self._allocate_recurrent_states()
        self.sampler = Sampler(ops.row_argmax)
        self.rejection_sampler = RejectionSampler(ops.row_argmax)
        self.vocab_size = self.model.shape.vocab_size
        self.graphs = self._capture_graphs() if self._uses_cuda_graphs() else None

    def _kv_dtype(self, ops_name: str) -> torch.dtype:
        dtype = kv_cache_dtype(self.config)
        if dtype != self.dtype and ops_name != "torch":
            raise ValueError(
                f"EngineConfig.kv_cache_dtype={self.config.kv_cache_dtype!r} differs from the "
                f"compute dtype ({self.dtype}), which the {ops_name} kernels read the cache in: "
                "leave kv_cache_dtype at 'auto', or set dtype to it")
        return dtype

    def bytes_per_block(self, layers: tuple[int, ...] | None = None) -> int:
        """A block's bytes over these layers (all that hold a KV cache when None), each at its
        own KV heads and head size."""
        s = self.model.shape
        if layers is None:  # a layer that reads an earlier layer's cache holds none
            layers = tuple(i for i in range(s.num_layers) if s.holds_kv(i))
        floats = s.kv_floats(layers)
        return 2 * self.block_size * floats * self.kv_dtype.itemsize

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        """Run one step: per scheduled sequence its new tokens (none mid-prefill, one sampled
        token, or after speculation the kept drafts and the model's next token)."""
        # Restored before and saved after the forward, so a checkpoint slot that this step
        # both reads (a prefix hit) and reuses (evicted for a new checkpoint) is read first.
        self.copy_states(sched.restore_states)
        inputs = self.prepare_inputs(sched.scheduled)
        logits, hidden = self._forward(inputs)
        sampled: list[list[int]] = [[] for _ in sched.scheduled]
        out = RunnerOutput(sampled, [None] * len(sched.scheduled))
        if inputs.prompt_requests:
            num_sampling = len(inputs.sampling_rows)
            out.prompt_logprobs = self._prompt_logprobs(logits[num_sampling:], inputs,
                                                        len(sched.scheduled))
            logits = logits[:num_sampling]
        if inputs.sampling_rows:
            runs, logprobs = self._sample(logits.float(), inputs)
            for n, (idx, run) in enumerate(zip(inputs.sampling_order, runs, strict=True)):
                sampled[idx] = run
                out.logprobs[idx] = logprobs[n]
        # Checkpoints are saved from settled states: never from one past a rejected draft.
        self._settle_verified_states(inputs, sched.scheduled, sampled)
        self.copy_states(sched.save_states)
        if self.drafts_with_mtp and hidden is not None:
            began = time.perf_counter()
            out.drafts, out.draft_seconds = self._mtp_drafts(inputs, hidden, sched.scheduled,
                                                             sampled)
            self.mtp_seconds.observe(time.perf_counter() - began - out.draft_seconds)
            passes = max(map(len, out.drafts)) - 1
            if passes > 0:  # a step without chained passes says nothing of their cost
                self.mtp_chain_seconds.observe(out.draft_seconds / passes)
        return out

    def _mtp_drafts(self, inputs: ModelInputs, hidden: torch.Tensor,
                    scheduled: list[ScheduledSequence],
                    sampled: list[list[int]]) -> tuple[list[list[int]], float]:
        """Run the multi-token-prediction block over the step's positions (each with the token
        that follows it: the sequence's next one, or from its sampled run; 0 after a rejected
        draft, whose keys the next step overwrites) and draft, for each sequence that sampled,
        the token after its run from the position before the run's last token, then chain the
        block for the drafts after it (up to num_mtp_drafts in all). Returns the drafts, and
        the seconds the chained passes took."""
        next_ids, rows, flat = [], [], 0
        for i in inputs.flat_order:
            item, run = scheduled[i], sampled[i]
            seq, start = item.seq, item.num_computed_tokens
            last = seq.num_tokens - 1  # before this step's tokens are appended
            for p in range(start, start + item.num_new_tokens):
                j = p - last
                next_ids.append(seq.all_token_ids[p + 1] if j < 0
                                else run[j] if j < len(run) else 0)
            if run:
                rows.append((i, flat + last - start + len(run) - 1))
            flat += item.num_new_tokens
        mtp = self.model.mtp
        normed = mtp.hidden_states(self.model, self._tensor(next_ids), inputs.positions, hidden,
                                   inputs.attn, self.mtp_kv)
        drafts: list[list[int]] = [[] for _ in scheduled]
        if not rows:
            return drafts, 0.0
        carried = normed[self._tensor([row for _, row in rows])]
        first = mtp.draft(self.model, carried)
        for (i, _), token in zip(rows, first.tolist(), strict=True):
            drafts[i] = [token]
        began = time.perf_counter()
        self._chain_drafts([(scheduled[i].seq, len(sampled[i])) for i, _ in rows], carried,
                           first, [drafts[i] for i, _ in rows])
        return drafts, time.perf_counter() - began

    def _chain_drafts(self, rows: list[tuple[Sequence, int]], carried: torch.Tensor,
                      tokens: torch.Tensor, drafts: list[list[int]]) -> None:
        """Append to each row's drafts the block's chained ones. rows: each sequence and the
        tokens its step appends (it is n tokens long after them, the first draft its token n);
        pass j (from 2) runs at position n + j - 3 on the previous pass's output and draft,
        its keys written there (past the sequence's blocks, into the row's scratch blocks); a
        row stops at the context's end."""
        scratch, first = self.mtp_scratch_blocks_per_row, self.num_blocks
        tables = [seq.block_ids + list(range(first + r * scratch, first + (r + 1) * scratch))
                  for r, (seq, _) in enumerate(rows)]
        lengths = [seq.num_tokens + appended for seq, appended in rows]
        active = list(range(len(rows)))
        for j in range(2, self.num_mtp_drafts + 1):
            keep = [a for a, r in enumerate(active) if lengths[r] + j - 3 < self.max_model_len]
            if not keep:
                return
            if len(keep) < len(active):
                index = self._tensor(keep)
                carried, tokens, active = carried[index], tokens[index], [active[a] for a in keep]
            queries = [ScheduledSequence(rows[r][0], lengths[r] + j - 3, 1) for r in active]
            meta = self._chain_metadata(queries, [tables[r] for r in active])
            positions = self._tensor([q.num_computed_tokens for q in queries])
            carried = self.model.mtp.chained(self.model, tokens, positions, carried, meta,
                                             self.mtp_kv)
            tokens = self.model.mtp.draft(self.model, carried)
            for r, token in zip(active, tokens.tolist(), strict=True):
                drafts[r].append(token)

    def _chain_metadata(self, queries: list[ScheduledSequence], tables: list[list[int]]
                        ) -> AttentionMetadata | TritonAttentionMetadata:
        """A chained pass's attention, full (the block's layer is): one query per sequence,
        over the block's keys before it and its own, in `tables`."""
        bs = self.block_size
        slots = [table[q.num_computed_tokens // bs] * bs + q.num_computed_tokens % bs
                 for q, table in zip(queries, tables, strict=True)]
        if self.model.ops.name == "triton":
            return self._triton_group_metadata(queries, slots, tables, 0)
        spans = group_by_length([q.num_computed_tokens + 1 for q in queries])
        return AttentionMetadata(self._tensor(slots), self._decode_groups(
            queries, tables, [0] * len(queries), 0, spans))

    def _settle_verified_states(self, inputs: ModelInputs, scheduled: list[ScheduledSequence],
                                sampled: list[list[int]]) -> None:
        """Leave each sequence that verified drafts with its recurrent states after its last
        token and the drafts it kept (its run: those and one token more, whose own state the
        next step computes), not after the rejected ones that its forward also read."""
        if inputs.recurrent is None or not inputs.recurrent.kept:
            return
        inputs.recurrent.kept.settle({item.seq.state_slot: len(run) for item, run
                                      in zip(scheduled, sampled, strict=True)
                                      if item.spec_token_ids})

    def _forward(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's logits (the rows of logits_indices), and the last layer's output at every
        token (None from a CUDA graph, which keeps only logits); pooling chunks' hidden states
        are summed on the way, so a step with any runs eagerly."""
        if (self.graphs is not None and not inputs.pooling_chunks and not inputs.images
                and self.graphs.can_run(inputs.attn)):
            return self.graphs.run(inputs.input_ids, inputs.positions, inputs.attn,
                                   inputs.logits_indices), None
        hidden = self.model.hidden_states(inputs.input_ids, inputs.positions, inputs.attn,
                                          self.kv_caches, self.recurrent_step(inputs),
                                          self.image_embeddings(inputs))
        pool_chunks(hidden, inputs.pooling_chunks, self.model.final_norm)
        return self.model.compute_logits(hidden[inputs.logits_indices]), hidden

    def image_embeddings(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's images encoded: (rows of the batch, their embeddings), or None."""
        if not inputs.images:
            return None
        return embed_images(self.image_tower, inputs.images, self.device, self.kept_images)

    def recurrent_step(self, inputs: ModelInputs) -> RecurrentStep | None:
        """What the recurrent layers read this step: the slots and the states themselves."""
        if inputs.recurrent is None:
            return None
        return RecurrentStep(inputs.recurrent, self.recurrent_states)

    def _prompt_logprobs(self, logits: torch.Tensor, inputs: ModelInputs, num_scheduled: int
                         ) -> list[tuple[int, list[SampledLogprobs]] | None]:
        step = StepLogprobs(logits, inputs.prompt_requests)
        targets: list[list[int]] = [[] for _ in range(num_scheduled)]
        for request, tokens in zip(inputs.prompt_requests, inputs.prompt_targets, strict=True):
            targets[request.order] = tokens
        scored = step.for_runs(targets, num_scheduled)
        firsts = {r.order: r.first_position for r in inputs.prompt_requests}
        return [None if entries is None else (firsts[i], entries)
                for i, entries in enumerate(scored)]

    def _sample(self, logits: torch.Tensor, inputs: ModelInputs
                ) -> tuple[list[list[int]], list[list[SampledLogprobs] | None]]:
        """Each sampling sequence's run, and its logprobs where asked; constrained sequences'
        grammars advance past their runs."""
        grammar = None
        if inputs.grammar_entries:
            grammar = GrammarRows.build(inputs.grammar_entries, self.vocab_size, self.device)
        meta = SamplingMetadata.build(inputs.sampling_rows, self.vocab_size, self.device, grammar)
        # Taken before sampling, which changes the logits in place.
        step_logprobs = (StepLogprobs(logits, inputs.logprobs_requests)
                         if inputs.logprobs_requests else None)
        if inputs.draft_token_ids is None:
            runs = [[token] for token in self.sampler(logits, meta).tolist()]
        else:
            runs = self.rejection_sampler(logits, meta, inputs.draft_token_ids)
        for (_, state, _), run_index in zip(inputs.grammar_entries, inputs.grammar_runs,
                                            strict=True):
            state.accept(runs[run_index])
        if step_logprobs is None:
            return runs, [None] * len(runs)
        return runs, step_logprobs.for_runs(runs, len(runs))

    def prepare_inputs(self, scheduled: list[ScheduledSequence]) -> ModelInputs:
        """Flatten the step: decodes (longest context first), then prefill chunks and
        speculating sequences (their last token and drafts, attended like a prefill chunk)."""
        decode_idx = sorted((i for i, s in enumerate(scheduled) if s.num_new_tokens == 1),
                            key=lambda i: -scheduled[i].num_computed_tokens)
        order = decode_idx + [i for i, s in enumerate(scheduled) if s.num_new_tokens > 1]
        items = [scheduled[i] for i in order]
        input_ids, positions, slots = [], [], []
        logits_indices, rows, sampling_order, drafts = [], [], [], []
        grammar_entries, grammar_runs, logprobs_requests = [], [], []
        prompt_indices, prompt_requests, prompt_targets = [], [], []
        pooling_chunks, images, grid_positions = [], [], []
        for i, s in zip(order, items, strict=True):
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            spec = s.spec_token_ids
            input_ids.extend(s.seq.all_token_ids[start:end - len(spec)])
            input_ids.extend(spec)
            if self.multimodal_rope and s.seq.images:
                grid_positions += self._image_positions(s.seq, start, end, positions)
            else:
                positions.extend(range(start, end))
            slots.extend(self._slots(s.seq.block_ids, start, end))
            if s.seq.images:
                images += image_rows(s.seq.images, start, end, len(input_ids) - (end - start))
            if s.seq.is_pooling:
                pooling_chunks.append(PoolingChunk(s.seq, start, len(input_ids) - (end - start),
                                                   end - start))
            scored = _scored_prompt_positions(s.seq, start, end)
            if scored:
                first_flat = len(input_ids) - (end - start)
                prompt_requests.append(LogprobsRequest(
                    i, len(prompt_indices), len(scored), s.seq.params.prompt_logprobs,
                    scored[0] + 1))
                prompt_indices.extend(first_flat + p - start for p in scored)
                prompt_targets.append([s.seq.prompt_token_ids[p + 1] for p in scored])
            if s.samples:
                logits_indices.extend(range(len(input_ids) - len(spec) - 1, len(input_ids)))
                if s.seq.grammar is not None:
                    grammar_entries.append((len(rows), s.seq.grammar, spec))
                    grammar_runs.append(len(sampling_order))
                if s.seq.params.logprobs is not None:
                    logprobs_requests.append(LogprobsRequest(
                        len(sampling_order), len(rows), len(spec) + 1, s.seq.params.logprobs))
                rows.extend(_sampling_rows(s.seq, spec))
                sampling_order.append(i)
                drafts.append(spec)
        attn = self._attention_metadata(items, len(decode_idx), slots)
        speculates = any(drafts)
        return ModelInputs(self._tensor(input_ids),
                           self._positions_tensor(positions, grid_positions), attn,
                           self._tensor(logits_indices + prompt_indices), rows, sampling_order,
                           drafts if speculates else None, grammar_entries, grammar_runs,
                           logprobs_requests, prompt_requests, prompt_targets, pooling_chunks,
                           self._recurrent_metadata(items, len(decode_idx)), images,
                           order)

    @staticmethod
    def _image_positions(seq: Sequence, start: int, end: int,
                         positions: list[int]) -> list[tuple[int, torch.Tensor]]:
        """Multimodal RoPE: tokens start..end of a sequence with images at their positions
        (pagoda.engine.worker.mrope_positions), appended to `positions` (the time row); where
        the chunk holds an image's tokens, its three rows at its first row of the batch."""
        rows = chunk_positions(seq.images, start, end)
        if rows is None:
            offset = position_offset(seq.images, start)
            positions.extend(range(start + offset, end + offset))
            return []
        positions.extend(rows[0].tolist())
        return [(len(positions) - (end - start), rows)]

    def _positions_tensor(self, positions: list[int],
                          grids: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """The step's positions: one row, or three (time, row, column) where an image's tokens
        are among them, every other token's three equal."""
        if not grids:
            return self._tensor(positions)
        rows = torch.tensor(positions, dtype=torch.long).repeat(3, 1)
        for first, grid in grids:
            rows[:, first:first + grid.shape[1]] = grid
        return rows.to(self.device)

    def _recurrent_metadata(self, items: list[ScheduledSequence],
                            num_decodes: int) -> RecurrentMetadata | None:
        """Each item's state slot, in the flat batch's order; a run that starts its sequence
        (position 0: its first chunk, or its first after a preemption) starts from zeros."""
        if not self.recurrent_states:
            return None
        decodes = [s.seq.state_slot for s in items[:num_decodes]]
        assert None not in decodes, "a running sequence holds a state slot"
        # A one-token prompt (or chunk) at position 0 rides with the decodes, which read their
        # slot: it is zeroed here, so that it starts from nothing as a fresh segment does.
        fresh = [s.seq.state_slot for s in items[:num_decodes] if s.num_computed_tokens == 0]
        if fresh:
            for states in self.recurrent_states:
                for state in states or ():
                    state[fresh] = 0
        prefills, start = [], num_decodes
        for s in items[num_decodes:]:
            assert s.seq.state_slot is not None, "a running sequence holds a state slot"
            prefills.append(RecurrentSegment(start, start + s.num_new_tokens, s.seq.state_slot,
                                             s.num_computed_tokens == 0,
                                             verifies=bool(s.spec_token_ids)))
            start += s.num_new_tokens
        return RecurrentMetadata(num_decodes, self._tensor(decodes), prefills)

    def _grouped_metadata(self, items: list[ScheduledSequence], num_decodes: int,
                          slots: list[int]) -> AttentionMetadata:
        """The step's metadata for the first KV cache group, with one for each other group
        (its window's mask, block tables and slots; `AttentionMetadata.for_window`)."""
        # Every group's decodes in the same runs, by the whole context (the C step's rule).
        spans = group_by_length([s.num_computed_tokens + 1 for s in items[:num_decodes]])
        metas = []
        for g, (window, _) in enumerate(self.kv_layout):
            if g == 0:
                tables, skipped = [s.seq.block_ids for s in items], [0] * len(items)
                slot_mapping = self._tensor(slots)
            else:
                tables, skipped = self._window_tables(items, g, window)
                slot_mapping = self._tensor(self._group_slots(items, tables, skipped))
            metas.append(AttentionMetadata(
                slot_mapping, self._decode_groups(items[:num_decodes], tables[:num_decodes],
                                                  skipped[:num_decodes], window, spans),
                self._prefill_segments(items[num_decodes:], tables[num_decodes:],
                                       skipped[num_decodes:], num_decodes, window), window))
        metas[0].windowed = {meta.sliding_window: meta for meta in metas[1:]}
        return metas[0]

    def _window_tables(self, items: list[ScheduledSequence], group: int,
                       window: int) -> tuple[list[list[int]], list[int]]:
        """Each item's table in a windowed group from the first block its step attends (the
        blocks before it are released), and how many positions that skips: the step's keys are
        counted from there, as attention depends on positions only through RoPE, applied before
        keys are cached."""
        bs = self.block_size
        tables, skipped = [], []
        for s in items:
            first = max(0, s.num_computed_tokens - window + 1) // bs
            tables.append(s.seq.windowed_block_ids[group - 1][first:])
            skipped.append(first * bs)
        return tables, skipped

    def _group_tables(self, items: list[ScheduledSequence], group: int) -> list[list[int]]:
        """Each item's whole block table in a KV cache group; a windowed group's released
        blocks read as block 0, which the window never attends."""
        if group == 0:
            return [s.seq.block_ids for s in items]
        return [[0 if b == NULL_BLOCK else b for b in s.seq.windowed_block_ids[group - 1]]
                for s in items]

    def _group_slots(self, items: list[ScheduledSequence], tables: list[list[int]],
                     skipped: list[int]) -> list[int]:
        slots = []
        for s, table, skip in zip(items, tables, skipped, strict=True):
            start = s.num_computed_tokens - skip
            slots.extend(self._slots(table, start, start + s.num_new_tokens))
        return slots

    def _triton_metadata(self, items: list[ScheduledSequence], num_decodes: int,
                         slots: list[int]) -> TritonAttentionMetadata:
        """The step's varlen metadata for the first KV cache group, with one for each other
        group (its window, block tables and slots; `TritonAttentionMetadata.for_window`)."""
        meta = self._triton_group_metadata(items, slots, self._group_tables(items, 0),
                                           self.kv_layout[0][0])
        for g, (window, _) in enumerate(self.kv_layout[1:], 1):
            tables = self._group_tables(items, g)
            meta.windowed[window] = replace(
                meta, slot_mapping=self._tensor(self._group_slots(items, tables,
                                                                  [0] * len(items))),
                block_tables=self._int32([_padded(t, meta.block_tables.shape[1])
                                          for t in tables]),
                sliding_window=window, windowed={})
        return meta

    def _triton_group_metadata(self, items: list[ScheduledSequence], slots: list[int],
                               tables: list[list[int]], window: int) -> TritonAttentionMetadata:
        query_lens = [s.num_new_tokens for s in items]
        seq_lens = [s.num_computed_tokens + s.num_new_tokens for s in items]
        width = -(-max(seq_lens) // self.block_size)
        query_start_loc = [0]
        for n in query_lens:
            query_start_loc.append(query_start_loc[-1] + n)
        max_query_len = max(query_lens)
        splits = 1
        if max_query_len == 1 and self.device.type == "cuda":
            splits = choose_num_kv_splits(len(items), self.model.shape.num_kv_heads,
                                          max(seq_lens), self._num_sms)
        return TritonAttentionMetadata(
            slot_mapping=self._tensor(slots),
            query_start_loc=self._int32(query_start_loc),
            seq_lens=self._int32(seq_lens),
            block_tables=self._int32([_padded(t, width) for t in tables]),
            max_query_len=max_query_len, max_seq_len=max(seq_lens), num_kv_splits=splits,
            sliding_window=window)

    def _slots(self, block_ids: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_ids[p // bs] * bs + p % bs for p in range(start, end)]

    def _decode_groups(self, decodes: list[ScheduledSequence], tables: list[list[int]],
                       skipped: list[int], window: int,
                       spans: list[tuple[int, int]]) -> list[DecodeGroup]:
        """skipped: per decode, the positions before its table's first block; spans: the
        [start, end) runs of decodes attended together."""
        bs = self.block_size
        context_lens = [s.num_computed_tokens + 1 - skip
                        for s, skip in zip(decodes, skipped, strict=True)]
        groups = []
        for start, end in spans:
            lens = context_lens[start:end]
            num_blocks = -(-max(lens) // bs)
            group_tables = self._tensor([_padded(t, num_blocks) for t in tables[start:end]])
            groups.append(DecodeGroup(start, end, group_tables,
                                      self._decode_mask(lens, num_blocks, window),
                                      self._tensor(lens)))
        return groups

    def _decode_mask(self, context_lens: list[int], num_blocks: int,
                     window: int) -> torch.Tensor:
        query_pos = self._tensor(context_lens).unsqueeze(1) - 1
        key_pos = torch.arange(num_blocks * self.block_size, device=self.device).unsqueeze(0)
        return _causal_mask(query_pos, key_pos, window).view(len(context_lens), 1, 1, -1)

    def _prefill_segments(self, prefills: list[ScheduledSequence], tables: list[list[int]],
                          skipped: list[int], offset: int, window: int) -> list[PrefillSegment]:
        """skipped: per chunk, the positions before its table's first block."""
        segments = []
        for s, block_ids, skip in zip(prefills, tables, skipped, strict=True):
            start, n = s.num_computed_tokens - skip, s.num_new_tokens
            context_len = start + n
            mask = None
            # An image's tokens also see those after them in the image (Gemma 3); a window
            # still bounds how far back any token sees.
            images = (images_among(s.seq.images, start + skip, context_len + skip)
                      if self.image_tower is not None and self.image_tower.bidirectional
                      else [])
            if start > 0 or (window and context_len > window) or images:
                q_pos = torch.arange(start, context_len, device=self.device).unsqueeze(1)
                k_pos = torch.arange(context_len, device=self.device).unsqueeze(0)
                same = within_images(images, q_pos + skip, k_pos + skip) if images else None
                mask = _causal_mask(q_pos, k_pos, window, same)
            num_blocks = -(-context_len // self.block_size)
            table = self._tensor(block_ids[:num_blocks])
            segments.append(PrefillSegment(offset, offset + n, context_len, table, mask))
            offset += n
        return segments

    def _tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _int32(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def _kv_cache_groups(self) -> tuple[tuple[KVCacheGroup, ...], int, int]:
        """Each KV cache group's pool, the recurrent states' slots for running sequences and
        for checkpoints (0 without recurrent layers), from one budget; the first group keeps
        every block, the others (sliding-window layers beside full-attention ones) only their
        windows'."""
        windows = [window for window, _ in self.kv_layout]
        bytes_per_block = [self.bytes_per_block(layers) for _, layers in self.kv_layout]
        if self.model.mtp is not None:  # its keys live in the first group's blocks
            bytes_per_block[0] += self.bytes_per_block((self.model.arch.mtp_like,))
        if self.device.type == "cuda" and self.config.num_kv_blocks is None:
            counts, slots, checkpoints = self._blocks_from_free_gpu_memory(bytes_per_block,
                                                                           windows)
        else:
            # What the weights left, freed memory given back first so that it counts as available.
            release_freed_memory()
            counts, slots, checkpoints = blocks_and_slots(
                self.config, bytes_per_block, windows, self.bytes_per_state_slot,
                self.max_model_len, available_memory(), self.keeps_checkpoints)
        groups = tuple(KVCacheGroup(n, window if g else 0, size) for g, (n, window, size)
                       in enumerate(zip(counts, windows, bytes_per_block, strict=True)))
        return groups, slots, checkpoints

    def _blocks_from_free_gpu_memory(self, bytes_per_block: list[int],
                                     windows: list[int]) -> tuple[list[int], int, int]:
        """What is left of gpu_memory_utilization x total memory after the weights (already
        loaded), a step's activations and a fixed reserve: the recurrent states' slots first,
        the rest split between the groups."""
        free, total = torch.cuda.mem_get_info(self.device)
        budget = max(0, int(total * self.config.gpu_memory_utilization - (total - free)
                            - self._peak_activation_bytes() - _GPU_RESERVE_BYTES))
        slots = checkpoints = 0
        wanted = [0] + [window_blocks_wanted(w, self.config) for w in windows[1:]]
        if self.bytes_per_state_slot:
            whole = budget
            slots, budget = split_state_budget(budget, self.bytes_per_state_slot,
                                               self.config.max_num_seqs)
            if self.keeps_checkpoints:
                checkpoints = split_checkpoint_budget(whole, budget, self.bytes_per_state_slot,
                                                      bytes_per_block, wanted)
                budget -= checkpoints * self.bytes_per_state_slot
        counts = split_kv_budget(max(0, budget), bytes_per_block, wanted)
        if counts[0] < 1:
            raise ValueError(
                f"EngineConfig.gpu_memory_utilization={self.config.gpu_memory_utilization} leaves "
                f"no room for the KV cache ({free / 2**30:.1f} of {total / 2**30:.1f} GiB free "
                "after loading the weights): raise it, or free GPU memory")
        return counts, slots, checkpoints

    def _peak_activation_bytes(self) -> int:
        """A bound on one step's live tensors: the widest layer intermediates for the token
        budget, and the fp32 logits and sampler copies for every sequence (for each of its
        positions when it speculates)."""
        s = self.model.shape
        mixer_width = max(layer.mixer_linears()[0].out_features for layer in self.model.layers)
        elem = torch.empty((), dtype=self.dtype).element_size()
        width = 4 * s.hidden_size + mixer_width + self.model.mlp_floats_per_row()
        c = self.config
        rows = min(c.max_num_seqs * (1 + c.num_speculative_tokens),
                   max(c.max_num_seqs, c.max_num_batched_tokens))
        logits = rows * s.vocab_size * (elem + 3 * 4)
        return 2 * self.config.max_num_batched_tokens * width * elem + logits

    def _uses_cuda_graphs(self) -> bool:
        # A sparse layer's experts run as many matmuls as the step routes rows to: no fixed
        # graph replays that.
        # Nor does a graph carry recurrent states' slots.
        return (self.device.type == "cuda" and self.model.ops.name == "triton"
                and not self.config.enforce_eager and self.model.arch.moe is None
                and not self.model.arch.has_recurrent_layers)

    def _capture_graphs(self):
        from pagoda.engine.worker.cuda_graphs import DecodeGraphs

        graphs = DecodeGraphs(self.model, self.kv_caches, self.config.max_num_seqs,
                              self.max_model_len, self.block_size, self.device,
                              [window for window, _ in self.kv_layout])
        graphs.capture()
        return graphs

    @functools.cached_property
    def _num_sms(self) -> int:
        return torch.cuda.get_device_properties(self.device).multi_processor_count

    def _allocate_recurrent_states(self) -> list[tuple[torch.Tensor, ...] | None]:
        """Each recurrent layer's state tensors, [slots, *shape] each (None at attention
        layers): the running sequences' slots, then the checkpoints'. Zeros, though a
        sequence's first run never reads them."""
        states: list[tuple[torch.Tensor, ...] | None] = []
        num_slots = self.num_state_slots + self.num_checkpoint_slots
        for layer in self.model.layers:
            if layer.mixer is None:
                states.append(None)
                continue
            states.append(tuple(torch.zeros((num_slots, *shape), dtype=STATE_DTYPE,
                                            device=self.device)
                                for shape in layer.mixer.state_shapes()))
        if self.num_state_slots:
            logger.info("Recurrent states (%d layers): %d slots and %d checkpoints of %.1f KiB "
                        "(%.1f MiB)", sum(1 for st in states if st is not None),
                        self.num_state_slots, self.num_checkpoint_slots,
                        self.bytes_per_state_slot / 2**10,
                        num_slots * self.bytes_per_state_slot / 2**20)
            return states
        return []

    def copy_states(self, copies: list[tuple[int, int]]) -> None:
        """Copy every recurrent layer's states from slot to slot ((source, destination) pairs):
        checkpoints taken and restored."""
        if not copies:
            return
        sources = self._tensor([src for src, _ in copies])
        destinations = self._tensor([dst for _, dst in copies])
        for states in self.recurrent_states:
            for state in states or ():
                state[destinations] = state[sources]

    def _allocate_mtp_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The multi-token-prediction block's key and value blocks, numbered as the first
        group's: a position's block holds its keys in both (counted in its bytes_per_block);
        then each of max_num_seqs rows' scratch blocks for its chained drafts' keys."""
        scratch = self.config.max_num_seqs * self.mtp_scratch_blocks_per_row
        shape = (self.kv_cache_groups[0].num_blocks + scratch, self.block_size,
                 *self.model.shape.kv_heads(self.model.arch.mtp_like))
        if self.device.type == "cpu":
            pool = zeroed_host_tensor((2, *shape), self.kv_dtype)
            return pool[0], pool[1]
        return (torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device))

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Each attention layer's key and value blocks, in its KV cache group's pool (None at
        a recurrent layer)."""
        s = self.model.shape
        caches: list[tuple[torch.Tensor, torch.Tensor]] = [None] * s.num_layers  # type: ignore
        for (window, layers), group in zip(self.kv_layout, self.kv_cache_groups, strict=True):
            shape = (group.num_blocks, self.block_size, *s.kv_heads(layers[0]))
            kind = f"window {window}" if window else "full attention"
            logger.info("KV cache (%d layers, %s): %d blocks of %d tokens, %s (%.0f MiB)",
                        len(layers), kind, group.num_blocks, self.block_size, self.kv_dtype,
                        group.num_blocks * group.bytes_per_block / 2**20)
            # Zeros, not empty: masked-out keys are still multiplied by 0 and NaN * 0 is NaN.
            if self.device.type == "cpu":
                pool = zeroed_host_tensor((len(layers), 2, *shape), self.kv_dtype)
                for i, layer in enumerate(layers):
                    caches[layer] = (pool[i, 0], pool[i, 1])
                continue
            for layer in layers:
                caches[layer] = (torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                                 torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
        # Layers that share an earlier layer's KV cache read (and rewrite) its very tensors.
        return [caches[s.kv_owner(i)] for i in range(s.num_layers)]


def kv_cache_layout(shape: ModelShape) -> list[tuple[int, tuple[int, ...]]]:
    """(attention window, layers) of each KV cache group: one group per window, the first the
    one whose blocks are all kept (the full-attention layers; without any, the widest window's),
    then the other windows narrowest first. A group's layers share one KV shape, its pool's
    (Gemma 4's global layers, of their own head size, are its full-attention group)."""
    distinct = set(shape.windows)
    first = 0 if 0 in distinct else max(distinct)
    windows = [first] + sorted(distinct - {first})
    # A layer that reads an earlier layer's KV cache (Gemma 4's shared ones) has none of its own.
    layout = [(w, tuple(i for i, lw in enumerate(shape.layer_windows)
                        if lw == w and shape.holds_kv(i))) for w in windows]
    for window, layers in layout:
        if len({shape.kv_heads(i) for i in layers}) > 1:
            raise ModelLoadError(
                f"The layers of attention window {window or 'full'} differ in head size or KV "
                "heads, which Pagoda's KV cache does not hold in one group.")
    return layout


def _sampling_rows(seq: Sequence, drafts: list[int]) -> list[SamplingRow]:
    """One row per position that samples: after the last token, then after each draft, whose
    penalties and min_tokens count the drafts before it as output, and where the reasoning
    budget closes the reasoning, with the token it forces (a draft that differs is
    rejected)."""
    params, prompt, output = seq.params, seq.prompt_token_ids, seq.output_token_ids
    generator, eos = _generator(seq), seq.eos_token_ids
    bad_words = seq.bad_words_token_ids
    forced = _forced_tokens(seq, drafts)
    counts_output = params.uses_penalties or bad_words or len(output) < params.min_tokens
    if drafts and counts_output:
        outputs = [output + drafts[:j] for j in range(len(drafts) + 1)]
    elif all(token is None for token in forced):
        return [SamplingRow(params, prompt, output, generator, bad_words, eos)] * len(forced)
    else:
        outputs = [output] * len(forced)
    return [SamplingRow(params, prompt, row_output, generator, bad_words, eos, token)
            for row_output, token in zip(outputs, forced, strict=True)]


def _forced_tokens(seq: Sequence, drafts: list[int]) -> list[int | None]:
    """The token the reasoning budget writes at each position that samples; None where the
    model picks (every position, without a budget)."""
    if seq.reasoning_budget is None:
        return [None] * (len(drafts) + 1)
    return seq.reasoning_budget.forced_tokens(seq.output_token_ids, drafts)


def _scored_prompt_positions(seq: Sequence, start: int, end: int) -> list[int]:
    """The positions of this chunk whose logits score the next prompt token, when the request
    asked for prompt logprobs: all before the prompt's last (whose logits sample)."""
    if seq.params.prompt_logprobs is None:
        return []
    return list(range(start, min(end, seq.num_prompt_tokens - 1)))


def _generator(seq: Sequence) -> torch.Generator | None:
    """A seeded request's generator, made at its first sample and kept on the sequence, so its
    draws continue across steps and do not depend on the other rows."""
    if seq.params.seed is not None and seq.generator is None:
        seq.generator = torch.Generator().manual_seed(seq.params.seed)
    return seq.generator  # type: ignore[return-value]


def _padded(block_ids: list[int], n: int) -> list[int]:
    """The first n block ids, padded with block 0 (masked out) for shorter sequences."""
    return block_ids[:n] + [0] * (n - len(block_ids[:n]))
