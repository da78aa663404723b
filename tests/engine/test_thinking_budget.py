"""thinking_token_budget through the engine on the real model, under a chat template that opens
`<think>` at the prompt's end: a reply that reasons past its budget ends its reasoning after
exactly that many tokens and answers; one that closes in time is untouched; speculative decoding
gives what the plain run gives; a model without reasoning has none to cut."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from pagoda.engine import SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.llm import LLM
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.parsers.reasoning import ReasoningParser
from pagoda.engine.sampling.params import StructuredOutputsParams

# SmolLM2's ChatML, its reply opened inside <think> (as Qwen3's and the R1 distills' are).
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}<think>\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    "{#- the reasoning ends with </think> -#}")
ENGINE = {"num_kv_blocks": 64, "num_threads": 1}
SPEC = {**ENGINE, "num_speculative_tokens": 4, "speculative_cost_model": False}
LONG = [{"role": "user", "content": "What is 2+2? Think step by step."}]
# Earlier replies that reason briefly, so the model closes its own reasoning in time.
SHOTS = [message for question, thought, answer in [
    ("What is 1+1?", "Add one and one.", "2"), ("What is 3+3?", "Add three and three.", "6"),
    ("What is 2+5?", "Add two and five.", "7")]
    for message in ({"role": "user", "content": question},
                    {"role": "assistant", "content": f"{thought}\n</think>\n\n{answer}"})]
BRIEF = [*SHOTS, {"role": "user", "content": "What is 4+4?"}]


def thinking_model(default_model):
    tokenizer = copy.deepcopy(default_model.tokenizer)
    tokenizer.chat_template = THINKING_TEMPLATE
    return replace(default_model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def llm(default_model) -> LLM:
    return LLM.from_engine(LLMEngine(config=EngineConfig(**ENGINE),
                                     loaded=thinking_model(default_model)))


@pytest.fixture(scope="module")
def speculating(default_model) -> LLM:
    return LLM.from_engine(LLMEngine(config=EngineConfig(**SPEC),
                                     loaded=thinking_model(default_model)))


def greedy(llm: LLM, messages, **params):
    return llm.chat(messages, SamplingParams(temperature=0, **params)).outputs[0]


def closing_ids(llm: LLM) -> list[int]:
    tokenizer = llm.tokenizer
    before = tokenizer.encode("so", add_special_tokens=False)
    return tokenizer.encode("so\n</think>", add_special_tokens=False)[len(before):]


def test_a_reply_reasoning_past_its_budget_closes_after_exactly_n_tokens_then_answers(llm):
    # Its decode steps run in the one-call C step, which computes the logits the controls cut.
    assert llm.engine.runner.model.native_decode is not None
    free = greedy(llm, LONG, max_tokens=40)
    assert "</think>" not in free.text[:40]  # left alone, it reasons on past 10 tokens
    cut = greedy(llm, LONG, max_tokens=40, thinking_token_budget=10)
    closing = closing_ids(llm)
    assert cut.token_ids[:10] == free.token_ids[:10]
    assert cut.token_ids[10:10 + len(closing)] == closing
    reasoning, answer = ReasoningParser().split(cut.text, starts_in_reasoning=True)
    assert reasoning == llm.tokenizer.decode(free.token_ids[:10]) + "\n"
    assert answer.strip()


def test_a_reply_that_closes_its_reasoning_in_time_is_untouched(llm):
    free = greedy(llm, BRIEF, max_tokens=20)
    reasoning, answer = ReasoningParser().split(free.text, starts_in_reasoning=True)
    assert reasoning == "Add four and four.\n" and answer == "8"  # six reasoning tokens
    for budget in (6, 7, 100):
        assert greedy(llm, BRIEF, max_tokens=20, thinking_token_budget=budget).token_ids == \
            free.token_ids


def test_a_sampled_reply_is_cut_after_as_many_tokens(llm):
    params = {"temperature": 0.8, "seed": 7, "max_tokens": 24}
    free = llm.chat(LONG, SamplingParams(**params)).outputs[0]
    cut = llm.chat(LONG, SamplingParams(**params, thinking_token_budget=8)).outputs[0]
    reasoned = llm.tokenizer.decode(free.token_ids[:8])
    assert "</" not in reasoned
    assert cut.token_ids[:8] == free.token_ids[:8]  # the same draws until the budget ends
    closing = closing_ids(llm)[1:] if reasoned.endswith("\n") else closing_ids(llm)
    assert cut.token_ids[8:8 + len(closing)] == closing


def test_a_budget_of_zero_answers_at_once(llm):
    reply = greedy(llm, LONG, max_tokens=12, thinking_token_budget=0)
    assert reply.token_ids[:len(closing_ids(llm))] == closing_ids(llm)
    assert ReasoningParser().split(reply.text, starts_in_reasoning=True)[0].strip() == ""


@pytest.mark.parametrize("budget", [3, 10, 100])
def test_speculative_decoding_gives_the_plain_runs_reply(llm, speculating, budget):
    for messages in (LONG, BRIEF):
        plain = greedy(llm, messages, max_tokens=32, thinking_token_budget=budget)
        assert greedy(speculating, messages, max_tokens=32,
                      thinking_token_budget=budget).token_ids == plain.token_ids
    assert speculating.stats().spec_accepted_tokens > 0  # drafts were verified, some kept


def test_a_model_without_reasoning_has_none_to_cut(make_llm):
    plain = make_llm(**ENGINE)
    assert greedy(plain, LONG, max_tokens=16, thinking_token_budget=2).token_ids == \
        greedy(plain, LONG, max_tokens=16).token_ids


def test_a_budget_with_a_constraint_is_refused():
    with pytest.raises(ValueError, match="thinking_token_budget.*structured_outputs"):
        SamplingParams(thinking_token_budget=8, structured_outputs=StructuredOutputsParams(regex="a"))
