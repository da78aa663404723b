"""The prefix cache's disk tier in the engine: blocks saved by one engine are found by the next
(another process included), give the same tokens as recomputing, are never found by another
model, a block that cannot be read is recomputed, and a prompt's blocks are read ahead from
when it is added."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pagoda.engine.config import EngineConfig
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.sampling.params import SamplingParams
from tests.engine.tiny_models import save_tiny_model

BLOCK = 16
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
ENGINE = {"num_kv_blocks": 64, "num_threads": 1, "max_num_batched_tokens": 64}
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=0)


@pytest.fixture(scope="module")
def tiny_twin(tmp_path_factory) -> Path:
    """The same shape as `tiny`, other random weights."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama-twin"), "llama", seed=1)


def engine(model: Path, disk: Path | None, **config) -> LLMEngine:
    return LLMEngine(str(model), EngineConfig(**ENGINE, disk_cache_dir=disk, **config))


def generate(eng: LLMEngine, prompt: list[int], request_id: str = "r"):
    eng.add_request(request_id, prompt, GREEDY)
    return run_to_end(eng)


def run_to_end(eng: LLMEngine):
    """Step until every request is done; the last one's final output."""
    final = None
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                final = out
    return final


def history(n: int, start: int = 200) -> list[int]:
    return [start + (i * 7) % 300 for i in range(n)]


def saved_by_a_first_engine(model: Path, disk: Path, prompt: list[int]):
    """Answer `prompt` on an engine keeping its blocks in `disk`, then close it: its blocks are
    written. Returns the final output."""
    first = engine(model, disk)
    out = generate(first, prompt)
    first.close()
    return out


def test_a_new_engine_finds_the_blocks_the_last_one_saved_and_gives_the_same_tokens(tiny,
                                                                                     tmp_path):
    prompt = history(100)
    saved_by_a_first_engine(tiny, tmp_path, prompt)

    again = engine(tiny, tmp_path)
    longer = prompt + history(20, start=700)
    restored = generate(again, longer)
    recomputed = generate(engine(tiny, None), longer)

    assert restored.num_cached_tokens == 96  # the prompt's six full blocks
    assert restored.outputs[0].token_ids == recomputed.outputs[0].token_ids
    stats = again.stats().disk_cache
    assert stats.hits >= 6 and stats.num_blocks > 6 and stats.size_bytes > 0


def test_the_reply_is_saved_too_so_the_next_turn_finds_it(tiny, tmp_path):
    prompt = history(40)
    reply = saved_by_a_first_engine(tiny, tmp_path, prompt).outputs[0].token_ids

    turn = generate(engine(tiny, tmp_path), prompt + reply + history(20, start=900))

    assert turn.num_cached_tokens == (len(prompt) + len(reply) - 1) // BLOCK * BLOCK


def test_another_model_of_the_same_shape_finds_nothing(tiny, tiny_twin, tmp_path):
    saved_by_a_first_engine(tiny, tmp_path, history(100))

    twin = engine(tiny_twin, tmp_path)
    out = generate(twin, history(100))

    assert out.num_cached_tokens == 0
    assert twin.stats().disk_cache.hits == 0


def test_other_engine_settings_find_nothing(tiny, tmp_path):
    saved_by_a_first_engine(tiny, tmp_path, history(100))

    quantized = engine(tiny, tmp_path, quantization="int8")

    assert generate(quantized, history(100)).num_cached_tokens == 0


def test_a_kv_pool_of_another_dtype_finds_nothing(tiny, tmp_path):
    saved_by_a_first_engine(tiny, tmp_path, history(100))

    half = engine(tiny, tmp_path, kv_cache_dtype="float16")

    assert generate(half, history(100)).num_cached_tokens == 0
    half.close()
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 2  # one folder per fingerprint


def test_a_corrupt_block_is_recomputed_and_the_reply_is_the_same(tiny, tmp_path):
    prompt = history(100)
    saved_by_a_first_engine(tiny, tmp_path, prompt)
    files = sorted(tmp_path.rglob("*.kv"), key=lambda f: f.stat().st_mtime_ns)
    assert len(files) >= 6
    for file in files:  # every block: the first one read fails, and all after it are unused
        data = bytearray(file.read_bytes())
        data[-5] ^= 0xFF
        file.write_bytes(bytes(data))

    damaged = engine(tiny, tmp_path)
    out = generate(damaged, prompt)
    recomputed = generate(engine(tiny, None), prompt)

    assert out.num_cached_tokens == 0
    assert out.outputs[0].token_ids == recomputed.outputs[0].token_ids
    assert damaged.stats().disk_cache.errors >= 1


