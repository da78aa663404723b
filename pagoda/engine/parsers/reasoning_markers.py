"""Where a model's reasoning opens and closes, as its chat template says, for the engine's
reasoning budget (pagoda/engine/sampling/reasoning_budget.py)."""

from __future__ import annotations

from pagoda.engine.parsers.harmony import CHANNEL, END, MESSAGE, START, is_harmony_template
from pagoda.engine.parsers.reasoning import reasoning_parser_for_template
from pagoda.engine.sampling.reasoning_budget import ReasoningMarkers

_ANALYSIS = f"{CHANNEL}analysis{MESSAGE}"
# Out of the analysis channel and into the answer: the end of the analysis message and the
# header of a final one, as gpt-oss writes them.
_TO_FINAL = f"{END}{START}assistant{CHANNEL}final{MESSAGE}"


def reasoning_markers(chat_template: str | None) -> ReasoningMarkers | None:
    """The reasoning markers of a template's model; None where it does not reason. A
    `<think>` family's reasoning is closed as its templates write it after the reasoning, on a
    line of its own; harmony's by ending the analysis message and opening the final one."""
    template = chat_template or ""
    if is_harmony_template(template):
        return ReasoningMarkers(_ANALYSIS, END, _TO_FINAL, reopens=True)
    parser = reasoning_parser_for_template(template)
    if parser is None:
        return None
    return ReasoningMarkers(parser.start, parser.end, "\n" + parser.end)
