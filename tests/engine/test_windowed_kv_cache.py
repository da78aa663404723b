"""A model whose layers attend in two ways (a Qwen3 whose first layer has an 8-token sliding
window, its second every key, as Gemma 3 mixes them) in KV cache groups: its windowed layer gives
blocks back while a sequence runs, and nothing a user sees changes for it: greedy
tokens equal transformers' and a run that keeps every block, prefix hits give the same tokens,
and preemption under a small pool completes."""

import pytest

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.core.kv_cache_manager import KVCacheGroup
from pagoda.engine.core.sequence import NULL_BLOCK
from tests.engine.hf_reference import load_hf_model
from tests.engine.models.test_parity import (
    assert_greedy_parity,
    parity_prompts,
    save_tiny_variant,
)

BLOCK_SIZE = 4  # the 8-token window spans two or three blocks
ENGINE = {"num_threads": 1, "block_size": BLOCK_SIZE}
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory, default_model):
    return save_tiny_variant(tmp_path_factory, default_model.path, "qwen3-window8-first")


@pytest.fixture(scope="module")
def prompts(default_model) -> list[list[int]]:
    return parity_prompts(default_model.tokenizer)[:3]


def _keeping_every_block(monkeypatch):
    """The runner's groups as before windows released anything: each keeps every block, in a
    pool as large as the first group's."""
    monkeypatch.setattr("pagoda.engine.worker.model_runner.KVCacheGroup",
                        lambda n, window, size: KVCacheGroup(n, 0, size))
    monkeypatch.setattr("pagoda.engine.models.kv_cache_sizing.window_blocks_wanted",
                        lambda window, config: 1 << 30)


def test_windowed_layers_give_their_blocks_back_during_a_long_reply(hybrid, prompts):
    llm = LLM(str(hybrid), num_kv_blocks=64, **ENGINE)
    kv = llm.engine.kv_cache
    windowed_layers = [layers for window, layers in llm.engine.runner.kv_layout if window]
    assert windowed_layers == [(0,)]
    llm.engine.add_request("long", prompts[0], SamplingParams(temperature=0, max_tokens=60,
                                                              ignore_eos=True))
    held = []
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
        held.append([p.num_blocks - p.num_free_blocks for p in kv.pools])
    # Seen after each step: the next-to-last one computed all but the last two tokens.
    context = len(prompts[0]) + 60
    assert max(full for full, _ in held) == -(-(context - 2) // BLOCK_SIZE)
    # After the prompt, a step's token sees 8 keys: at most three blocks, whatever the length.
    assert max(windowed for _, windowed in held[2:-1]) <= 3
    assert held[-1] == [0, 0]


def test_greedy_tokens_equal_transformers_and_a_run_keeping_every_block(
        hybrid, prompts, monkeypatch):
    windowed = LLM(str(hybrid), num_kv_blocks=64, max_num_batched_tokens=16, **ENGINE)
    assert_greedy_parity(windowed, load_hf_model(hybrid), prompts)
    ours = [o.outputs[0].token_ids for o in windowed.generate(prompts, GREEDY)]
    _keeping_every_block(monkeypatch)
    keeping = LLM(str(hybrid), num_kv_blocks=64, max_num_batched_tokens=16, **ENGINE)
    assert keeping.engine.kv_cache.pools[1].num_blocks == 64
    assert [o.outputs[0].token_ids for o in keeping.generate(prompts, GREEDY)] == ours


def test_a_prompt_sharing_a_long_prefix_reuses_each_groups_blocks_and_gets_the_same_tokens(
        hybrid, prompts):
    llm = LLM(str(hybrid), num_kv_blocks=64, **ENGINE)
    cold = LLM(str(hybrid), num_kv_blocks=64, enable_prefix_caching=False, **ENGINE)
    first = prompts[2]
    llm.generate(first, GREEDY)
    second = first + prompts[1]
    llm.engine.add_request("second", second, GREEDY)
    llm.engine.step()
    seq = llm.engine.scheduler.running[0]
    hit = seq.num_cached_tokens
    assert hit == (len(first) - 1) // BLOCK_SIZE * BLOCK_SIZE
    # The windowed group took only the blocks of the window at the hit, none before it.
    taken = seq.windowed_block_ids[0][:hit // BLOCK_SIZE]
    assert taken[:-3] == [NULL_BLOCK] * (len(taken) - 3) and NULL_BLOCK not in taken[-2:]
    out = []
    while llm.engine.has_unfinished_requests():
        out += [o for o in llm.engine.step() if o.finished]
    assert out[0].outputs[0].token_ids == cold.generate(second, GREEDY)[0].outputs[0].token_ids


def test_preemption_under_a_small_pool_completes_with_the_same_tokens(hybrid, prompts):
    roomy = LLM(str(hybrid), num_kv_blocks=128, **ENGINE)
    small = LLM(str(hybrid), num_kv_blocks=40, **ENGINE)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, GREEDY)]
    assert [o.outputs[0].token_ids for o in small.generate(prompts, GREEDY)] == expected
    assert small.engine.stats().num_preemptions > 0
