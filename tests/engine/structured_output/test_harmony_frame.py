"""Under gpt-oss's harmony format a constraint holds the reply's frame too: a forced call can
only be an optional analysis message, then the call's commentary frame and JSON arguments that
fit its parameters; a response format is the final message's text. Compiled against a small
tokenizer with harmony's special tokens (tests/engine/harmony_chat.py)."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr

from pagoda.engine.errors import StructuredOutputError
from pagoda.engine.llm import LLM
from pagoda.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from pagoda.engine.parsers.harmony import HarmonyParser
from pagoda.engine.parsers.harmony_frame import framed
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.sampling.params import StructuredOutputsParams
from pagoda.engine.structured_output.compiler import StructuredOutputCompiler
from pagoda.engine.structured_output.vocabulary import Vocabulary
from tests.engine.harmony_chat import harmony_tokenizer, stop_token_ids

WEATHER = {"type": "object", "properties": {
    "location": {"type": "string"},
    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["location", "unit"],
    "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string"}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
CALL = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
ARGUMENTS = '{"location": "Paris", "unit": "celsius"}'


@pytest.fixture(scope="module")
def compiler() -> StructuredOutputCompiler:
    tokenizer = harmony_tokenizer()
    return StructuredOutputCompiler(Vocabulary(tokenizer, len(tokenizer), stop_token_ids()))


def forced(name: str) -> StructuredOutputsParams:
    return framed(None, ToolUse("named", TOOLS, name))


def follows(compiled, text: str) -> bool:
    """Whether the grammar lets a reply write `text` (as the tokenizer writes it) and stop."""
    matcher = xgr.GrammarMatcher(compiled)
    tokens = harmony_tokenizer().encode(text, add_special_tokens=False)
    return all(matcher.accept_token(t) for t in tokens) and \
        matcher.accept_token(stop_token_ids()[1])


@pytest.mark.parametrize(("reply", "allowed"), [
    (ANALYSIS + CALL + ARGUMENTS, True),
    (CALL + ARGUMENTS, True),
    (CALL + '{"location": "Paris", "unit": "kelvin"}', False),
    (CALL + '{"location": "Paris"}', False),
    (CALL + ARGUMENTS + " and more", False),
    (CALL.replace("get_weather", "get_time") + '{"zone": "UTC"}', False),
    (ANALYSIS + "<|channel|>final<|message|>" + ARGUMENTS, False),
    (ANALYSIS, False),
    ("Sure! " + CALL + ARGUMENTS, False),
    # A frame token inside the analysis, which the parser would read as a new message.
    (ANALYSIS.replace("weather", "<|channel|>final") + CALL + ARGUMENTS, False),
])
def test_a_forced_call_allows_only_its_frame_with_valid_arguments(compiler, reply, allowed):
    assert follows(compiler.compile(forced("get_weather")), reply) is allowed


def allowed_tokens(matcher: xgr.GrammarMatcher, vocab_size: int) -> list[int]:
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    bits = (bitmask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].nonzero().flatten().tolist()


def sampled_reply(compiled, rng: random.Random, max_tokens: int = 600) -> str:
    """A reply drawn token by token from what the grammar allows, weighted toward `<|end|>`
    and JSON's punctuation so it ends soon; its text as the detokenizer shows it."""
    tokenizer = harmony_tokenizer()
    matcher = xgr.GrammarMatcher(compiled)
    stops = set(stop_token_ids())
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    punctuation = set(tokenizer.convert_tokens_to_ids(list('"{}:,')))
    written: list[int] = []
    for _ in range(max_tokens):
        choices = allowed_tokens(matcher, len(tokenizer))
        weights = [40 if t == end else 10 if t in punctuation else 1 for t in choices]
        token = rng.choices(choices, weights)[0]
        assert matcher.accept_token(token)
        if token in stops:
            return tokenizer.decode(written, skip_special_tokens=False)
        written.append(token)
    raise AssertionError(f"no stop token in {max_tokens} tokens: {tokenizer.decode(written)!r}")


FORCED_CALL = re.compile(r"(<\|channel\|>analysis<\|message\|>(?:(?!<\|end\|>).)*"
                         r"<\|end\|><\|start\|>assistant)?" + re.escape(CALL) + "(.*)",
                         re.DOTALL)


