"""Owns every tensor: the weights, the KV cache, each step's flat inputs, and sampling."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.loader import LoadedModel
from engine.models.llama import LlamaForCausalLM
from engine.sampler import Sampler, SamplingMetadata, SamplingRow
from engine.scheduler import ScheduledSequence, SchedulerOutput
from kernels.attention_metadata import AttentionMetadata, DecodeGroup, PrefillSegment

logger = logging.getLogger(__name__)


# Decodes are attended in groups of similar length, since each group pads to its longest.
_MAX_DECODE_GROUPS = 4
_GROUP_LENGTH_RATIO = 0.75


@dataclass(slots=True)
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    logits_indices: torch.Tensor
    sampling_rows: list[SamplingRow]
    sampling_order: list[int]  # scheduler index of each logits row


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


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = config.dtype
        self.model = LlamaForCausalLM(loaded.config, loaded.weights, self.device, self.dtype)
        self.block_size = config.block_size
        self.num_blocks = self._num_blocks()
        self.kv_caches = self._allocate_kv_cache()
        self.sampler = Sampler()
        self.vocab_size = self.model.shape.vocab_size

    def bytes_per_block(self) -> int:
        s = self.model.shape
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * s.num_layers * self.block_size * s.num_kv_heads * s.head_dim * elem

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> list[int | None]:
        """Run one step; returns the sampled token per scheduled sequence (None: mid-prefill)."""
        inputs = self.prepare_inputs(sched.scheduled)
        logits = self.model.forward(inputs.input_ids, inputs.positions, inputs.attn,
                                    self.kv_caches, inputs.logits_indices)
        sampled: list[int | None] = [None] * len(sched.scheduled)
        if inputs.sampling_rows:
            meta = SamplingMetadata.build(inputs.sampling_rows, self.vocab_size, self.device)
            tokens = self.sampler(logits.float(), meta).tolist()
            for idx, token in zip(inputs.sampling_order, tokens, strict=True):
                sampled[idx] = token
        return sampled

    def prepare_inputs(self, scheduled: list[ScheduledSequence]) -> ModelInputs:
        """Flatten the step: decodes (longest context first), then prefill chunks."""
        decode_idx = sorted((i for i, s in enumerate(scheduled) if s.num_new_tokens == 1),
                            key=lambda i: -scheduled[i].num_computed_tokens)
        order = decode_idx + [i for i, s in enumerate(scheduled) if s.num_new_tokens > 1]
        items = [scheduled[i] for i in order]
        input_ids, positions, slots = [], [], []
        logits_indices, rows, sampling_order = [], [], []
        for i, s in zip(order, items, strict=True):
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            input_ids.extend(s.seq.all_token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(self._slots(s.seq.block_ids, start, end))
            if s.samples:
                logits_indices.append(len(input_ids) - 1)
                rows.append(SamplingRow(s.seq.params, s.seq.prompt_token_ids,
                                        s.seq.output_token_ids, s.seq.generator))
                sampling_order.append(i)
        num_decodes = len(decode_idx)
        attn = AttentionMetadata(self._tensor(slots), self._decode_groups(items[:num_decodes]),
                                 self._prefill_segments(items[num_decodes:], num_decodes))
        return ModelInputs(self._tensor(input_ids), self._tensor(positions), attn,
                           self._tensor(logits_indices), rows, sampling_order)

    def _slots(self, block_ids: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_ids[p // bs] * bs + p % bs for p in range(start, end)]

    def _decode_groups(self, decodes: list[ScheduledSequence]) -> list[DecodeGroup]:
        bs = self.block_size
        context_lens = [s.num_computed_tokens + 1 for s in decodes]
        groups = []
        for start, end in group_by_length(context_lens):
            lens = context_lens[start:end]
            num_blocks = -(-lens[0] // bs)
            tables = self._tensor([_padded(s.seq.block_ids, num_blocks)
                                   for s in decodes[start:end]])
            groups.append(DecodeGroup(start, end, tables, self._decode_mask(lens, num_blocks)))
        return groups

    def _decode_mask(self, context_lens: list[int], num_blocks: int) -> torch.Tensor:
        query_pos = self._tensor(context_lens).unsqueeze(1) - 1
        key_pos = torch.arange(num_blocks * self.block_size, device=self.device).unsqueeze(0)
        return self._causal_mask(query_pos, key_pos).view(len(context_lens), 1, 1, -1)

    def _causal_mask(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """True where a query attends a key: not after it, and inside the sliding window."""
        mask = key_pos <= query_pos
        window = self.model.shape.sliding_window
        if window is not None:
            mask &= key_pos > query_pos - window
        return mask

    def _prefill_segments(self, prefills: list[ScheduledSequence],
                          offset: int) -> list[PrefillSegment]:
        segments = []
        window = self.model.shape.sliding_window
        for s in prefills:
            start, n = s.num_computed_tokens, s.num_new_tokens
            context_len = start + n
            mask = None
            if start > 0 or (window is not None and context_len > window):
                q_pos = torch.arange(start, context_len, device=self.device).unsqueeze(1)
                k_pos = torch.arange(context_len, device=self.device).unsqueeze(0)
                mask = self._causal_mask(q_pos, k_pos)
            num_blocks = -(-context_len // self.block_size)
            table = self._tensor(s.seq.block_ids[:num_blocks])
            segments.append(PrefillSegment(offset, offset + n, context_len, table, mask))
            offset += n
        return segments

    def _tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _num_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        n = self.config.kv_cache_memory // self.bytes_per_block()
        if n < 1:
            raise ValueError(f"EngineConfig.kv_cache_memory={self.config.kv_cache_memory} holds no "
                             f"block of {self.bytes_per_block()} bytes; raise it")
        return n

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.model.shape
        shape = (self.num_blocks, self.block_size, s.num_kv_heads, s.head_dim)
        # Zeros, not empty: masked-out keys are still multiplied by 0 and NaN * 0 is NaN.
        logger.info("KV cache: %d blocks of %d tokens (%.0f MiB)", self.num_blocks,
                    self.block_size, self.num_blocks * self.bytes_per_block() / 2**20)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device))
                for _ in range(s.num_layers)]


def _padded(block_ids: list[int], n: int) -> list[int]:
    """The first n block ids, padded with block 0 (masked out) for shorter sequences."""
    return block_ids[:n] + [0] * (n - len(block_ids[:n]))
