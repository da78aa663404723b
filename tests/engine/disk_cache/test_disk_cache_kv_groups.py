"""The prefix cache's disk tier for a model whose KV cache has several groups (a tiny Gemma 3:
five layers with an 8-token sliding window, one global): each group saves its part of every
block it computes, a chat reopened after a restart takes the global layers' blocks of its whole
prefix and the windowed layers' blocks of the window at its end, and gives the tokens a cold run
gives; a damaged or foreign part is refused and the hit ends before it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pagoda.engine.config import EngineConfig
from pagoda.engine.disk_cache.store import forget_tag
from pagoda.engine.disk_cache.tier import group_block_key
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.sampling.params import SamplingParams
from tests.engine.disk_cache.test_cache_tags import chained_hashes
from tests.engine.disk_cache.test_disk_prefix_cache import history, run_to_end, wait_until
from tests.engine.tiny_models import save_tiny_model

BLOCK = 4
WINDOW = 8  # the tiny gemma3's sliding window: a hit's end needs its last two blocks
# With each token's log-probability: the tiny model's greedy picks are far apart, so a reply
# read from a wrong window can keep its tokens; its log-probabilities move (by ~0.07 with the
# window's blocks zeroed) where a right one stays within float noise (~5e-7).
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
# 16-token chunks: the windowed layers give blocks back while the prompt is still computed.
ENGINE = {"num_kv_blocks": 64, "block_size": BLOCK, "num_threads": 1,
          "max_num_batched_tokens": 16}


TAG = "conversation-7"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-gemma3"), "gemma3", seed=0)


def engine(model: Path, disk: Path | None, **config) -> LLMEngine:
    return LLMEngine(str(model), EngineConfig(**ENGINE, disk_cache_dir=disk, **config))


def generate(eng: LLMEngine, prompt: list[int], cache_tag: str | None = None):
    eng.add_request("r", prompt, GREEDY, cache_tag=cache_tag)
    return run_to_end(eng)


@pytest.fixture(scope="module")
def cold(gemma3) -> LLMEngine:
    """Computes every prompt from its first token."""
    return engine(gemma3, None, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def saved(gemma3, tmp_path_factory) -> tuple[list[int], Path]:
    """A 40-token prompt answered by an engine keeping its blocks in a folder, which is then
    closed (its blocks written): the chat so far, reply included, and the folder."""
    folder = tmp_path_factory.mktemp("kv-blocks")
    prompt = history(40)
    first = engine(gemma3, folder)
    reply = generate(first, prompt, cache_tag=TAG).outputs[0].token_ids
    first.close()
    return prompt + reply, folder


@pytest.fixture
def chat(saved, tmp_path) -> list[int]:
    """The saved chat, its blocks in a copy of their folder at tmp_path."""
    shutil.copytree(saved[1], tmp_path, dirs_exist_ok=True)
    return saved[0]


def assert_same_reply(restored, cold) -> None:
    """The same tokens as the cold run's, each as likely to float precision."""
    assert restored.outputs[0].token_ids == cold.outputs[0].token_ids
    for ours, theirs in zip(restored.outputs[0].logprobs, cold.outputs[0].logprobs, strict=True):
        assert ours.chosen.logprob == pytest.approx(theirs.chosen.logprob, abs=1e-4)


def block_hashes(tokens: list[int]) -> list[bytes]:
    return chained_hashes(tokens, BLOCK)


def part_file(disk: Path, block_hash: bytes, group: int) -> Path:
    name = group_block_key(block_hash, group).hex()
    [path] = disk.glob(f"*/{name[:2]}/{name}.kv")
    return path


def test_a_chat_reopened_after_a_restart_skips_its_prefix_and_gives_the_cold_tokens(
        gemma3, chat, cold, tmp_path):
    turn = chat + history(10, start=900)

    again = engine(gemma3, tmp_path)
    restored = generate(again, turn)

    num_blocks = (len(chat) - 1) // BLOCK
    assert restored.num_cached_tokens == num_blocks * BLOCK
    assert again.kv_cache.stats().prefix_hit_tokens == num_blocks * BLOCK
    assert_same_reply(restored, generate(cold, turn))
    # What a hit in memory takes: the global layers' part of every block, the windowed layers'
    # of the two blocks that the window at the hit's end sees.
    assert again.stats().disk_cache.hits == num_blocks + WINDOW // BLOCK


