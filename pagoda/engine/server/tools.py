"""A chat request's tools and tool_choice, checked as OpenAI checks them, as a ToolUse
(pagoda/engine/parsers/tool_use.py)."""

from __future__ import annotations

import logging

from pagoda.engine.errors import StructuredOutputError
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.sampling.params import MAX_CONSTRAINT_CHARS, StructuredOutputsParams
from pagoda.engine.server.errors import APIError
from pagoda.engine.server.protocol import ChatCompletionRequest, NamedToolChoice
from pagoda.engine.structured_output.json_schema import check_schema
from pagoda.engine.text.bounded_json import MAX_JSON_DEPTH, value_depth

logger = logging.getLogger(__name__)


def tool_use(body: ChatCompletionRequest) -> ToolUse:
    """The request's tools and tool_choice, checked as OpenAI checks them."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    choice = body.tool_choice
    if not tools:
        if choice is not None:
            # Clients send it with no tools (LlamaIndex's structured_predict sends "required"):
            # with nothing to choose among, the reply is plain text, as llama.cpp's server
            # answers. OpenAI refuses it; refusing broke those clients' default path.
            logger.info("tool_choice without tools: answered as a chat without tools")
        return ToolUse("none", None)
    _check_tools(tools)
    if isinstance(choice, NamedToolChoice):
        return _named(choice, tools, body.parallel_tool_calls)
    mode = choice or "auto"
    if mode not in ("none", "auto", "required"):
        raise APIError(400, f"tool_choice={mode!r} is not one of 'none', 'auto', 'required' or "
                            "a named function", param="tool_choice")
    return ToolUse(mode, None if mode == "none" else tools, parallel=body.parallel_tool_calls)


def _check_tools(tools: list[dict]) -> None:
    names = set()
    for i, tool in enumerate(tools):
        if tool["type"] != "function":
            raise APIError(400, f"tools[{i}].type={tool['type']!r}: only 'function' tools are "
                                "supported", param=f"tools[{i}].type")
        depth = value_depth(tool["function"].get("parameters"))
        if depth > MAX_JSON_DEPTH:
            field = f"tools[{i}].function.parameters"
            raise APIError(400, f"{field} nests {depth:,} levels deep: at most {MAX_JSON_DEPTH} "
                                "are read", param=field)
        name = tool["function"]["name"]
        if name in names:
            raise APIError(400, f"tools[{i}] repeats the function name {name!r}",
                           param=f"tools[{i}].function.name")
        names.add(name)


def _named(choice: NamedToolChoice, tools: list[dict], parallel: bool) -> ToolUse:
    if choice.type != "function":
        raise APIError(400, f"tool_choice.type={choice.type!r}: only 'function' is supported",
                       param="tool_choice.type")
    if choice.function.name not in {t["function"]["name"] for t in tools}:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not among "
                            "the tools", param="tool_choice.function.name")
    return ToolUse("named", tools, choice.function.name, parallel)


def tools_constraint(use: ToolUse) -> tuple[str, StructuredOutputsParams] | None:
    """The constraint tool_choice "required" or a named function puts on the reply, with the
    field its errors name (the named function's parameters, or the tools); None otherwise."""
    if use.mode not in ("required", "named"):
        return None
    names = [t["function"]["name"] for t in use.tools or []]
    if use.mode == "required":
        _check_parameters(use.tools or [])
    field = "tools" if use.mode == "required" else \
        f"tools[{names.index(use.function)}].function.parameters"
    try:
        return field, use.constraint
    except ValueError as exc:
        holds = "the calls of every tool" if use.mode == "required" else \
            f"the parameters of {use.function!r}"
        raise APIError(400, f"{field}: tool_choice {_choice_name(use)} holds the reply to "
                            f"{holds}, a JSON schema longer than the {MAX_CONSTRAINT_CHARS:,} "
                            "characters a constraint may have: give smaller parameters"
                            f"{' or fewer tools' if use.mode == 'required' else ''}, or use "
                            "tool_choice 'auto'", param=field) from exc


def _check_parameters(tools: list[dict]) -> None:
    """Each tool's parameters as the schema its calls are held to, so an error names the tool
    (under "required" they are compiled as one schema, a list of every tool's calls)."""
    for i, tool in enumerate(tools):
        parameters = tool["function"].get("parameters")
        if parameters is None:
            continue
        try:
            check_schema(parameters)
        except StructuredOutputError as exc:
            field = f"tools[{i}].function.parameters"
            raise APIError(400, f"{field}: {exc}", param=field) from exc


def _choice_name(use: ToolUse) -> str:
    return "'required'" if use.mode == "required" else f"naming {use.function!r}"
