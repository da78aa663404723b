"""How many KV blocks the pool has and the dtype it keeps them in, decided once at start.

The rule, when neither `EngineConfig.num_kv_blocks` nor `kv_cache_memory` is given (on a CPU; a
GPU's pool takes what `gpu_memory_utilization` leaves):

    tokens = max_model_len x min(max_num_seqs, KV_CONTEXTS)
    bytes  = min(tokens x bytes per token, AUTO_KV_CACHE_LIMIT, AVAILABLE_FRACTION x available)

max_model_len is the context this engine allows (the setting, else the model's own). Two full
contexts is room for one sequence at the longest allowed beside a prefix cache of as much, or for
many shorter ones sharing it (64 of 256 tokens, 32 of 512 on an 8k-context model): requests are
not sized ahead, so sequences share the pool block by block. The byte cap and the share of the
memory available after the weights keep a long-context model from taking the machine; a prompt
that the pool then cannot hold is refused in words (PromptTooLongError). The pool's pages are
committed by the OS as blocks are first written (`pagoda.engine.models.memory.zeroed_host_tensor`), so an
engine that has served short chats holds only what they used.

The memory a model's KV cache takes, known from its headers before it loads (`model_kv_cache_bytes`,
for the fit check), counts what each layer holds: a full-attention layer every token of the
context, a layer with a window of W keys at most W and one block more (its blocks that fall out of
the window go back to the pool), so Gemma 3 (five windowed layers per global one) needs about a
sixth of what its layers would hold all global.

A model whose layers attend in different ways keeps one pool per kind (KV cache groups, see
pagoda/engine/core/kv_cache_manager.py). The automatic rule sizes the first group's, which keeps every
block (the full-attention layers); a sliding-window group takes the windows of as many sequences
as the rule counts contexts, and a step's prefill chunk (`window_blocks_wanted`: about what the
estimate above counts), never more than the first group; the byte budget is split so that both
fit in it (`group_num_blocks`). More sequences than that past their windows at once share the
windowed pool, and the newest is preempted when it runs out, as when the first group does.

A model with recurrent layers (LFM2's short convolutions, Granite's Mamba-2 layers) also keeps
a state per running sequence in each of them: a slot (pagoda.engine.core.state_pool). The slots
come out of the same budget, before the KV blocks are counted (`blocks_and_slots`): one per
sequence the scheduler may run (max_num_seqs), as many as STATE_SHARE of the budget holds, at
least one; the automatic budget grows by max_num_seqs slots' worth, within its bounds. With
num_kv_blocks set, the blocks are what it says and the max_num_seqs slots come on top.

With the prefix cache on, such a model also keeps checkpoints of those states at block
boundaries (pagoda.engine.core.checkpoint_store), in slots of their own after the running ones:
as many as CHECKPOINT_SHARE of the budget holds, at most one per BLOCKS_PER_CHECKPOINT blocks
of the first group (a checkpoint is found only through the cached blocks before it: a chat of
many blocks needs two), at least MIN_CHECKPOINTS (a running sequence's latest boundary and a
prompt's end). They come out of the
budget after the running slots, before the blocks; the automatic budget does not grow for them.
A budget that holds no block beside MIN_CHECKPOINTS keeps none (the prefix cache is then off).
With num_kv_blocks set they come on top: two per sequence the scheduler may run (its latest
boundary, and as many kept for prompts and finished chats), at most one per block. The fit
check counts the slots and checkpoints the same way (`model_kv_cache_bytes`, from
ModelShape.state_floats).
"""

from __future__ import annotations

import torch

from pagoda.engine.config import EngineConfig
from pagoda.engine.layers.recurrent_mixer import STATE_DTYPE
from pagoda.engine.models.architecture import ModelShape

