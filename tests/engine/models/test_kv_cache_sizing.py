"""The KV pool's size and dtype: sized from the model and the context allowed unless a setting
says otherwise, bounded by a byte cap and by the memory available, committed as it is used."""

from pathlib import Path

import pytest
import torch

from pagoda.engine import PromptTooLongError, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.models.kv_cache_sizing import (
    AUTO_KV_CACHE_LIMIT,
    KV_CONTEXTS,
    auto_kv_cache_bytes,
    kv_cache_memory_bound,
    num_kv_blocks,
)
from pagoda.engine.models.memory import zeroed_host_tensor
from pagoda.engine.worker.process_memory import resident_bytes

# The default model: 30 layers x 3 KV heads x 64 dims, keys and values, fp32.
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4
ENGINE = {"num_kv_blocks": None, "num_threads": 1}


def test_default_pool_holds_two_full_contexts_of_the_allowed_length(make_llm):
    llm = make_llm(**ENGINE, max_model_len=1024)
    runner = llm.engine.runner
    assert runner.num_blocks * runner.block_size == KV_CONTEXTS * 1024


def test_default_pool_of_the_default_model_is_two_8k_contexts_in_720_mib(make_llm):
    runner = make_llm(**ENGINE).engine.runner
    assert runner.num_blocks * runner.block_size == 2 * 8192
    assert runner.num_blocks * runner.bytes_per_block() == 2 * 8192 * BYTES_PER_TOKEN


def test_one_sequence_at_a_time_gets_one_context():
    assert auto_kv_cache_bytes(BYTES_PER_TOKEN, 8192, 1, None) == 8192 * BYTES_PER_TOKEN


def test_default_pool_never_exceeds_the_byte_cap():
    assert auto_kv_cache_bytes(BYTES_PER_TOKEN, 131072, 64, None) == AUTO_KV_CACHE_LIMIT


def test_default_pool_takes_at_most_a_quarter_of_the_available_memory():
    assert auto_kv_cache_bytes(BYTES_PER_TOKEN, 8192, 64, 400 << 20) == 100 << 20


def test_explicit_kv_cache_memory_and_num_kv_blocks_win_over_the_rule():
    block = 16 * BYTES_PER_TOKEN
    assert num_kv_blocks(EngineConfig(kv_cache_memory=10 * block), block, 8192, None) == 10
    assert num_kv_blocks(EngineConfig(num_kv_blocks=7, kv_cache_memory=10 * block), block,
                         8192, None) == 7


def test_memory_checks_before_loading_count_the_cap_or_the_explicit_size():
    assert kv_cache_memory_bound(EngineConfig()) == AUTO_KV_CACHE_LIMIT
    assert kv_cache_memory_bound(EngineConfig(kv_cache_memory=5 << 20)) == 5 << 20


def test_prompt_longer_than_a_capped_default_pool_names_kv_cache_memory(make_llm, monkeypatch):
    monkeypatch.setattr("pagoda.engine.models.kv_cache_sizing.AUTO_KV_CACHE_LIMIT", 64 * 16 * BYTES_PER_TOKEN)
    llm = make_llm(**ENGINE)
    assert llm.engine.runner.num_blocks == 64
    with pytest.raises(PromptTooLongError, match="KV cache holds 1024.*kv_cache_memory"):
        llm.generate([1000] * 2000)


@pytest.mark.parametrize("value", [0, -1])
def test_kv_cache_memory_below_one_byte_is_refused(value):
    with pytest.raises(ValueError, match="kv_cache_memory.*None to size the KV cache"):
        EngineConfig(kv_cache_memory=value)


def test_pool_pages_cost_memory_only_once_written():
    before = resident_bytes()
    pool = zeroed_host_tensor((64 << 20,), torch.float32)  # 256 MiB
    assert resident_bytes() - before < 16 << 20
    assert pool[::4096].abs().sum().item() == 0  # reads as zeros
    pool[: 16 << 20].fill_(1.0)
    assert resident_bytes() - before >= 60 << 20


def resident_bytes_of_mapping(address: int) -> int:
    """The resident bytes of this process's memory mapping that holds `address` (Linux smaps):
    what one allocation costs, whatever the rest of the process allocates or frees meanwhile."""
    inside, lines = False, Path("/proc/self/smaps").read_text().splitlines()
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "Rss:":
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def test_an_engine_holds_no_more_of_its_pool_than_its_sequences_wrote(make_llm):
    llm = make_llm(**ENGINE)
    runner = llm.engine.runner
    pool_bytes = runner.num_blocks * runner.bytes_per_block()
    assert pool_bytes > 600 << 20
    pool_address = runner.kv_caches[0][0].untyped_storage().data_ptr()
    llm.generate("Hello", SamplingParams(max_tokens=32))
    written = resident_bytes_of_mapping(pool_address)
    assert 0 < written < 100 << 20


