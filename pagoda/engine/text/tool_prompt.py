"""Tools in the prompt. A chat template that takes `tools` renders them and the calls in the
history its own way; for one that does not (the bundled SmolLM2's plain ChatML), the tools are
described in a system message in the Hermes style (`<tool_call>` JSON), which the hermes
parser (pagoda/engine/parsers) reads back, and past calls and results are written the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pagoda.engine.text import bounded_json

# The instructions of the fallback: what a tool is, and how to call one.
_INSTRUCTIONS = (
    "You can call functions to answer. These are the functions, one JSON signature per line, "
    "inside <tools></tools>:\n<tools>\n{signatures}\n</tools>\n\n"
    "To call a function, answer with a JSON object holding its name and its arguments inside "
    "<tool_call></tool_call> tags, one tag pair per call:\n<tool_call>\n"
    '{{"name": "the function\'s name", "arguments": {{"argument": "value"}}}}\n</tool_call>')


def template_takes_tools(chat_template: str) -> bool:
    """Whether a chat template reads the `tools` it is given (it names them)."""
    return "tools" in chat_template


def template_messages(messages: Sequence[Mapping]) -> list[dict]:
    """Messages as chat templates read them: a call's arguments as a mapping (templates write
    them with `tojson`; OpenAI sends them as JSON text) and no None content. The reasoning
    before a call is also `thinking`, where gpt-oss's template reads it (it keeps a call's
    reasoning until an answer follows, and refuses a call message with both content and
    thinking, so a call that came with text keeps its text alone)."""
    out = []
    for message in messages:
        m = dict(message)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [_with_parsed_arguments(call) for call in m["tool_calls"]]
            if m.get("reasoning_content") and not m["content"]:
                m.setdefault("thinking", m["reasoning_content"])
        out.append(m)
    return out


def needs_hermes_style(chat_template: str, messages: Sequence[Mapping],
                       tools: Sequence[Mapping] | None) -> bool:
    """Whether a chat must be written Hermes-style: its template takes no tools, and the chat
    offers tools or holds calls or their results (which such a template would drop)."""
    if template_takes_tools(chat_template):
        return False
    return bool(tools) or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def hermes_style_chat(messages: Sequence[Mapping], tools: Sequence[Mapping] | None) -> list[dict]:
    """The chat for a template without tools: the tools' system message first, if any tools
    (joined to the chat's own system message), past calls as <tool_call> text, results as
    <tool_response> user messages."""
    rest = list(messages)
    out: list[dict] = []
    if tools:
        signatures = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        system = _INSTRUCTIONS.format(signatures=signatures)
        if rest and rest[0].get("role") == "system":
            system = f"{rest.pop(0).get('content') or ''}\n\n{system}"
        out.append({"role": "system", "content": system})
    for message in rest:
        out.append(_plain_message(message))
    return out


def _plain_message(message: Mapping) -> dict:
    role, content = message.get("role"), message.get("content") or ""
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls = message.get("tool_calls") or []
    if calls:
        written = "\n".join(_call_text(call) for call in calls)
        content = f"{content}\n{written}" if content else written
    return {"role": role, "content": content}


def _call_text(call: Mapping) -> str:
    function = call.get("function", call)
    arguments = _parsed(function.get("arguments"))
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _with_parsed_arguments(call: Mapping) -> dict:
    call = dict(call)
    if isinstance(call.get("function"), Mapping):
        function = dict(call["function"])
        function["arguments"] = _parsed(function.get("arguments"))
        call["function"] = function
    return call


def _parsed(arguments: object) -> object:
    """JSON text of arguments as the object it spells; anything else as it is."""
    if isinstance(arguments, str):
        try:
            return bounded_json.loads(arguments)
        except ValueError:  # not JSON, or nested too deep to read back: kept as text
            return arguments
    return {} if arguments is None else arguments
