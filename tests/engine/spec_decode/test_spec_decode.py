"""Speculative decoding on the real model: greedy output is the output without speculation.

Alone, in a batch of 16 mixed requests (prompts that repeat text, so drafts are accepted, and
open-ended chats; penalties, stop strings, different lengths), and in a KV pool so small that
requests are preempted. Stop strings that end inside a run of accepted drafts cut where they
would without speculation; the stats count what was proposed and accepted.
"""

from __future__ import annotations

import pytest

from pagoda.engine import SamplingParams
from pagoda.engine.text.chat_template import encode_chat
from tests.engine.test_batch_invariance import make_prompt

# See test_parity: on a small shared machine one thread is several times faster than two.
NUM_THREADS = 1
# Every draft found is verified, however many requests run and whatever it costs here: these
# tests are about verification (tests/engine/spec_decode/test_draft_policy.py is about when it pays).
SPEC = {"num_speculative_tokens": 4, "speculative_cost_model": False, "num_threads": NUM_THREADS}
OFF = {"num_threads": NUM_THREADS}

CODE = '''def allocate(self, seq, n):
    held = self.blocks.setdefault(seq.request_id, [])
    need = -(-(seq.num_computed_tokens + n) // self.block_size) - len(held)
    if need > self.pool.num_free_blocks:
        return False
    held.extend(self.pool.allocate(need))
    return True
'''
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. "
           "Ships passing the rocky cape at night looked for its beam, and none was lost while "
           "he kept it burning.")
CHATS = [
    f"Repeat this code exactly:\n\n{CODE}",
    f"Answer by quoting the passage. Passage: {PASSAGE}\nWhat did the keeper do every evening?",
    "Write a short story about a dragon who learns to bake bread.",
    "What is the capital of France?",
]


def greedy(max_tokens: int = 24, **params) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **params)


@pytest.fixture(scope="module")
def requests(default_model) -> list[tuple[list[int], SamplingParams]]:
    tokenizer = default_model.tokenizer
    prose = [make_prompt(tokenizer, n, i) for i, n in enumerate([300, 40, 120, 200, 60, 250])]
    chats = [encode_chat(tokenizer, [{"role": "user", "content": c}]) for c in CHATS]
    prompts = prose + chats + prose[:3] + chats[:3]
    params = [greedy(), greedy(32), greedy(16), greedy(repetition_penalty=1.3),
              greedy(presence_penalty=0.5, frequency_penalty=0.5), greedy(8),
              greedy(40), greedy(40), greedy(32), greedy(16),
              greedy(stop=["lamp"]), greedy(28, frequency_penalty=1.0), greedy(20),
              greedy(32, repetition_penalty=1.2), greedy(24, stop=["\n\n"]), greedy(12)]
    return list(zip(prompts, params, strict=True))


def token_ids(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def generate(llm, requests):
    return llm.generate([p for p, _ in requests], [s for _, s in requests])


@pytest.fixture(scope="module")
def reference(make_llm, requests):
    """The batch without speculation (batch invariance makes it each request's alone output)."""
    return generate(make_llm(**OFF), requests)


@pytest.mark.slow
def test_greedy_alone_is_identical_with_speculation(make_llm, requests, reference):
    # The reference batch holds what each request gives alone without speculation (batch
    # invariance, tests/engine/test_batch_invariance.py): no need to run each alone again.
    on = make_llm(**SPEC)
    for i in [0, 6, 7, 3]:
        prompt, params = requests[i]
        want = reference[i].outputs[0]
        got = on.generate([prompt], params)[0].outputs[0]
        assert (got.token_ids, got.text) == (want.token_ids, want.text)
    assert on.stats().spec_accepted_tokens > 0


@pytest.mark.slow
def test_greedy_batch_of_16_mixed_requests_is_identical_with_speculation(make_llm, requests,
                                                                        reference):
    llm = make_llm(**SPEC)
    outputs = generate(llm, requests)
    assert token_ids(outputs) == token_ids(reference)
    assert [o.outputs[0].text for o in outputs] == [o.outputs[0].text for o in reference]
    assert [o.outputs[0].finish_reason for o in outputs] == [
        o.outputs[0].finish_reason for o in reference]
    stats = llm.stats()
    assert stats.spec_accepted_tokens > 0
    assert stats.spec_acceptance_rate == stats.spec_accepted_tokens / stats.spec_draft_tokens
    assert sum(o.metrics.num_draft_tokens for o in outputs) == stats.spec_draft_tokens
    assert sum(o.metrics.num_accepted_tokens for o in outputs) == stats.spec_accepted_tokens


@pytest.mark.slow
def test_preempted_speculating_requests_resume_with_identical_tokens(make_llm, requests,
                                                                    reference):
    # 40 blocks hold the longest request but nowhere near all of them.
    llm = make_llm(num_kv_blocks=40, **SPEC)
    outputs = generate(llm, requests)
    assert llm.stats().num_preemptions > 0
    assert llm.stats().spec_accepted_tokens > 0
    assert token_ids(outputs) == token_ids(reference)


def stream_steps(engine, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    """The new tokens of each step of one request."""
    engine.add_request("r", prompt, params)
    steps = []
    while engine.has_unfinished_requests():
        steps += [out.outputs[0].delta_token_ids for out in engine.step()]
    return [s for s in steps if s]


@pytest.mark.slow
def test_a_stop_string_inside_an_accepted_run_cuts_where_it_would_without_speculation(
        make_engine, make_llm, requests, default_model):
    prompt, _ = requests[0]
    tokenizer = default_model.tokenizer
    steps = stream_steps(make_engine(**SPEC), prompt, greedy(32))
    tokens = [t for s in steps for t in s]
    # A token in the middle of a run: the stop string is the text it completes.
    ends = [len(tokens) - sum(len(s) for s in steps[i:]) + j
            for i, s in enumerate(steps) if len(s) >= 3 for j in range(1, len(s) - 1)]
    stop = next(text[-4:] for end in ends
                if (text := tokenizer.decode(tokens[:end + 1])).strip()
                and text[-4:] not in tokenizer.decode(tokens[:end]))
    want = make_llm(**OFF).generate([prompt], greedy(32, stop=[stop]))[0].outputs[0]
    got = make_llm(**SPEC).generate([prompt], greedy(32, stop=[stop]))[0].outputs[0]
    assert want.finish_reason == "stop" and stop not in want.text
    assert (got.token_ids, got.text, got.finish_reason) == (
        want.token_ids, want.text, want.finish_reason)
    assert len(got.token_ids) < len(tokens)


def test_seeded_sampling_with_speculation_repeats_itself(make_llm, requests):
    prompt, _ = requests[6]
    params = SamplingParams(temperature=0.8, seed=11, max_tokens=24)
    llm = make_llm(**SPEC)
    first, second = (llm.generate([prompt], params)[0] for _ in range(2))
    assert first.outputs[0].token_ids == second.outputs[0].token_ids
    assert first.metrics.num_draft_tokens > 0


def test_stats_say_none_while_speculation_is_off(make_llm, requests):
    llm = make_llm(**OFF)
    out = llm.generate([requests[1][0]], greedy(4))[0]
    stats = llm.stats()
    assert (stats.spec_draft_tokens, stats.spec_accepted_tokens) == (0, 0)
    assert stats.spec_acceptance_rate is None
    assert out.metrics.num_draft_tokens == 0 and out.metrics.spec_acceptance_rate is None