def test_windowed_layers_pool_eight_windows_and_a_chunk_beside_two_full_contexts():
    from pagoda.engine.models.kv_cache_sizing import WINDOWED_SEQUENCES, group_num_blocks

    config = EngineConfig(max_model_len=32768, block_size=16, max_num_batched_tokens=512)
    full, windowed = 1 * 16 * 2048, 5 * 16 * 2048  # a global layer and five windowed, per block
    blocks = group_num_blocks(config, [full, windowed], [0, 512], 32768, None)
    assert WINDOWED_SEQUENCES == 8
    assert blocks == [2 * 32768 // 16, 8 * (512 // 16 + 1) + 512 // 16 + 1]


def test_a_byte_budget_is_split_so_every_group_fits():
    from pagoda.engine.models.kv_cache_sizing import group_num_blocks

    config = EngineConfig(kv_cache_memory=300_000, block_size=16, max_num_batched_tokens=64)
    blocks = group_num_blocks(config, [1000, 5000], [0, 32], 4096, None)
    assert blocks[1] == 8 * 3 + 4 + 1  # what the window wants: less than the first group gets
    assert blocks[0] == (300_000 - blocks[1] * 5000) // 1000


def test_recurrent_states_take_a_slot_per_sequence_off_the_budget_before_the_blocks():
    from pagoda.engine.models.kv_cache_sizing import blocks_and_slots

    config = EngineConfig(kv_cache_memory=1_000_000, block_size=16, max_num_seqs=8)
    blocks, slots, _ = blocks_and_slots(config, [1000], [0], 10_000, 4096, None)
    assert slots == 8
    assert blocks == [(1_000_000 - 8 * 10_000) // 1000]


def test_recurrent_states_take_at_most_half_the_budget_and_at_least_one_slot():
    from pagoda.engine.models.kv_cache_sizing import STATE_SHARE, blocks_and_slots

    config = EngineConfig(kv_cache_memory=1_000_000, block_size=16, max_num_seqs=64)
    blocks, slots, _ = blocks_and_slots(config, [1000], [0], 100_000, 4096, None)
    assert slots == int(1_000_000 * STATE_SHARE) // 100_000
    assert blocks == [(1_000_000 - slots * 100_000) // 1000]
    _, slots, _ = blocks_and_slots(config, [1000], [0], 900_000, 4096, None)
    assert slots == 1
    with pytest.raises(ValueError, match="recurrent states"):
        blocks_and_slots(config, [1000], [0], 1_000_000, 4096, None)


def test_the_automatic_budget_grows_by_the_states_of_every_sequence():
    from pagoda.engine.models.kv_cache_sizing import blocks_and_slots, group_num_blocks

    config = EngineConfig(max_model_len=1024, block_size=16, max_num_seqs=4)
    without = group_num_blocks(config, [1000], [0], 1024, None)
    blocks, slots, _ = blocks_and_slots(config, [1000], [0], 5000, 1024, None)
    assert (blocks, slots) == (without, 4)


def test_num_kv_blocks_fixes_the_blocks_and_states_come_on_top():
    from pagoda.engine.models.kv_cache_sizing import blocks_and_slots

    config = EngineConfig(num_kv_blocks=40, max_num_seqs=6)
    assert blocks_and_slots(config, [1000], [0], 5000, 1024, None) == ([40], 6, 0)
    assert blocks_and_slots(config, [1000], [0], 0, 1024, None) == ([40], 0, 0)


def test_state_checkpoints_take_at_most_a_quarter_of_the_budget_after_the_running_slots():
    from pagoda.engine.models.kv_cache_sizing import CHECKPOINT_SHARE, blocks_and_slots

    config = EngineConfig(kv_cache_memory=1_000_000, block_size=16, max_num_seqs=4)
    blocks, slots, checkpoints = blocks_and_slots(config, [1000], [0], 10_000, 4096, None,
                                                  checkpoints=True)
    assert slots == 4
    assert checkpoints == int(1_000_000 * CHECKPOINT_SHARE) // 10_000
    assert blocks == [(1_000_000 - (slots + checkpoints) * 10_000) // 1000]


def test_state_checkpoints_are_one_per_16_blocks_at_least_two_or_none_without_room():
    from pagoda.engine.models.kv_cache_sizing import BLOCKS_PER_CHECKPOINT, blocks_and_slots

    config = EngineConfig(kv_cache_memory=1_000_000, block_size=16, max_num_seqs=1)
    blocks, _, checkpoints = blocks_and_slots(config, [1000], [0], 100, 4096, None,
                                              checkpoints=True)
    # A quarter holds 2500 checkpoints of 100 bytes; the blocks beside them, 749.
    assert checkpoints == 749 // BLOCKS_PER_CHECKPOINT
    assert blocks == [(1_000_000 - 100 - checkpoints * 100) // 1000]
    _, _, checkpoints = blocks_and_slots(config, [1000], [0], 30_000, 4096, None,
                                         checkpoints=True)
    assert checkpoints == 8  # the quarter's: 250 kB of 30 kB checkpoints
    config = EngineConfig(kv_cache_memory=100_000, block_size=16, max_num_seqs=1)
    _, _, checkpoints = blocks_and_slots(config, [10_000], [0], 100, 4096, None,
                                         checkpoints=True)
    assert checkpoints == 2  # 7 blocks: fewer than 16 a checkpoint
    blocks, _, checkpoints = blocks_and_slots(config, [1000], [0], 40_000, 4096, None,
                                              checkpoints=True)
    assert (blocks, checkpoints) == ([60], 0)  # two would leave no block


def test_num_kv_blocks_fixes_the_blocks_and_checkpoints_come_on_top():
    from pagoda.engine.models.kv_cache_sizing import blocks_and_slots

    config = EngineConfig(num_kv_blocks=40, max_num_seqs=6)
    assert blocks_and_slots(config, [1000], [0], 5000, 1024, None, checkpoints=True) == (
        [40], 6, 12)
    config = EngineConfig(num_kv_blocks=1, max_num_seqs=6)
    assert blocks_and_slots(config, [1000], [0], 5000, 1024, None, checkpoints=True)[2] == 2
