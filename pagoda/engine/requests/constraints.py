"""At most one constraint shapes a reply: one of the request's own fields (OpenAI's
response_format, vLLM's and llama.cpp's structured-output fields, SamplingParams'), or the call
a tool_choice forces (pagoda/engine/requests/tools.py), never two."""

from __future__ import annotations

from collections.abc import Sequence

from pagoda.engine.errors import RequestFieldError
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.requests.tools import forced_choice


def one_constraint(given: Sequence[str]) -> str | None:
    """The one field of `given` (those that constrain the reply) whose constraint the reply
    follows, None where none does; RequestFieldError naming the second where two do."""
    if len(given) > 1:
        raise RequestFieldError(given[1], f"{' and '.join(given)} both constrain the reply: "
                                          "give one")
    return given[0] if given else None


def check_one_constraint(use: ToolUse, constraint_field: str | None) -> None:
    """RequestFieldError naming `constraint_field` (the request's own constraint, if it gives
    one) where tool_choice forces a call too: each would shape the whole reply."""
    if constraint_field is not None and use.mode in ("required", "named"):
        raise RequestFieldError(constraint_field,
                                f"tool_choice {forced_choice(use)} and {constraint_field} both "
                                "shape the whole reply: give one of them")
