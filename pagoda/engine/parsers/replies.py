"""A chat reply's text as OpenAI's assistant message: reasoning (`reasoning_content`), content
and tool calls, whole or as the deltas of a stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from pagoda.engine.parsers.harmony import REPLY_ENDS, HarmonyParser, is_harmony_template
from pagoda.engine.parsers.harmony_frame import framed
from pagoda.engine.parsers.listed_calls import ListedCallsParser
from pagoda.engine.parsers.reasoning import prompt_opens_reasoning, reasoning_parser_for_template
from pagoda.engine.parsers.repeated_calls import RepeatedCallGuard
from pagoda.engine.parsers.registry import tool_parser, tool_parser_for_template
from pagoda.engine.parsers.reply import ReplyDelta, ReplyParser
from pagoda.engine.parsers.tool_calls import ToolCall, ToolCallDelta, new_tool_call_id
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.text.tool_prompt import template_takes_tools


@dataclass(slots=True, frozen=True)
class ReplyShape:
    """How one request's replies are read: by its tool use, and by the parsers its model's
    template calls for (`parser` is empty where none apply)."""

    use: ToolUse
    parser: ReplyParser | HarmonyParser
    starts_in_reasoning: bool = False

    @property
    def has_reasoning(self) -> bool:
        return self.parser.has_reasoning

    @property
    def arguments_only(self) -> bool:
        """Whether the reply is the named function's arguments and nothing else (its
        constraint makes it so), rather than a call in the model's own frame (harmony's)."""
        return self.use.mode == "named" and not isinstance(self.parser, HarmonyParser)

    def adjusted(self, params: SamplingParams) -> SamplingParams:
        """The request's sampling with what reading its replies needs: the special tokens kept
        in the text where the parser's tags are special tokens (Mistral's, Llama 3's,
        harmony's), and under harmony its ends and frame (`_harmony_params`)."""
        if isinstance(self.parser, HarmonyParser):
            params = _harmony_params(params, self.use)
        if not self.parser.reads_special_tokens:
            return params
        return replace(params, skip_special_tokens=False)

    def repeat_guard(self) -> RepeatedCallGuard | None:
        """Under tool_choice "required" with parallel calls, a guard that ends the list of
        calls where the model writes one of them again (pagoda/engine/parsers/repeated_calls.py);
        None where the reply cannot repeat a call (one call at most, or the model's own frame)."""
        if self.use.mode != "required" or not self.use.parallel:
            return None
        return None if isinstance(self.parser, HarmonyParser) else RepeatedCallGuard()

    def message(self, text: str) -> dict:
        """The whole reply's `message`."""
        guard = self.repeat_guard()
        if guard is not None:
            text = guard.cut(text)
        if self.arguments_only:
            calls = [ToolCall(new_tool_call_id(), self.use.function or "", text)]
            return self._message(None, None, calls)
        parts = self.parser.parse(text, starts_in_reasoning=self.starts_in_reasoning)
        calls = parts.tool_calls if self.use.parallel else parts.tool_calls[:1]
        content = parts.content if calls else (parts.content or "")
        return self._message(parts.reasoning, content, calls)

    def streamer(self) -> ReplyStream:
        return ReplyStream(self)

    def reasoning_tokens(self, token_ids: list[int],
                         token_text: Callable[[list[int]], str]) -> int:
        """How many of a reply's tokens it took to write its reasoning: those up to the last
        that adds to it (its opening tags included, the closing ones not); 0 where the model
        does not reason. Found by halving, so a reply is decoded about log2(length) times."""
        if not self.has_reasoning or not token_ids:
            return 0

        def reasoned(length: int) -> int:
            parts = self.parser.parse(token_text(token_ids[:length]),
                                      starts_in_reasoning=self.starts_in_reasoning)
            return len(parts.reasoning or "")

        whole = reasoned(len(token_ids))
        if whole == 0:
            return 0
        low, high = 0, len(token_ids)  # reasoned(high) holds it all, reasoned(low) does not
        while high - low > 1:
            middle = (low + high) // 2
            if reasoned(middle) >= whole:
                high = middle
            else:
                low = middle
        return high

    def _message(self, reasoning: str | None, content: str | None,
                 calls: list[ToolCall]) -> dict:
        message: dict = {"role": "assistant", "content": content}
        if self.has_reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [_call(c) for c in calls]
        return message