KV_CONTEXTS = 2
# Sequences past their window that a windowed group's pool holds at once, beside the full
# group's KV_CONTEXTS contexts: those contexts are shared by many shorter chats (tabs, a
# server's clients), each of which keeps a whole window once past it. A 9th waits, preempted.
WINDOWED_SEQUENCES = 8
AUTO_KV_CACHE_LIMIT = 1 << 30
AVAILABLE_FRACTION = 0.25
# The most of the cache's budget that recurrent states take, so KV blocks always get the rest.
STATE_SHARE = 0.5
# The most of the budget that recurrent state checkpoints take, for models whose states are
# large (Mamba-2's): a prefix is found through its cached blocks, so they keep most of it.
CHECKPOINT_SHARE = 0.25
# At most one checkpoint per this many blocks of the first group (256 tokens): a chat keeps two
# (its prompt's end and its reply's latest boundary), so every chat of 512 tokens or more that
# the blocks hold keeps both. LFM2-1.2B's states (160 KiB) weigh about one of its blocks (192
# KiB in bf16), so its checkpoints take about 6% of what its blocks do.
BLOCKS_PER_CHECKPOINT = 16
MIN_CHECKPOINTS = 2

_KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def kv_cache_dtype(config: EngineConfig) -> torch.dtype:
    """The KV pool's dtype: the compute dtype under "auto", else the one named."""
    if config.kv_cache_dtype == "auto":
        return config.dtype
    return _KV_DTYPES[config.kv_cache_dtype]


def kv_cache_memory_bound(config: EngineConfig) -> int:
    """The most bytes the KV pool may take, known before the model is read: for the memory
    checks made from a model's headers."""
    return config.kv_cache_memory if config.kv_cache_memory is not None else AUTO_KV_CACHE_LIMIT


