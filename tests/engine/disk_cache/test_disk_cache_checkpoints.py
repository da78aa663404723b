"""The disk tier on hybrid models (issue 56): the checkpoints of the recurrent states are kept on
disk beside the attention layers' blocks, so a chat's second turn after a restart starts within
a block of the first turn's end; a damaged checkpoint is refused (the prefix recomputed from the
deepest good one, or from the first token); checkpoints and blocks share the disk's budget; and
preemption, aborts and memory's own evictions leave no slot held. Every greedy reply (tokens
and logprobs) is the one a cold engine (prefix cache off) gives.

Tiny random models (tests/engine/tiny_models.py), blocks of 16 tokens. The first turn: a
150-token prompt and 24 replies, checkpointed at its prompt's end (144) and at the latest
boundary it reached (160); see docs/ENGINE.md, "Recurrent state checkpoints".
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import transformers

from pagoda.engine import LLM
from pagoda.engine.core.block_pool import hash_block_tokens
from pagoda.engine.disk_cache.store import forget_tag
from pagoda.engine.disk_cache.tier import DiskPrefixCache, checkpoint_key
from tests.engine.hybrid_checks import GREEDY_LOGPROBS, assert_same_reply, reply
from tests.engine.models.test_parity import NUM_THREADS
from tests.engine.test_batch_invariance import SENTENCES
from tests.engine.tiny_models import save_tiny_model

# The sampled tokens' logprobs too: a reply's tokens can survive a slightly wrong state.
BLOCK = 16
ENGINE = {"num_threads": NUM_THREADS, "num_kv_blocks": 64}


@pytest.fixture(scope="module", params=["lfm2", "qwen3.5", "granite-hybrid"])
def hybrid(request, tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("lfm2"), "lfm2")


def texts_of(model: Path) -> list[list[int]]:
    """Five token runs of 300 that share no prefix."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    ids = [tokenizer.encode(f"Note {i}. " + " ".join(SENTENCES[i:] + SENTENCES[:i]) * 2)
           for i in range(5)]
    return [p[:300] for p in ids]


def engine(model: Path, disk: Path | None, **settings) -> LLM:
    return LLM(str(model), **(ENGINE | settings), disk_cache_dir=disk)


def cold_reply(model: Path, prompt: list[int]):
    return engine(model, None, enable_prefix_caching=False).generate([prompt], GREEDY_LOGPROBS)[0]


def assert_nothing_held(llm: LLM) -> None:
    e = llm.engine
    assert e.state_pool.num_free_slots == e.state_pool.num_slots
    assert e.kv_cache.checkpoints.num_held == 0
    assert e.scheduler.kv_cache.pool.num_free_blocks == e.kv_cache.pool.num_blocks


def first_turn_before_a_restart(model: Path, disk: Path) -> tuple[list[int], list[int]]:
    """A chat's first turn on an engine keeping its cache in `disk`, which is then closed.
    Returns the turn (prompt and reply) and the second turn's prompt."""
    texts = texts_of(model)
    prompt = texts[0][:150]
    first = engine(model, disk)
    turn = prompt + list(reply(first, prompt).outputs[0].token_ids)
    first.engine.close()
    return turn, turn + texts[1][:20]


def checkpoint_files(disk: Path, tokens: list[int], boundary: int) -> list[Path]:
    """The file of the checkpoint after tokens[:boundary], if on disk."""
    block_hash = None
    for start in range(0, boundary, BLOCK):
        block_hash = hash_block_tokens(block_hash, tokens[start:start + BLOCK])
    name = checkpoint_key(block_hash).hex()
    return list(disk.glob(f"*/{name[:2]}/{name}.kv"))


def checkpoint_file(disk: Path, tokens: list[int], boundary: int) -> Path:
    file, = checkpoint_files(disk, tokens, boundary)
    return file


