"""CUDA graphs for decode-only steps: one per padded batch size, replayed with copied-in inputs.

A decode step of a small model is hundreds of kernel launches of a few microseconds each; a
graph replays them without Python or launch overhead. Graphs need fixed shapes, so a batch of n
decodes runs in the smallest captured size >= n with the extra rows padded: their slot is -1 (the
cache write skips them) and their context is one key of block 0.
"""

from __future__ import annotations

import logging

import torch

from pagoda.kernels.attention_metadata import TritonAttentionMetadata, choose_num_kv_splits

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8, up to and including max_num_seqs."""
    sizes = {b for b in (1, 2, 4) if b < max_num_seqs} | set(range(8, max_num_seqs, 8))
    return sorted(sizes | {max_num_seqs})


class DecodeGraphs:
    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 max_num_seqs: int, max_model_len: int, block_size: int,
                 device: torch.device, windows: list[int]) -> None:
        """windows: each KV cache group's attention window, the first group's first; every
        group has its own slots and block tables."""
        self.model = model
        self.kv_caches = kv_caches
        self.max_model_len = max_model_len
        self.sizes = graph_batch_sizes(max_num_seqs)
        n = max_num_seqs
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.windows = windows
        self.slot_mappings = [torch.full((n,), -1, dtype=torch.long, device=device)
                              for _ in windows]
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.block_tables = [torch.zeros(n, -(-max_model_len // block_size), dtype=torch.int32,
                                         device=device) for _ in windows]
        self.logits_indices = torch.arange(n, dtype=torch.long, device=device)
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def capture(self) -> None:
        """Largest first, so the smaller graphs reuse the first one's memory pool."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            args = self._static_args(size)
            self.model.forward(*args)  # compiles the Triton kernels outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self.model.forward(*args)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, meta: TritonAttentionMetadata) -> bool:
        return meta.max_query_len == 1 and meta.num_seqs <= self.sizes[-1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: TritonAttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        n = meta.num_seqs
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        for window, slots, tables in zip(self.windows, self.slot_mappings, self.block_tables,
                                         strict=True):
            group = meta.for_window(window)
            slots[:n].copy_(group.slot_mapping)
            slots[n:size].fill_(-1)
            tables[:n, :group.block_tables.shape[1]].copy_(group.block_tables)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:size].fill_(1)
        self.graphs[size].replay()
        return self.logits[size][logits_indices]

    def _static_args(self, size: int) -> tuple:
        num_kv_heads = self.kv_caches[0][0].shape[2]
        metas = [TritonAttentionMetadata(
            slot_mapping=slots[:size], query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size], block_tables=tables[:size],
            max_query_len=1, max_seq_len=self.max_model_len,
            num_kv_splits=choose_num_kv_splits(size, num_kv_heads, self.max_model_len,
                                               self.num_sms),
            sliding_window=window)
            for window, slots, tables in zip(self.windows, self.slot_mappings, self.block_tables,
                                             strict=True)]
        meta = metas[0]
        meta.windowed = {m.sliding_window: m for m in metas[1:]}
        return (self.input_ids[:size], self.positions[:size], meta, self.kv_caches,
                self.logits_indices[:size])
