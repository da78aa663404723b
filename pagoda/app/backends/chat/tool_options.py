"""A chat's tools, tool_choice and reply format, checked alike for every backend before a
request is made, so each refuses the same settings in the same words."""

from __future__ import annotations

from pagoda.app.backends.errors import InvalidRequestError
from pagoda.app.backends.types import SamplingOptions

# tool_choice's own words; anything else names a function.
TOOL_CHOICE_MODES = ("auto", "none", "required")


def named_function(tool_choice: str | None) -> str | None:
    """The function a tool_choice names; None for a mode (or no tool_choice)."""
    return None if tool_choice is None or tool_choice in TOOL_CHOICE_MODES else tool_choice


def check_tool_options(options: SamplingOptions) -> None:
    """InvalidRequestError naming the setting: a tool without a name or two of one name, a
    tool_choice without tools or naming none of them, or a reply format beside a tool_choice
    that forces a call (both would shape the whole reply)."""
    names = [tool.name for tool in options.tools]
    if not all(names):
        raise InvalidRequestError("A tool of this chat has no name: give each tool one.")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidRequestError(f"This chat's tools repeat the name {repeated[0]!r}: give "
                                  "each tool a name of its own.")
    choice = options.tool_choice
    if choice is not None and not names:
        raise InvalidRequestError(f"tool_choice={choice!r} needs tools to choose among: add "
                                  "tools to this chat, or clear its tool_choice.")
    named = named_function(choice)
    if named is not None and named not in names:
        raise InvalidRequestError(f"tool_choice names {named!r}, which is not among this "
                                  f"chat's tools ({', '.join(names)}).")
    if (named is not None or choice == "required") and options.reply_format is not None:
        raise InvalidRequestError(f"tool_choice={choice!r} and the reply format both shape the "
                                  "whole reply: give one of them.")