def test_the_disk_never_holds_more_than_its_cap_and_a_batch(tiny, tmp_path):
    probe = engine(tiny, None)
    block_bytes = probe.runner.bytes_per_block()
    cap = 10 * block_bytes
    eng = engine(tiny, tmp_path, disk_cache_bytes=cap)

    for n in range(8):
        generate(eng, history(80, start=100 + 37 * n), f"r{n}")
        eng.disk_cache.writer.flush(10)
        size = eng.stats().disk_cache.size_bytes
        assert size <= cap + (80 // BLOCK + 1) * (block_bytes + 4096)
    eng.close()
    on_disk = sum(f.stat().st_size for f in tmp_path.rglob("*.kv"))
    assert on_disk <= cap + 6 * (block_bytes + 4096)


def test_no_folder_means_no_disk_tier(tiny):
    eng = engine(tiny, None)

    assert eng.disk_cache is None and eng.stats().disk_cache is None


@pytest.mark.slow
def test_a_second_process_reuses_the_first_processes_blocks(tiny, tmp_path):
    prompt = history(100)
    script = textwrap.dedent(f"""
        from pagoda.engine.config import EngineConfig
        from pagoda.engine.llm_engine import LLMEngine
        from pagoda.engine.sampling.params import SamplingParams
        eng = LLMEngine({str(tiny)!r}, EngineConfig(**{ENGINE!r}, disk_cache_dir={str(tmp_path)!r}))
        eng.add_request("r", {prompt!r}, SamplingParams(temperature=0, max_tokens=4))
        while eng.has_unfinished_requests():
            eng.step()
        # No close(): what is still queued is written as the process exits.
    """)
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=300)

    out = generate(engine(tiny, tmp_path), prompt)

    assert out.num_cached_tokens == 96


def test_the_disk_is_left_alone_where_recomputing_is_faster_than_reading(tiny, tmp_path):
    prompt = history(100)
    saved_by_a_first_engine(tiny, tmp_path, prompt)
    eng = engine(tiny, tmp_path)
    eng.disk_cache.read_s_per_block = 1.0  # as on a fast GPU: a block reads slower than it computes
    eng.disk_cache.compute_s_per_token = 1e-6

    out = generate(eng, prompt + history(20, start=700))

    assert out.num_cached_tokens == 0
    assert eng.stats().disk_cache.hits == 0


def test_the_engine_measures_reading_and_recomputing_as_it_runs(tiny, tmp_path):
    saved_by_a_first_engine(tiny, tmp_path, history(100))
    eng = engine(tiny, tmp_path)

    generate(eng, history(100))  # read from disk
    generate(eng, history(130, start=5000))  # computed: 130 new tokens in chunks of 64

    disk = eng.disk_cache
    assert disk.read_s_per_block > 0 and disk.compute_s_per_token > 0
    assert disk.pays == (disk.read_s_per_block < disk.compute_s_per_token * BLOCK)


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_prompt_is_read_ahead_when_added_and_no_block_file_is_read_twice(tiny, tmp_path):
    prompt = history(100)
    saved_by_a_first_engine(tiny, tmp_path, prompt)
    eng = engine(tiny, tmp_path)
    read_ahead = eng.disk_cache.read_ahead

    eng.add_request("r", prompt, GREEDY)
    wait_until(lambda: read_ahead.stats().read == 6)  # before any step
    out = run_to_end(eng)

    assert out.num_cached_tokens == 96
    assert out.outputs[0].token_ids == generate(engine(tiny, None), prompt).outputs[0].token_ids
    assert read_ahead.stats().taken == 6
    assert eng.stats().disk_cache.hits == 6
    assert read_ahead.held_bytes == 0


def test_an_aborted_prompt_leaves_nothing_read_ahead(tiny, tmp_path):
    saved_by_a_first_engine(tiny, tmp_path, history(100))
    eng = engine(tiny, tmp_path)
    read_ahead = eng.disk_cache.read_ahead
    eng.add_request("r", history(100), GREEDY)
    wait_until(lambda: read_ahead.stats().read == 6)

    eng.abort_request("r")

    assert read_ahead.held_bytes == 0 and read_ahead.stats().dropped == 6