def test_every_reply_sampled_under_a_forced_call_is_that_call_with_fitting_arguments(compiler):
    compiled = compiler.compile(forced("get_weather"))
    rng = random.Random(0)
    with_reasoning = read_back = 0
    for _ in range(12):
        reply = sampled_reply(compiled, rng)
        frame = FORCED_CALL.fullmatch(reply)
        assert frame is not None, reply
        jsonschema.validate(json.loads(frame[2]), WEATHER)
        with_reasoning += frame[1] is not None
        if "<|" not in frame[2]:  # a frame token in a JSON string is not excluded (see framed)
            parts = HarmonyParser().parse(reply)
            assert [(c.name, c.arguments) for c in parts.tool_calls] == [("get_weather",
                                                                           frame[2])]
            assert parts.content is None
            read_back += 1
    assert 0 < with_reasoning < 12  # the analysis message may come or not
    assert read_back


def test_a_forced_call_holds_its_strings_to_their_lengths(compiler):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "maxLength": 4}},
        "required": ["code"]}}}]
    compiled = compiler.compile(framed(None, ToolUse("named", tools, "f")))
    header = CALL.replace("get_weather", "f")
    assert follows(compiled, header + '{"code": "abcd"}')
    assert not follows(compiled, header + '{"code": "abcde"}')


def test_tool_choice_required_under_harmony_is_one_call_of_any_tool(compiler):
    compiled = compiler.compile(framed(None, ToolUse("required", TOOLS)))
    time_call = CALL.replace("get_weather", "get_time") + '{"zone": "UTC"}'
    assert follows(compiled, CALL + ARGUMENTS)
    assert follows(compiled, ANALYSIS + time_call)
    assert not follows(compiled, CALL + ARGUMENTS + "<|call|><|start|>assistant" + time_call)


def test_a_response_format_under_harmony_is_the_final_message(compiler):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"]}
    compiled = compiler.compile(framed(StructuredOutputsParams(json=schema), ToolUse("none", None)))
    final = '<|channel|>final<|message|>{"answer": 4}'
    assert follows(compiled, ANALYSIS + final)
    assert follows(compiled, final)
    assert not follows(compiled, '<|channel|>final<|message|>{"answer": "four"}')
    assert not follows(compiled, '{"answer": 4}')
    parts = HarmonyParser().parse(sampled_reply(compiled, random.Random(1)))
    jsonschema.validate(json.loads(parts.content), schema)


def test_a_regex_under_harmony_holds_the_final_message(compiler):
    compiled = compiler.compile(framed(StructuredOutputsParams(regex="(yes|no)"),
                                       ToolUse("none", None)))
    assert follows(compiled, "<|channel|>final<|message|>yes")
    assert not follows(compiled, "<|channel|>final<|message|>maybe")


def test_a_schema_keyword_the_grammar_cannot_hold_is_named_inside_the_frame(compiler):
    tools = [{"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}]
    with pytest.raises(StructuredOutputError, match="uniqueItems"):
        compiler.compile(framed(None, ToolUse("named", tools, "tag")))


class RecordingEngine:
    """Takes LLM.chat's requests, keeps their sampling, and finishes each at once."""

    def __init__(self) -> None:
        self.tokenizer = harmony_tokenizer()
        self.params = []
        self._waiting: list[str] = []

    def add_request(self, request_id, prompt, params) -> None:
        self.params.append(params)
        self._waiting.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting)

    def step(self) -> list[RequestOutput]:
        done, self._waiting = self._waiting, []
        return [RequestOutput(i, None, [], [CompletionOutput(0, "", [], "stop")], True, 0,
                              RequestMetrics(0.0)) for i in done]

    def abort_request(self, request_id) -> None:
        pass


def test_llm_chat_puts_a_response_format_inside_a_harmony_models_frame(compiler):
    engine = RecordingEngine()
    LLM.from_engine(engine).chat(
        [{"role": "user", "content": "Sum?"}],
        response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}})
    compiled = compiler.compile(engine.params[0].structured_outputs)
    assert follows(compiled, '<|channel|>final<|message|>{"sum": 4}')
    assert not follows(compiled, '{"sum": 4}')
