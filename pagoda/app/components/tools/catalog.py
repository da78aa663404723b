"""The tools of the enabled MCP servers under the names the model calls them by.

OpenAI's function names match ^[a-zA-Z0-9_-]{1,64}$ and must be unique in a request, while two
servers may both have a `search` and an MCP tool may be named `get.weather`. A tool keeps its
own name when that name is valid and no other tool has it; otherwise it is called
`<server>_<tool>` with every other character made `_`, and, where that is too long or taken,
cut and ended with 8 hex digits of a hash of the server and tool names. The names and the specs'
order depend only on the set of tools (sorted by server, then tool), so the same servers give the
model the same prompt, and a prefix cache keeps serving it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pagoda.app.backends import ToolSpec
from pagoda.app.components.tools.errors import UnknownToolError

logger = logging.getLogger(__name__)

MAX_FUNCTION_NAME = 64
_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_DIGITS = 8


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool as its server lists it: `input_schema` is the JSON schema of its arguments."""

    server: str
    name: str
    description: str = ""
    input_schema: dict = field(default_factory=dict, hash=False)
    title: str = ""


class ToolCatalog:
    """Function names for a set of tools, both ways, and the specs a backend takes."""

    def __init__(self, tools: Iterable[McpTool]) -> None:
        self._by_function = _assign_function_names(_unique_sorted(tools))
        self._by_tool = {(tool.server, tool.name): function
                         for function, tool in self._by_function.items()}

    def __len__(self) -> int:
        return len(self._by_function)

    def function_names(self) -> list[str]:
        """The model-facing names, in the specs' order."""
        return list(self._by_function)

    def function_name(self, server: str, tool: str) -> str:
        """The name the model calls `tool` of `server` by; KeyError when the catalog lacks it."""
        return self._by_tool[(server, tool)]

    def resolve(self, function_name: str) -> McpTool:
        """The tool the model meant by `function_name`; UnknownToolError when none is."""
        tool = self._by_function.get(function_name)
        if tool is None:
            raise UnknownToolError(function_name, self.function_names())
        return tool

    def specs(self) -> tuple[ToolSpec, ...]:
        """One ToolSpec per tool, for ChatRequest.tools."""
        return tuple(ToolSpec(function, tool.description, tool.input_schema or _any_object())
                     for function, tool in self._by_function.items())


def _any_object() -> dict:
    """The schema of a tool that lists none: any object."""
    return {"type": "object", "properties": {}}


def _unique_sorted(tools: Iterable[McpTool]) -> list[McpTool]:
    unique: dict[tuple[str, str], McpTool] = {}
    for tool in tools:
        if (tool.server, tool.name) in unique:
            logger.warning("MCP server %r lists the tool %r twice; the first is used",
                           tool.server, tool.name)
            continue
        unique[(tool.server, tool.name)] = tool
    return [unique[key] for key in sorted(unique)]


def _assign_function_names(tools: list[McpTool]) -> dict[str, McpTool]:
    counts = Counter(tool.name for tool in tools)
    names: dict[str, McpTool] = {tool.name: tool for tool in tools
                                 if counts[tool.name] == 1 and _FUNCTION_NAME.fullmatch(tool.name)}
    for tool in tools:
        if names.get(tool.name) is not tool:
            names[_prefixed_name(tool, names)] = tool
    order = {id(tool): index for index, tool in enumerate(tools)}
    return dict(sorted(names.items(), key=lambda item: order[id(item[1])]))


def _prefixed_name(tool: McpTool, taken: dict[str, McpTool]) -> str:
    """`<server>_<tool>` made valid; cut and hashed where too long or already taken."""
    base = _NOT_ALLOWED.sub("_", f"{tool.server}_{tool.name}")
    if len(base) <= MAX_FUNCTION_NAME and base not in taken:
        return base
    digest = hashlib.sha256(f"{tool.server}\0{tool.name}".encode()).hexdigest()[:_HASH_DIGITS]
    attempt = 0
    while True:
        suffix = f"_{digest}" + (f"_{attempt}" if attempt else "")
        candidate = base[:MAX_FUNCTION_NAME - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        attempt += 1
