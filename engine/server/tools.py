"""What a chat request's tools ask of the reply: none, the model's choice ("auto", read back by
the template's tool parser), at least one call ("required") or one named function, the last two
enforced by a JSON-schema constraint built from the functions' parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.sampling_params import StructuredOutputsParams
from engine.server.errors import APIError
from engine.server.protocol import ChatCompletionRequest, NamedToolChoice

Mode = Literal["none", "auto", "required", "named"]
_ANY_OBJECT = {"type": "object"}


@dataclass(slots=True, frozen=True)
class ToolUse:
    mode: Mode
    tools: list[dict] | None  # OpenAI's definitions, for the prompt; None when none apply
    function: str | None = None  # the named function
    parallel: bool = True

    @property
    def constraint(self) -> StructuredOutputsParams | None:
        """The reply's shape under "required" (a list of calls) and "named" (its arguments)."""
        if self.mode == "named":
            return StructuredOutputsParams(json=self._parameters(self.function))
        if self.mode == "required":
            return StructuredOutputsParams(json=self._calls_schema())
        return None

    def _parameters(self, name: str | None) -> dict:
        for tool in self.tools or []:
            if tool["function"]["name"] == name:
                return tool["function"].get("parameters") or _ANY_OBJECT
        raise AssertionError(f"{name} was checked to be among the tools")

    def _calls_schema(self) -> dict:
        calls = [{"type": "object", "properties": {
            "name": {"const": t["function"]["name"]},
            "parameters": t["function"].get("parameters") or _ANY_OBJECT},
            "required": ["name", "parameters"]} for t in self.tools or []]
        schema: dict = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema


def tool_use(body: ChatCompletionRequest) -> ToolUse:
    """The request's tools and tool_choice, checked as OpenAI checks them."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    choice = body.tool_choice
    if choice is not None and not tools:
        raise APIError(400, "tool_choice needs tools: give the tools it chooses among",
                       param="tool_choice")
    if not tools:
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
