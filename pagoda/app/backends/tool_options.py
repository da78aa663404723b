"""A chat's tools, tool_choice and reply format, checked alike for every backend before a
request is made, by the rules Pagoda's server follows too (pagoda/engine/requests/tools.py), so
each backend refuses the same settings in the same words."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pagoda.app.backends.errors import InvalidRequestError, clause
from pagoda.app.backends.types import SamplingOptions
from pagoda.engine.errors import RequestFieldError
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.requests.constraints import check_one_constraint
from pagoda.engine.requests.tools import TOOL_CHOICE_MODES
from pagoda.engine.requests.tools import tool_use as checked_tool_use


def openai_tool_choice(tool_choice: str | None) -> str | dict | None:
    """tool_choice in OpenAI's shape: a mode as it is, a function's name as a named choice."""
    if tool_choice is None or tool_choice in TOOL_CHOICE_MODES:
        return tool_choice
    return {"type": "function", "function": {"name": tool_choice}}


def tool_use(options: SamplingOptions) -> ToolUse:
    """The chat's tools and tool_choice as the engine's prompt and parsers take them, checked:
    InvalidRequestError naming the setting that cannot be followed."""
    if options.tool_choice is not None and not options.tools:
        # Pagoda's server answers this as a chat without tools, for clients that send it so; a
        # chat's own setting that would change nothing is refused instead.
        raise InvalidRequestError(f"tool_choice={options.tool_choice!r} needs tools to choose "
                                  "among: add tools to this chat, or clear its tool_choice.")
    with refused_in_words():
        use = checked_tool_use([tool.as_dict() for tool in options.tools],
                               openai_tool_choice(options.tool_choice))
        check_one_constraint(use, None if options.reply_format is None else "reply_format")
    return use


@contextmanager
def refused_in_words() -> Iterator[None]:
    """The engine's refusal of a tool setting as this chat's InvalidRequestError."""
    try:
        yield
    except RequestFieldError as exc:
        raise InvalidRequestError(f"This chat's tool settings cannot be followed: "
                                  f"{clause(exc)}.") from exc