def damage(file: Path, how: str) -> None:
    data = bytearray(file.read_bytes())
    if how == "truncated":
        del data[len(data) // 2:]
    else:
        data[-5] ^= 0xFF  # inside the states
    file.write_bytes(bytes(data))


def test_a_second_turn_after_a_restart_starts_from_the_checkpoint_on_disk(hybrid, tmp_path):
    turn, second_prompt = first_turn_before_a_restart(hybrid, tmp_path)

    restarted = engine(hybrid, tmp_path)
    second = reply(restarted, second_prompt)

    assert len(turn) - 1 == 173  # the last reply is sampled, never computed: 10 full blocks
    assert second.num_cached_tokens == 160
    assert_same_reply(second, cold_reply(hybrid, second_prompt))
    stats = restarted.engine.stats().disk_cache
    assert stats.hits == 11 and stats.errors == 0  # ten blocks and the checkpoint at 160
    assert_nothing_held(restarted)


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_a_damaged_checkpoint_is_refused_and_the_one_before_it_restored(lfm2, tmp_path, how,
                                                                       caplog):
    turn, second_prompt = first_turn_before_a_restart(lfm2, tmp_path)
    damage(checkpoint_file(tmp_path, turn, 160), how)

    restarted = engine(lfm2, tmp_path)
    with caplog.at_level(logging.WARNING, logger="pagoda.engine.disk_cache.store"):
        second = reply(restarted, second_prompt)

    assert second.num_cached_tokens == 144  # the prompt's end
    assert_same_reply(second, cold_reply(lfm2, second_prompt))
    assert restarted.engine.stats().disk_cache.errors == 1
    assert any("unusable block file" in r.getMessage() for r in caplog.records)
    assert_nothing_held(restarted)


def test_with_every_checkpoint_damaged_the_second_turn_is_computed_from_its_first_token(
        lfm2, tmp_path):
    turn, second_prompt = first_turn_before_a_restart(lfm2, tmp_path)
    for boundary in (144, 160):
        damage(checkpoint_file(tmp_path, turn, boundary), "flipped")

    restarted = engine(lfm2, tmp_path)
    second = reply(restarted, second_prompt)

    assert second.num_cached_tokens == 0
    assert_same_reply(second, cold_reply(lfm2, second_prompt))
    assert restarted.engine.stats().disk_cache.errors == 2
    assert_nothing_held(restarted)


def test_a_checkpoint_pushed_out_of_memory_is_read_back_from_disk(lfm2, tmp_path):
    """One sequence at a time keeps two checkpoint slots: a second chat's checkpoints push the
    first's out of memory, whose blocks stay; its next turn restores its checkpoint from disk."""
    llm = engine(lfm2, tmp_path, max_num_seqs=1)
    assert llm.engine.kv_cache.checkpoints.num_slots == 2
    texts = texts_of(lfm2)
    prompt = texts[0][:150]
    turn = prompt + list(reply(llm, prompt).outputs[0].token_ids)
    reply(llm, texts[2][:150])
    llm.engine.disk_cache.flush(10)

    second_prompt = turn + texts[1][:20]
    second = reply(llm, second_prompt)

    assert second.num_cached_tokens == 160
    assert_same_reply(second, cold_reply(lfm2, second_prompt))
    assert_nothing_held(llm)


def test_checkpoints_and_blocks_share_the_disks_budget(lfm2, tmp_path):
    probe = engine(lfm2, None)
    block_bytes = probe.engine.runner.bytes_per_block()
    state_bytes = probe.engine.runner.bytes_per_state_slot
    cap = 12 * block_bytes + 2 * state_bytes
    llm = engine(lfm2, tmp_path, disk_cache_bytes=cap)
    texts = texts_of(lfm2)
    for text in texts[:4]:
        reply(llm, text[:150])
        llm.engine.disk_cache.flush(10)
        assert llm.engine.stats().disk_cache.size_bytes <= cap
    llm.engine.close()
    assert sum(f.stat().st_size for f in tmp_path.rglob("*.kv")) <= cap

    # What the budget kept (the latest chat's files) still gives the cold engine's replies.
    restarted = engine(lfm2, tmp_path, disk_cache_bytes=cap)
    for text in (texts[3], texts[0]):
        prompt = text[:150] + texts[4][:10]
        assert_same_reply(reply(restarted, prompt), cold_reply(lfm2, prompt))
    assert_nothing_held(restarted)


def test_preempted_and_aborted_requests_with_a_disk_tier_leave_no_slot_held(lfm2, tmp_path,
                                                                            monkeypatch):
    """22 blocks hold the longest request but not all five at once: the newest are
    preempted, and resume from their checkpoints; then three requests are aborted midway.
    What they saved is found after a restart."""
    # Preempted requests read blocks back from disk, and on this tiny model reading a block
    # is measured slower than computing it: the tier would stop saving.
    monkeypatch.setattr(DiskPrefixCache, "pays", property(lambda self: True))
    texts = texts_of(lfm2)
    prompts = [p[:n] for p, n in zip(texts, (300, 20, 150, 64, 97), strict=True)]
    want = [cold_reply(lfm2, p) for p in prompts]
    llm = engine(lfm2, tmp_path, num_kv_blocks=22)
    for got, alone in zip(llm.generate(prompts, GREEDY_LOGPROBS), want, strict=True):
        assert_same_reply(got, alone)
    assert llm.stats().num_preemptions > 0
    assert_nothing_held(llm)

    e = llm.engine
    for i, prompt in enumerate(texts[:3]):
        e.add_request(str(i), prompt[:100] + [7], GREEDY_LOGPROBS)
    for _ in range(6):
        e.step()
    for i in range(3):
        e.abort_request(str(i))
    assert not e.has_unfinished_requests()
    assert_nothing_held(llm)
    e.close()

    restarted = engine(lfm2, tmp_path, num_kv_blocks=22)
    again = reply(restarted, prompts[2])
    assert again.num_cached_tokens == 144
    assert_same_reply(again, want[2])


def test_deleting_a_chat_removes_its_checkpoints_with_its_blocks(lfm2, tmp_path):
    texts = texts_of(lfm2)
    prompt = texts[0][:150]
    llm = engine(lfm2, tmp_path)
    llm.engine.add_request("r", prompt, GREEDY_LOGPROBS, cache_tag="chat-1")
    while llm.engine.has_unfinished_requests():
        outputs = llm.engine.step()
    turn = prompt + list(outputs[0].outputs[0].token_ids)
    llm.engine.close()
    assert checkpoint_files(tmp_path, turn, 144) and checkpoint_files(tmp_path, turn, 160)

    forget_tag(tmp_path, "chat-1")

    assert not list(tmp_path.rglob("*.kv"))