def test_each_group_saves_its_part_of_every_block_it_computes(chat, tmp_path):
    computed = block_hashes(chat[:-1])  # the last token of the reply was never fed back
    for group in (0, 1):
        assert all(part_file(tmp_path, h, group).is_file() for h in computed)
    assert len(list(tmp_path.rglob("*.kv"))) == 2 * len(computed)


def flip_a_byte(data: bytes) -> bytes:
    return data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:]


def cut_short(data: bytes) -> bytes:
    return data[:len(data) // 2]


@pytest.mark.parametrize("damage", [flip_a_byte, cut_short])
def test_a_damaged_windowed_part_ends_the_hit_where_the_window_is_whole_again(
        gemma3, chat, cold, tmp_path, damage):
    num_blocks = (len(chat) - 1) // BLOCK
    last = block_hashes(chat)[num_blocks - 1]
    damaged = part_file(tmp_path, last, 1)
    data = damage(damaged.read_bytes())
    damaged.write_bytes(data)

    again = engine(gemma3, tmp_path)
    restored = generate(again, chat)

    # The hit one block shorter needs the window's blocks before the damaged one: on disk.
    assert restored.num_cached_tokens == (num_blocks - 1) * BLOCK
    assert_same_reply(restored, generate(cold, chat))
    assert again.stats().disk_cache.errors == 1
    assert damaged.read_bytes() != data  # removed, then saved again as recomputed


def test_a_part_of_another_size_is_refused_and_recomputed(gemma3, chat, cold, tmp_path):
    again = engine(gemma3, tmp_path)
    store = again.disk_cache.store
    first_block = block_hashes(chat)[0]
    # The global layers' name holding a windowed part's bytes (or a whole block of the layout
    # before groups): a well-formed file with its checksum, of the wrong size.
    part_file(tmp_path, first_block, 0).unlink()
    store.remove([first_block])
    wrong = again.disk_cache.ios[1].bytes_per_block
    assert wrong != again.disk_cache.ios[0].bytes_per_block
    store.save([(first_block, tuple(chat[:BLOCK]), b"\0" * wrong)])

    restored = generate(again, chat)

    assert restored.num_cached_tokens == 0
    assert_same_reply(restored, generate(cold, chat))


def test_every_groups_part_is_read_ahead_when_the_prompt_is_added(gemma3, chat, tmp_path):
    num_blocks = (len(chat) - 1) // BLOCK
    eng = engine(gemma3, tmp_path)
    global_ahead, windowed_ahead = eng.disk_cache.read_aheads

    eng.add_request("r", chat, GREEDY)
    wait_until(lambda: (global_ahead.stats().read, windowed_ahead.stats().read)
               == (num_blocks, WINDOW // BLOCK))
    out = run_to_end(eng)

    assert out.num_cached_tokens == num_blocks * BLOCK
    assert global_ahead.stats().taken == num_blocks
    assert windowed_ahead.stats().taken == WINDOW // BLOCK
    assert global_ahead.held_bytes == windowed_ahead.held_bytes == 0


def test_forgetting_a_chat_removes_every_groups_part_of_its_blocks(chat, tmp_path):
    assert list(tmp_path.rglob("*.kv"))

    forget_tag(tmp_path, TAG)

    assert not list(tmp_path.rglob("*.kv"))


def test_windowed_blocks_pushed_out_of_memory_are_read_back_from_disk(gemma3, cold, tmp_path):
    eng = engine(gemma3, tmp_path)
    chat = history(40) + generate(eng, history(40)).outputs[0].token_ids
    windowed_pool = eng.kv_cache.pools[1].num_blocks
    # Other prompts cycle the small windowed pool, never the global pool's blocks of the chat.
    generate(eng, history(4 * (windowed_pool + 4), start=3000))
    assert eng.kv_cache.pools[1].num_free_blocks == windowed_pool
    eng.disk_cache.flush(10)

    restored = generate(eng, chat)

    num_blocks = (len(chat) - 1) // BLOCK
    assert restored.num_cached_tokens == num_blocks * BLOCK
    assert eng.stats().disk_cache.hits == WINDOW // BLOCK  # the window's parts alone
    assert_same_reply(restored, generate(cold, chat))
