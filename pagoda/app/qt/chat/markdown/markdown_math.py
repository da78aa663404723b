"""Where a message's prose holds math: `$…$`, `$$…$$`, `\\(…\\)` and `\\[…\\]`, found without Qt.

Markdown would eat a formula's backslashes (`\\,` is an escaped comma to it), so formulas are cut
out of the prose before Qt reads it and each is left as a placeholder that the renderer swaps for
the drawn formula. Dollar amounts stay text by the usual rule: an opening `$` is followed by no
space, a closing `$` follows no space and is followed by no digit, and both sit on one line; `\\$`
is a dollar sign. Nothing inside a code span is math.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

_PRIVATE_USE = range(0xE000, 0xF900)  # placeholder marks: characters a message rarely holds
_WHITESPACE = " \t\n\r"


@dataclass(slots=True, frozen=True)
class Formula:
    """One formula of a message: its LaTeX, and the text as written (shown if it does not parse)."""

    source: str
    written: str
    display: bool


@dataclass(slots=True, frozen=True)
class HiddenMath:
    """A message's prose with each formula replaced by a placeholder (`placeholder(i)`)."""

    markdown: str
    formulas: tuple[Formula, ...]
    marks: tuple[str, str] = ("\ue000", "\ue001")

    def placeholder(self, index: int) -> str:
        opening, closing = self.marks
        return f"{opening}{index}{closing}"


def split_math(text: str) -> list[str | Formula]:
    """`text` as runs of prose and the formulas between them, in order."""
    pieces: list[str | Formula] = []
    prose_start = i = 0
    while i < len(text):
        found = _formula_at(text, i)
        if found is None:
            i = _skip(text, i)
            continue
        formula, end = found
        if prose_start < i:
            pieces.append(text[prose_start:i])
        pieces.append(formula)
        prose_start = i = end
    if prose_start < len(text):
        pieces.append(text[prose_start:])
    return pieces


def hide_math(text: str) -> HiddenMath:
    """Replace each formula of `text` by a placeholder made of marks that `text` does not hold."""
    pieces = split_math(text)
    formulas = tuple(piece for piece in pieces if isinstance(piece, Formula))
    marks = _free_marks(text)
    if not formulas or marks is None:  # None: the text holds every private-use character
        return HiddenMath(text, ())
    hidden = HiddenMath("", formulas, marks)
    numbers = itertools.count()
    parts = [hidden.placeholder(next(numbers)) if isinstance(piece, Formula) else piece
             for piece in pieces]
    return HiddenMath("".join(parts), formulas, marks)


def _free_marks(text: str) -> tuple[str, str] | None:
    used = set(text)
    free = (chr(code) for code in _PRIVATE_USE if chr(code) not in used)
    opening, closing = next(free, None), next(free, None)
    return None if opening is None or closing is None else (opening, closing)


def _skip(text: str, i: int) -> int:
    """Where scanning goes on after the character at `i`, which opens no formula."""
    if text[i] == "\\":
        return i + 2  # an escaped character: `\$` is a dollar sign, `\\` a backslash
    if text[i] == "`":
        return _after_code_span(text, i)
    if text.startswith("$$", i):
        return i + 2
    return i + 1


def _after_code_span(text: str, i: int) -> int:
    run = _run_length(text, i, "`")
    j = i + run
    while (j := text.find("`" * run, j)) != -1:
        closing = _run_length(text, j, "`")
        if closing == run:
            return j + run
        j += closing
    return i + run  # no closing run: the backticks are text


def _run_length(text: str, i: int, char: str) -> int:
    j = i
    while j < len(text) and text[j] == char:
        j += 1
    return j - i


def _formula_at(text: str, i: int) -> tuple[Formula, int] | None:
    """The formula opening at `i` and where it ends, or None."""
    if text.startswith("$$", i):
        return _delimited(text, i, "$$", "$$", display=True)
    if text.startswith("\\[", i):
        return _delimited(text, i, "\\[", "\\]", display=True)
    if text.startswith("\\(", i):
        return _delimited(text, i, "\\(", "\\)", display=False)
    if text[i] == "$":
        return _inline_dollars(text, i)
    return None


def _delimited(
    text: str, i: int, opening: str, closing: str, display: bool
) -> tuple[Formula, int] | None:
    """A formula between two delimiters; it may span lines but not a blank line."""
    start = j = i + len(opening)
    while j < len(text):
        if text.startswith(closing, j):
            return _formula(text, i, start, j, j + len(closing), display)
        if text[j] == "\n" and _blank_line_follows(text, j):
            return None
        j += 2 if text[j] == "\\" else 1  # `\\]` is a backslash pair and a bracket, no closing
    return None


def _blank_line_follows(text: str, newline: int) -> bool:
    end = text.find("\n", newline + 1)
    return end != -1 and not text[newline + 1 : end].strip()


def _inline_dollars(text: str, i: int) -> tuple[Formula, int] | None:
    start = i + 1
    if start >= len(text) or text[start] in _WHITESPACE + "$":
        return None
    j = start
    while j < len(text) and text[j] != "\n":
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == "$":
            closes = text[j - 1] not in _WHITESPACE and not text[j + 1 : j + 2].isdigit()
            return _formula(text, i, start, j, j + 1, display=False) if closes else None
        j += 1
    return None


def _formula(
    text: str, i: int, start: int, stop: int, end: int, display: bool
) -> tuple[Formula, int] | None:
    source = text[start:stop]
    if not source.strip():
        return None
    return Formula(source.strip(), text[i:end], display), end
