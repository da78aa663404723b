"""The words the transcript shows around an answer: how long a reply thought, where its tool
calls stand, and the title and folded preview of a tool's result. Strings only; transcript.py
draws them."""

from __future__ import annotations

import html
import json

from pagoda.app.components.shared.view_models import MessageView, ToolCallState

ARGUMENTS_SHOWN = 200  # characters of a call's arguments shown; the rest is in its tooltip
PREVIEW_SHOWN = 80  # characters of a folded tool result shown
THINKING = "Thinking…"
# A call's state once the user has answered it (while "asking" it shows Run / Always / Deny).
CALL_STATE_WORDS: dict[ToolCallState, str] = {
    "running": "running…",
    "done": "✓ done",
    "denied": "denied",
    "failed": "✗ failed",
    "not run": "not run",
}


def thought_label(seconds: float | None) -> str:
    """"Thought for 12 s" once a reply's reasoning has ended; "Thought" when its time is unknown."""
    if seconds is None:
        return "Thought"
    if seconds < 1:
        return "Thought for a moment"
    whole = round(seconds)
    if whole < 60:
        return f"Thought for {whole} s"
    return f"Thought for {whole // 60} min {whole % 60} s"


def compact_arguments(arguments: str) -> str:
    """A call's arguments on one line: JSON re-written compactly, anything else with its
    whitespace collapsed (a model may write broken JSON; it is shown as written)."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return " ".join(arguments.split())


def elide(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def arguments_tooltip(arguments: str) -> str:
    """The whole arguments as rich text (so that markup the model wrote is shown, not obeyed),
    indented when they are JSON."""
    try:
        text = json.dumps(json.loads(arguments), ensure_ascii=False, indent=2)
    except ValueError:
        text = arguments
    return f'<p style="white-space:pre-wrap">{html.escape(text)}</p>'


def result_title(view: MessageView) -> str:
    """A tool message's header: what became of the call."""
    name = view.tool_name or "the tool"
    if view.finish_reason == "denied":
        return f"{name} was denied"
    if view.finish_reason == "failed":
        return f"{name} failed"
    return f"Result of {name}"


def result_preview(content: str) -> str:
    """A folded result: its first line, cut at PREVIEW_SHOWN characters; "…" where more follows."""
    text = content.strip()
    first = text.split("\n", 1)[0].strip()
    if len(first) > PREVIEW_SHOWN:
        return first[: PREVIEW_SHOWN - 1] + "…"
    if first != text:
        return first + " …"
    return first or "(empty)"