def mtp_scratch_blocks_per_row(config: EngineConfig) -> int:
    """The blocks each sequence of a step needs beyond its own for a multi-token-prediction
    block's chained drafts (pagoda.engine.models.mtp): the keys of drafts after the first, at
    most num_speculative_tokens - 1 positions past the sequence's last block."""
    return -(-max(config.num_speculative_tokens - 1, 0) // config.block_size)


def model_kv_cache_bytes(shape: ModelShape | None, config: EngineConfig,
                         mtp_like: int | None = None) -> int:
    """The KV pool's bytes for a model under config, known before it loads: kv_cache_memory when
    set, else the automatic rule's contexts at the context allowed (the setting, else the
    model's own), each counting only what its layers hold, at most AUTO_KV_CACHE_LIMIT; with
    the recurrent layers' state slots (within those bytes, or beside num_kv_blocks' blocks).
    mtp_like: where the engine will build a multi-token-prediction block, the layer its own is
    shaped like: its keys ride in the first group's blocks, and its chained drafts' scratch
    blocks come on top. shape None (not known): kv_cache_memory_bound."""
    if shape is None or config.kv_cache_memory is not None:
        return kv_cache_memory_bound(config)
    context = min(config.max_model_len or shape.max_position_embeddings,
                  shape.max_position_embeddings)
    per_float = 2 * config.block_size * kv_cache_dtype(config).itemsize  # keys and values
    windows = list(shape.windows)
    # Each layer at its own KV heads and head size (Gemma 4's global layers have their own);
    # a layer that reads an earlier layer's KV cache holds none.
    bytes_per_block = [per_float * shape.kv_floats(
        i for i, lw in enumerate(shape.layer_windows) if lw == w and shape.holds_kv(i))
        for w in windows]
    mtp_block = 0 if mtp_like is None else per_float * shape.kv_floats((mtp_like,))
    bytes_per_block[0] += mtp_block
    # The pools and state slots the engine will allocate (`blocks_and_slots`), as it sizes them
    # at load.
    bytes_per_slot = shape.state_floats * STATE_DTYPE.itemsize
    counts, slots, checkpoints = blocks_and_slots(config, bytes_per_block, windows,
                                                  bytes_per_slot, context, None,
                                                  checkpoints=config.enable_prefix_caching)
    scratch = config.max_num_seqs * mtp_scratch_blocks_per_row(config) * mtp_block
    return (sum(n * size for n, size in zip(counts, bytes_per_block, strict=True))
            + (slots + checkpoints) * bytes_per_slot + scratch)


def auto_kv_cache_bytes(bytes_per_token: int, max_model_len: int, max_num_seqs: int,
                        available: int | None) -> int:
    """The automatic pool size in bytes (the rule above); available None: not measurable."""
    wanted = bytes_per_token * max_model_len * min(max_num_seqs, KV_CONTEXTS)
    return min(wanted, _auto_bound(available))


def _auto_bound(available: int | None) -> int:
    """The automatic pool's most bytes: the cap, and the share of what is available."""
    if available is None:
        return AUTO_KV_CACHE_LIMIT
    return min(AUTO_KV_CACHE_LIMIT, int(available * AVAILABLE_FRACTION))


def num_kv_blocks(config: EngineConfig, bytes_per_block: int, max_model_len: int,
                  available: int | None) -> int:
    """Blocks of the CPU pool: num_kv_blocks when given, else kv_cache_memory's worth, else the
    automatic size. Raises ValueError when the bytes hold no block."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory is not None:
        n = config.kv_cache_memory // bytes_per_block
        if n < 1:
            raise ValueError(f"EngineConfig.kv_cache_memory={config.kv_cache_memory} holds no "
                             f"block of {bytes_per_block} bytes; raise it")
        return n
    bytes_per_token = bytes_per_block // config.block_size
    budget = auto_kv_cache_bytes(bytes_per_token, max_model_len, config.max_num_seqs, available)
    return max(1, budget // bytes_per_block)


def window_blocks_wanted(window: int, config: EngineConfig) -> int:
    """A sliding-window group's blocks: the window of WINDOWED_SEQUENCES sequences, each with the
    block its next tokens (drafts included) start, and a step's whole token budget as one
    prefill chunk, so that one sequence always fits."""
    bs = config.block_size
    per_sequence = -(-(window + config.num_speculative_tokens) // bs) + 1
    sequences = min(config.max_num_seqs, WINDOWED_SEQUENCES)
    return sequences * per_sequence + -(-config.max_num_batched_tokens // bs) + 1


def split_kv_budget(budget: int, bytes_per_block: list[int], wanted: list[int]) -> list[int]:
    """Blocks per group within `budget` bytes: the first group as many as fit beside the
    others, each of which takes min(its wanted, the first group's); wanted[0] is not read."""
    def cost(n: int) -> int:
        return n * bytes_per_block[0] + sum(min(n, w) * b for w, b in
                                            zip(wanted[1:], bytes_per_block[1:], strict=True))

    low, high = 0, budget // bytes_per_block[0]
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if cost(mid) <= budget else (low, mid - 1)
    return [low] + [min(low, w) for w in wanted[1:]]


def group_num_blocks(config: EngineConfig, bytes_per_block: list[int], windows: list[int],
                     max_model_len: int, available: int | None) -> list[int]:
    """Blocks of each group's CPU pool, the first group's (window 0: every block kept) as
    `num_kv_blocks` sizes a single pool, windowed ones as much as their windows use. Raises
    ValueError when the bytes hold no block of the first group."""
    wanted = [0] + [window_blocks_wanted(w, config) for w in windows[1:]]
    if config.num_kv_blocks is not None:
        n = config.num_kv_blocks
        return [n] + [min(n, w) for w in wanted[1:]]
    if len(bytes_per_block) == 1:
        return [num_kv_blocks(config, bytes_per_block[0], max_model_len, available)]
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    else:
        budget = _auto_budget(config, bytes_per_block, wanted, max_model_len, available)
    return _blocks_within(budget, bytes_per_block, wanted)


def _auto_budget(config: EngineConfig, bytes_per_block: list[int], wanted: list[int],
                 max_model_len: int, available: int | None) -> int:
    """The automatic rule's bytes for every group: the first's contexts, each windowed group's
    wanted blocks (at most the first's), within the automatic bounds."""
    per_token = bytes_per_block[0] // config.block_size
    first = auto_kv_cache_bytes(per_token, max_model_len, config.max_num_seqs, available)
    blocks = max(1, first // bytes_per_block[0])
    return min(_auto_bound(available),
               first + sum(min(blocks, w) * b for w, b in
                           zip(wanted[1:], bytes_per_block[1:], strict=True)))


def _blocks_within(budget: int, bytes_per_block: list[int], wanted: list[int]) -> list[int]:
    counts = split_kv_budget(budget, bytes_per_block, wanted)
    if counts[0] < 1:
        raise ValueError(f"EngineConfig.kv_cache_memory={budget} holds no block of "
                         f"{bytes_per_block[0]} bytes beside the windowed layers' and the "
                         "recurrent states'; raise it")
    return counts


def split_state_budget(budget: int, bytes_per_slot: int, max_num_seqs: int) -> tuple[int, int]:
    """(state slots, bytes left for KV blocks) within `budget`: a slot per sequence the
    scheduler may run, as many as STATE_SHARE of the budget holds, at least one."""
    slots = max(1, min(max_num_seqs, int(budget * STATE_SHARE) // bytes_per_slot))
    return slots, budget - slots * bytes_per_slot


def split_checkpoint_budget(budget: int, rest: int, bytes_per_slot: int,
                            bytes_per_block: list[int], wanted: list[int]) -> int:
    """Checkpoint slots from the `rest` of `budget` that the running slots left: as many as
    CHECKPOINT_SHARE of the budget holds, at most one per BLOCKS_PER_CHECKPOINT of the first
    group's blocks beside them, at least MIN_CHECKPOINTS; none when MIN_CHECKPOINTS leave no
    block (the prefix cache is then off)."""
    least = rest - MIN_CHECKPOINTS * bytes_per_slot
    if least < 0 or split_kv_budget(least, bytes_per_block, wanted)[0] < 1:
        return 0
    most = max(MIN_CHECKPOINTS, int(budget * CHECKPOINT_SHARE) // bytes_per_slot)
    fewest_blocks = split_kv_budget(max(0, rest - most * bytes_per_slot), bytes_per_block,
                                    wanted)[0]
    return max(MIN_CHECKPOINTS, min(most, fewest_blocks // BLOCKS_PER_CHECKPOINT))


def blocks_and_slots(config: EngineConfig, bytes_per_block: list[int], windows: list[int],
                     bytes_per_slot: int, max_model_len: int, available: int | None,
                     checkpoints: bool = False) -> tuple[list[int], int, int]:
    """Blocks of each group's CPU pool, slots of the recurrent states, and slots of their
    checkpoints (bytes_per_slot: one slot over every recurrent layer; 0 without any, then no
    slot and `group_num_blocks`' blocks; checkpoints: the prefix cache keeps them).
    Raises ValueError when the bytes left hold no block of the first group."""
    if not bytes_per_slot:
        return group_num_blocks(config, bytes_per_block, windows, max_model_len, available), 0, 0
    if config.num_kv_blocks is not None:
        n = config.num_kv_blocks
        on_top = max(MIN_CHECKPOINTS, min(2 * config.max_num_seqs, n)) if checkpoints else 0
        return (group_num_blocks(config, bytes_per_block, windows, max_model_len, available),
                config.max_num_seqs, on_top)
    wanted = [0] + [window_blocks_wanted(w, config) for w in windows[1:]]
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    else:
        budget = min(_auto_bound(available),
                     _auto_budget(config, bytes_per_block, wanted, max_model_len, available)
                     + config.max_num_seqs * bytes_per_slot)
    slots, rest = split_state_budget(budget, bytes_per_slot, config.max_num_seqs)
    num_checkpoints = (split_checkpoint_budget(budget, rest, bytes_per_slot, bytes_per_block,
                                               wanted) if checkpoints else 0)
    blocks = _blocks_within(rest - num_checkpoints * bytes_per_slot, bytes_per_block, wanted)
    return blocks, slots, num_checkpoints
