"""Replies under a constraint: always valid, and no different where they need not be."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from pagoda.engine.sampling.params import SamplingParams, StructuredOutputsParams
from tests.engine.structured_output.schemas import SCHEMAS
from tests.engine.test_batch_invariance import record_steps

PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                          "age": {"type": "integer"}},
          "required": ["name", "age"]}


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _json_params(schema, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 120)
    return SamplingParams(structured_outputs=StructuredOutputsParams(json=schema), **kw)


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(max_num_seqs=32)


@pytest.fixture(scope="module")
def speculating_llm(make_llm):
    """`llm` verifying three drafts a step, each one whatever it costs."""
    return make_llm(max_num_seqs=32, num_speculative_tokens=3, speculative_cost_model=False)


def test_a_schema_reply_parses_and_keeps_the_schemas_key_order(llm):
    out = llm.chat(_ask("Describe a person named John who is 25, as JSON."),
                   _json_params(PERSON, temperature=0)).outputs[0]
    reply = json.loads(out.text)
    jsonschema.validate(reply, PERSON)
    assert list(reply) == ["name", "age"]
    assert out.finish_reason == "stop"


def test_constrained_rows_in_a_batch_get_the_tokens_they_get_alone(llm):
    prompts = [_ask("Describe a person named Ann who is 31, as JSON."), _ask("Tell me a joke."),
               _ask("Is water wet? Answer yes or no."), _ask("Write the number seven.")]
    params = [_json_params(PERSON, temperature=0),
              SamplingParams(temperature=0, max_tokens=40),
              SamplingParams(temperature=0, max_tokens=10,
                             structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
              SamplingParams(temperature=0.8, seed=7, max_tokens=20,
                             structured_outputs=StructuredOutputsParams(regex=r"[0-9]+"))]
    together = [o.outputs[0].token_ids for o in llm.chat(prompts, params)]
    alone = [llm.chat(p, q).outputs[0].token_ids for p, q in zip(prompts, params, strict=True)]
    assert together == alone


def test_greedy_is_unchanged_where_the_free_reply_already_fits(llm):
    messages = _ask("What is the capital of France? One word.")
    free = llm.chat(messages, SamplingParams(temperature=0, max_tokens=20)).outputs[0]
    pattern = re.escape(free.text)
    constrained = llm.chat(messages, SamplingParams(
        temperature=0, max_tokens=20,
        structured_outputs=StructuredOutputsParams(regex=pattern))).outputs[0]
    assert free.finish_reason == "stop"
    assert constrained.token_ids == free.token_ids


def test_a_choice_reply_is_one_of_the_choices(llm):
    choices = ["red", "green", "blue", "a colour with \"quotes\""]
    outs = llm.chat([_ask("Pick a colour.")] * 6, [SamplingParams(
        temperature=1.0, seed=s, max_tokens=16,
        structured_outputs=StructuredOutputsParams(choice=choices)) for s in range(6)])
    assert all(o.outputs[0].text in choices for o in outs)


def test_a_reply_cut_by_max_tokens_mid_json_ends_with_length(llm):
    out = llm.chat(_ask("Describe a person as JSON."),
                   _json_params(PERSON, temperature=0, max_tokens=4)).outputs[0]
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


@pytest.mark.slow
def test_a_preempted_constrained_reply_resumes_where_its_grammar_was(make_llm, monkeypatch):
    schema = {"type": "object", "properties": {"items": {
        "type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}},
        "required": ["items"]}
    prompts = [_ask(f"List two things about topic {i} as JSON.") for i in range(3)]
    params = [_json_params(schema, temperature=0, max_tokens=40)] * len(prompts)
    roomy = make_llm(max_num_seqs=8, num_kv_blocks=64, num_threads=1)
    want = [out.outputs[0].token_ids for out in roomy.chat(prompts, params)]
    # Six 16-token blocks hold one ~75-token reply, not three: they are preempted and
    # recomputed mid-reply, and each must go on under its grammar as if it never stopped.
    llm = make_llm(max_num_seqs=8, num_kv_blocks=6, block_size=16, num_threads=1)
    steps = record_steps(llm, monkeypatch)
    outs = llm.chat(prompts, params)
    assert any(n > 0 for step in steps for n in step.preempted_num_outputs), (
        "no request was preempted after it had started its reply")
    assert [out.outputs[0].token_ids for out in outs] == want
    for out in outs:
        assert out.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.outputs[0].text), schema)


def test_an_aborted_constrained_request_frees_its_place(make_engine):
    engine = make_engine()
    engine.add_request("a", engine.tokenizer.encode("Hello"), _json_params(PERSON))
    engine.step()
    out = engine.abort_request("a")
    assert out.outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()


# One engine for the greedy and the sampled run of each kind: the sampled run reads the prompts'
# blocks the greedy one cached (~2,800 prompt tokens, a prefill each run of the suite did anew).
@pytest.mark.slow
@pytest.mark.parametrize(("temperature", "engine"), [(0.0, "llm"), (1.0, "llm"),
                                                     (0.0, "speculating_llm"),
                                                     (1.0, "speculating_llm")])
def test_every_schema_of_the_suite_gives_valid_json(request, temperature, engine):
    llm = request.getfixturevalue(engine)
    prompts = [_ask(f"Reply with JSON for this schema: {json.dumps(s)}") for s in SCHEMAS]
    params = [_json_params(s, temperature=temperature, seed=i, max_tokens=200)
              for i, s in enumerate(SCHEMAS)]
    finished = 0
    for schema, out in zip(SCHEMAS, llm.chat(prompts, params), strict=True):
        completion = out.outputs[0]
        assert completion.finish_reason in ("stop", "length"), completion.error
        if completion.finish_reason == "stop":
            jsonschema.validate(json.loads(completion.text), schema)
            finished += 1
    # A reply cut by max_tokens is unfinished JSON by design. Greedy ones all finish: JSON's
    # whitespace is bounded (MAX_JSON_WHITESPACE), where SmolLM2 looped on blank lines; a
    # sampled one may wander inside a long string.
    assert finished == len(SCHEMAS) if temperature == 0 else finished >= len(SCHEMAS) - 2


def test_llm_chat_takes_openais_response_format(llm):
    out = llm.chat(_ask("Describe a person named Eve who is 40, as JSON."),
                   SamplingParams(temperature=0, max_tokens=120),
                   response_format={"type": "json_schema",
                                    "json_schema": {"name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(out.outputs[0].text), PERSON)
    with pytest.raises(ValueError, match="both constrain"):
        llm.chat(_ask("Hi"), _json_params(PERSON), response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="response_format.type='xml'"):
        llm.chat(_ask("Hi"), response_format={"type": "xml"})
