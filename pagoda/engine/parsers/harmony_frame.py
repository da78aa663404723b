"""A constraint inside a harmony reply's frame (pagoda/engine/parsers/harmony.py), as a structural tag
(xgrammar's JSON, compiled by pagoda/engine/structured_output/compiler.py).

The prompt ends with `<|start|>assistant`, so a reply may write one analysis message (its
reasoning, any text up to `<|end|>`) and then, under tool_choice "required" or a named
function, one call `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`
followed by JSON arguments that fit NAME's parameters; under a response format (or any other
constraint) one final message `<|channel|>final<|message|>` whose text is what the constraint
allows. The grammar then ends, so only a stop token may follow (`<|call|>`, `<|return|>`).
A harmony turn ends at its first call, so "required" is exactly one call. The frame's tokens
cannot come inside the analysis text (the parser would take them for a frame). JSON strings are
held to their schema alone: xgrammar can keep text out of a JSON string only by dropping the
string's minLength and maxLength, and a model has no reason to write a frame token there."""

from __future__ import annotations

import json

from pagoda.engine.parsers.harmony import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.sampling.params import StructuredOutputsParams

_FRAME_TOKENS = [START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN]
_ANALYSIS = {"type": "optional", "content": {"type": "sequence", "elements": [
    {"type": "tag", "begin": f"{CHANNEL}analysis{MESSAGE}",
     "content": {"type": "any_text", "excludes": [t for t in _FRAME_TOKENS if t != END]},
     "end": END},
    {"type": "const_string", "value": f"{START}assistant"}]}}
_FINAL = f"{CHANNEL}final{MESSAGE}"


def framed(constraint: StructuredOutputsParams | None, use: ToolUse) -> StructuredOutputsParams:
    """The reply's constraint under harmony: the tool choice's call ("required", a named
    function), else `constraint` as the final message's text."""
    if use.mode in ("named", "required"):
        names = [use.function] if use.mode == "named" else \
            [tool["function"]["name"] for tool in use.tools or []]
        answer = {"type": "or", "elements": [_call(name, use.parameters(name)) for name in names]}
    else:
        assert constraint is not None, "a harmony reply is framed only around a constraint"
        answer = {"type": "sequence", "elements": [
            {"type": "const_string", "value": _FINAL}, _text_format(constraint)]}
    tag = {"type": "structural_tag",
           "format": {"type": "sequence", "elements": [_ANALYSIS, answer]}}
    return StructuredOutputsParams(structural_tag=json.dumps(tag, ensure_ascii=False))


def _call(name: str | None, parameters: dict) -> dict:
    header = f"{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}"
    return {"type": "sequence", "elements": [
        {"type": "const_string", "value": header}, _json(parameters)]}


def _json(schema: dict | str | None) -> dict:
    return {"type": "json_schema", "json_schema": schema}


def _text_format(constraint: StructuredOutputsParams) -> dict:
    """The constraint as a structural tag's format of the same sentences."""
    kind = constraint.kind
    if kind == "json":
        return _json(constraint.json)
    if kind == "json_object":
        return _json({"type": "object"})
    if kind == "regex":
        return {"type": "regex", "pattern": constraint.regex}
    if kind == "grammar":
        return {"type": "grammar", "grammar": constraint.grammar}
    if kind == "choice":
        return {"type": "or", "elements": [
            {"type": "const_string", "value": choice} for choice in constraint.choice or ()]}
    raise ValueError("a structural tag describes a whole reply, frame and all: it cannot be the "
                     "text of a harmony reply's final message")
