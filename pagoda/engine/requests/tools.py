"""A request's tools and tool_choice, checked as OpenAI checks them, into a ToolUse
(pagoda/engine/parsers/tool_use.py), and the constraint a forced call puts on the reply.

The shapes are OpenAI's: a tool is {"type": "function", "function": {"name", "parameters",
...}}, tool_choice a mode or {"type": "function", "function": {"name": ...}}."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pagoda.engine.errors import RequestFieldError, StructuredOutputError
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.sampling.params import MAX_CONSTRAINT_CHARS, StructuredOutputsParams
from pagoda.engine.structured_output.json_schema import check_schema
from pagoda.engine.text.bounded_json import MAX_JSON_DEPTH, value_depth

logger = logging.getLogger(__name__)

# tool_choice's own words; a named function is an object.
TOOL_CHOICE_MODES = ("none", "auto", "required")


def tool_use(tools: Sequence[dict], tool_choice: str | Mapping | None,
             parallel: bool = True) -> ToolUse:
    """The tools and tool_choice as the prompt and the reply's reading take them;
    RequestFieldError for a tool that is not a function, has no name, repeats another's name
    or nests its parameters too deep, and for a tool_choice that is no mode or names no tool."""
    tools = list(tools)
    if not tools:
        if tool_choice is not None:
            # Clients send it with no tools (LlamaIndex's structured_predict sends "required"):
            # with nothing to choose among, the reply is plain text, as llama.cpp's server
            # answers. OpenAI refuses it; refusing broke those clients' default path.
            logger.info("tool_choice without tools: answered as a chat without tools")
        return ToolUse("none", None)
    check_tools(tools)
    if isinstance(tool_choice, Mapping):
        return ToolUse("named", tools, _named_function(tool_choice, tools), parallel)
    mode = tool_choice or "auto"
    if mode not in TOOL_CHOICE_MODES:
        raise RequestFieldError("tool_choice", f"tool_choice={mode!r} is not one of 'none', "
                                               "'auto', 'required' or a named function")
    return ToolUse(mode, None if mode == "none" else tools, parallel=parallel)


def forced_on_new_task(use: ToolUse, messages: Sequence[Mapping]) -> ToolUse:
    """The server's --force-tool-call: tools offered under "auto" become "required" where the
    chat asks something new, i.e. no tool's result came after the last assistant message (the
    first turn, or the user's next question). Once a call's result is back the model chooses
    again, so an agent's loop ends. Small local models often answer a task without looking at
    it; an agent's first step is then a real call. "none" and a named function stay the
    client's."""
    if use.mode != "auto":
        return use
    for message in reversed(messages):
        role = message.get("role")
        if role == "tool":
            return use
        if role == "assistant":
            break
    return replace(use, mode="required")


def tools_constraint(use: ToolUse) -> tuple[str, StructuredOutputsParams] | None:
    """The constraint tool_choice "required" or a named function puts on the reply, with the
    field its errors name (the named function's parameters, or the tools); None otherwise.
    RequestFieldError naming the tool whose parameters hold a keyword a call could break, or
    where the schema is longer than a constraint may be."""
    if use.mode not in ("required", "named"):
        return None
    tools = use.tools or []
    if use.mode == "required":
        _check_parameters(tools)
        field = "tools"
    else:
        names = [tool["function"]["name"] for tool in tools]
        field = f"tools[{names.index(use.function)}].function.parameters"
    try:
        return field, use.constraint
    except ValueError as exc:
        raise _too_long(use, field) from exc


def _too_long(use: ToolUse, field: str) -> RequestFieldError:
    holds = "the calls of every tool" if use.mode == "required" else \
        f"the parameters of {use.function!r}"
    fewer = " or fewer tools" if use.mode == "required" else ""
    return RequestFieldError(field, f"{field}: tool_choice {forced_choice(use)} holds the reply "
                                    f"to {holds}, a JSON schema longer than the "
                                    f"{MAX_CONSTRAINT_CHARS:,} characters a constraint may have: "
                                    f"give smaller parameters{fewer}, or use tool_choice 'auto'")


def check_tools(tools: Sequence[dict]) -> None:
    """RequestFieldError for a tool that is not a function, has no name, nests its parameters
    too deep for a template to read, or repeats the name of one before it."""
    first_with: dict[str, int] = {}
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise RequestFieldError(f"tools[{i}].type", f"tools[{i}].type={tool.get('type')!r}: "
                                                        "only 'function' tools are supported")
        function = tool.get("function") or {}
        name = function.get("name")
        if not name:
            raise RequestFieldError(f"tools[{i}].function.name",
                                    f"tools[{i}] has no name: give each tool one")
        depth = value_depth(function.get("parameters"))
        if depth > MAX_JSON_DEPTH:
            field = f"tools[{i}].function.parameters"
            raise RequestFieldError(field, f"{field} nests {depth:,} levels deep: at most "
                                           f"{MAX_JSON_DEPTH} are read")
        if name in first_with:
            raise RequestFieldError(f"tools[{i}].function.name",
                                    f"tools[{first_with[name]}] and tools[{i}] repeat the name "
                                    f"{name!r}: give each tool a name of its own")
        first_with[name] = i


def _named_function(choice: Mapping, tools: list[dict]) -> str:
    if choice.get("type") != "function":
        raise RequestFieldError("tool_choice.type", f"tool_choice.type={choice.get('type')!r}: "
                                                    "only 'function' is supported")
    name = (choice.get("function") or {}).get("name")
    names = [tool["function"]["name"] for tool in tools]
    if name not in names:
        raise RequestFieldError("tool_choice.function.name",
                                f"tool_choice names {name!r}, which is not among the tools "
                                f"({', '.join(names)})")
    return name


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
            raise RequestFieldError(field, f"{field}: {exc}") from exc


def forced_choice(use: ToolUse) -> str:
    """How an error names the tool_choice that forces a call: 'required', or naming one."""
    return "'required'" if use.mode == "required" else f"naming {use.function!r}"
