"""Prefix caching: a chat's next turn and prompts sharing a system prompt reuse computed KV blocks.

Only full blocks whose KV was computed can be reused. A request computes the KV of every token but
the last one it samples: that token (EOS when a reply ends by itself) is returned without being fed
back to the model. So after turn 1 the cache holds `(len(prompt) + len(reply) - 1) // block_size`
blocks of it, one block fewer than a naive count when prompt plus reply fill whole blocks exactly.
"""

from dataclasses import dataclass

import pytest

from pagoda.engine import RequestOutput, SamplingParams
from pagoda.engine.text.chat_template import encode_chat

BLOCK_SIZE = 16
# One thread: with the two cores shared by other processes, two OpenMP threads spin against each
# other and a step gets ~30x slower.
ENGINE = {"num_kv_blocks": 64, "num_threads": 1, "block_size": BLOCK_SIZE}
GREEDY = SamplingParams(temperature=0, max_tokens=48)
TURN_1 = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
SYSTEM = ("You are Pagoda, a careful assistant running on the user's own laptop. Answer briefly, "
          "in plain words, and say so when you do not know something. Never invent facts.")


@dataclass
class TwoTurns:
    prompt_1: list[int]
    reply_1: list[int]
    prompt_2: list[int]
    turn_2: RequestOutput
    conversation_2: list[dict]
    eos_token_ids: frozenset[int]


@pytest.fixture(scope="module")
def two_turns(make_llm) -> TwoTurns:
    llm = make_llm(**ENGINE)
    turn_1 = llm.chat(TURN_1, GREEDY)
    conversation_2 = TURN_1 + [
        {"role": "assistant", "content": turn_1.outputs[0].text},
        {"role": "user", "content": "And the capital of Germany?"},
    ]
    turn_2 = llm.chat(conversation_2, GREEDY)
    return TwoTurns(turn_1.prompt_token_ids, turn_1.outputs[0].token_ids,
                    encode_chat(llm.tokenizer, conversation_2), turn_2, conversation_2,
                    llm.engine.eos_token_ids)


@pytest.mark.slow
def test_first_reply_ends_with_eos(two_turns):
    assert two_turns.reply_1[-1] in two_turns.eos_token_ids


@pytest.mark.slow
def test_chat_template_rerenders_first_turn_token_for_token(two_turns):
    turn_1 = two_turns.prompt_1 + two_turns.reply_1
    assert two_turns.prompt_2[:len(turn_1)] == turn_1


@pytest.mark.slow
def test_second_turn_reuses_every_computed_block_of_first_turn(two_turns):
    num_computed = len(two_turns.prompt_1) + len(two_turns.reply_1) - 1  # EOS is never fed back
    assert two_turns.turn_2.num_cached_tokens == num_computed // BLOCK_SIZE * BLOCK_SIZE
    naive = (len(two_turns.prompt_1) + len(two_turns.reply_1)) // BLOCK_SIZE * BLOCK_SIZE
    assert two_turns.turn_2.num_cached_tokens >= naive - BLOCK_SIZE


@pytest.mark.slow
@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_second_turn_matches_a_cold_engine(two_turns, make_llm, enable_prefix_caching):
    cold = make_llm(**ENGINE, enable_prefix_caching=enable_prefix_caching)
    out = cold.chat(two_turns.conversation_2, GREEDY)
    assert out.num_cached_tokens == 0
    assert out.outputs[0].token_ids == two_turns.turn_2.outputs[0].token_ids
    assert out.outputs[0].text == two_turns.turn_2.outputs[0].text


def test_last_sampled_token_is_never_cached(make_llm):
    llm = make_llm(**ENGINE)
    prompt = list(range(1000, 1040))
    first = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    turn_1 = prompt + first.outputs[0].token_ids
    assert len(turn_1) == 3 * BLOCK_SIZE
    second = llm.generate(turn_1 + [2000, 2001], SamplingParams(temperature=0, max_tokens=1))[0]
    # The third block holds the last sampled token, whose KV was never computed.
    assert second.num_cached_tokens == 2 * BLOCK_SIZE


def test_identical_prompt_recomputes_only_its_last_block(make_llm):
    llm = make_llm(**ENGINE)
    prompt = list(range(1000, 1000 + 3 * BLOCK_SIZE))
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    first, second = (llm.generate(prompt, params)[0] for _ in range(2))
    # The last prompt token is always recomputed: sampling needs its logits.
    assert second.num_cached_tokens == 2 * BLOCK_SIZE
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def shared_system_chats(tokenizer) -> tuple[list[list[int]], int]:
    """Two chats that differ only after a long system prompt, and their common prefix length."""
    prompts = [encode_chat(tokenizer, [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": question}])
               for question in ("Name a prime number.", "What colour is the sky?")]
    common = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    assert common >= 2 * BLOCK_SIZE, "the system prompt should span several blocks"
    return prompts, common


def test_requests_sharing_a_system_prompt_reuse_its_blocks(make_llm):
    llm = make_llm(**ENGINE)
    prompts, common = shared_system_chats(llm.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=1)
    first, second = (llm.generate(p, params)[0] for p in prompts)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == common // BLOCK_SIZE * BLOCK_SIZE


def test_live_requests_sharing_a_system_prompt_hold_the_same_blocks(make_engine):
    engine = make_engine(**ENGINE)
    prompts, common = shared_system_chats(engine.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("a", prompts[0], params)
    engine.step()  # a's whole prompt is computed (and its full blocks cached) in one step
    engine.add_request("b", prompts[1], params)
    engine.step()
    a, b = engine.scheduler.running
    num_shared = common // BLOCK_SIZE
    assert b.block_ids[:num_shared] == a.block_ids[:num_shared]
    assert not set(a.block_ids[num_shared:]) & set(b.block_ids[num_shared:])
    for request_id in ("a", "b"):
        engine.abort_request(request_id)
    assert engine.stats().kv_cache_usage == 0.0


def test_prefix_cache_hit_rate_counts_reused_prompt_tokens(make_llm):
    llm = make_llm(**ENGINE)
    prompts, common = shared_system_chats(llm.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(prompts[0], params)
    assert llm.stats().prefix_cache_hit_rate == 0.0
    llm.generate(prompts[1], params)
    hit = common // BLOCK_SIZE * BLOCK_SIZE
    assert llm.stats().prefix_cache_hit_rate == pytest.approx(
        hit / (len(prompts[0]) + len(prompts[1])))


def test_disabled_prefix_cache_reports_no_hits(make_llm):
    llm = make_llm(**ENGINE, enable_prefix_caching=False)
    prompts, _ = shared_system_chats(llm.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=1)
    outs = [llm.generate(p, params)[0] for p in (prompts[0], prompts[0], prompts[1])]
    assert [o.num_cached_tokens for o in outs] == [0, 0, 0]
    assert llm.stats().prefix_cache_hit_rate == 0.0