class ReplyStream:
    """One choice's stream: each delta of text as the chunk's `delta` fields ({} when nothing
    can be sent yet: a possible tag held back), and whether the reply called a tool."""

    def __init__(self, shape: ReplyShape) -> None:
        self._shape = shape
        self._parsed = (None if shape.arguments_only else
                        shape.parser.streamer(starts_in_reasoning=shape.starts_in_reasoning))
        self._named_id: str | None = None
        self._guard = shape.repeat_guard()
        self.called = False

    @property
    def repeated(self) -> bool:
        """Whether the reply began a call it had written before: it is over."""
        return self._guard is not None and self._guard.repeated

    def feed(self, text: str) -> dict:
        if self._guard is not None:
            text = self._guard.feed(text)
        if not text:
            return {}
        if self._shape.arguments_only:
            return self._named(text)
        return self._fields(self._parsed.feed(text))

    def finish(self) -> dict:
        if self._parsed is None:
            return {}
        if self._guard is not None:
            held = self._fields(self._parsed.feed(self._guard.flush()))
            return joined_deltas(held, self._fields(self._parsed.finish()))
        return self._fields(self._parsed.finish())

    def _named(self, text: str) -> dict:
        self.called = True
        if self._named_id is None:
            self._named_id = new_tool_call_id()
            return {"tool_calls": [{"index": 0, "id": self._named_id, "type": "function",
                                    "function": {"name": self._shape.use.function,
                                                 "arguments": text}}]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}

    def _fields(self, delta: ReplyDelta) -> dict:
        fields: dict = {}
        if delta.reasoning:
            fields["reasoning_content"] = delta.reasoning
        if delta.content:
            fields["content"] = delta.content
        calls = [d for d in delta.tool_calls if self._shape.use.parallel or d.index == 0]
        if calls:
            self.called = True
            fields["tool_calls"] = [_call_delta(d) for d in calls]
        return fields


def _harmony_params(params: SamplingParams, use: ToolUse) -> SamplingParams:
    """A harmony reply ends at its call or its return whether or not the model's files name
    those stop tokens (a GGUF file may name `<|return|>` alone, and the model would write a
    tool's answer itself after its call); a constraint holds the frame too
    (pagoda/engine/parsers/harmony_frame.py)."""
    stop = params.stop + [end for end in REPLY_ENDS if end not in params.stop]
    constraint = params.structured_outputs
    if constraint is not None or use.constraint is not None:
        constraint = framed(constraint, use)
    return replace(params, stop=stop, structured_outputs=constraint)


def _call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _call_delta(delta: ToolCallDelta) -> dict:
    out: dict = {"index": delta.index}
    if delta.id is not None:
        out["id"], out["type"] = delta.id, "function"
    function: dict = {"arguments": delta.arguments}
    if delta.name is not None:
        function["name"] = delta.name
    out["function"] = function
    return out


def reply_shape(chat_template: str | None, use: ToolUse,
                prompt_tail: Callable[[], str]) -> ReplyShape:
    """How a model's replies are read: its template's reasoning tags (unless a tool constraint
    shapes the whole reply) and, under tool_choice "auto", its tool-call syntax. `prompt_tail`
    gives the prompt's last few tokens as text (does it open the reasoning?), asked only of a
    reasoning model. ValueError for "auto" with a template whose tool-call syntax no parser
    here reads. A harmony template's replies are read by its own parser whatever the tool use
    (pagoda/engine/parsers/harmony.py)."""
    template = chat_template or ""
    if is_harmony_template(template):
        return ReplyShape(use, HarmonyParser(reads_calls=use.mode != "none"))
    reasoning = None
    if use.mode not in ("named", "required"):
        reasoning = reasoning_parser_for_template(template)
    tools = None
    if use.mode == "required":
        tools = ListedCallsParser()
    if use.mode == "auto":
        tools = tool_parser_for_template(template)
        if tools is None:
            if template_takes_tools(template):
                raise ValueError("this model's chat template writes tool calls in a syntax "
                                 "Pagoda cannot read back: use tool_choice 'required' or a "
                                 "named function")
            tools = tool_parser("hermes")  # the fallback prompt asks for its syntax
    opens = reasoning is not None and prompt_opens_reasoning(prompt_tail(), reasoning)
    return ReplyShape(use, ReplyParser(reasoning, tools), opens)


def joined_deltas(first: dict, second: dict) -> dict:
    """Two deltas of one chunk as one: texts joined, tool call deltas in order."""
    joined = dict(first)
    for key, value in second.items():
        if key == "tool_calls":
            joined[key] = [*joined.get(key, []), *value]
        else:
            joined[key] = joined.get(key, "") + value
    return joined
