"""What a request's tools ask of the reply: none, the model's choice ("auto", read back by
the template's tool parser), at least one call ("required") or one named function, the last two
enforced by a JSON-schema constraint built from the functions' parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pagoda.engine.sampling.params import StructuredOutputsParams

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
            return StructuredOutputsParams(json=self.parameters(self.function))
        if self.mode == "required":
            return StructuredOutputsParams(json=self._calls_schema())
        return None

    def parameters(self, name: str | None) -> dict:
        """The JSON schema of the named tool's arguments (any object where it gives none)."""
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
