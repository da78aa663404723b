"""A PDF page's lines made paragraphs again. A PDF holds lines where its text was wrapped, not
paragraphs: read as they are, a passage breaks mid-sentence every ten words. A line goes on
into the next where it is as long as the page's long lines (it was wrapped), the next is no
list item, and no wider gap than the page's line spacing lies between them (a new paragraph);
a word broken over two lines is made whole."""

from __future__ import annotations

import re
from itertools import pairwise
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pypdfium2

LINE_END = "\r\n"  # PDFium's, between the lines of a page's text
# Long is this share of the page's 90th-percentile line, on a page whose lines are prose-long
# at all (a slide's, a list's or a table's short lines stay as they are).
WRAPPED_SHARE = 0.75
WIDTH_PERCENTILE = 0.9
MIN_PROSE_LINE = 45
# A gap between two lines this much wider than the page's usual spacing parts two paragraphs.
PARAGRAPH_GAP = 1.3
# A hyphen (or PDFium's mark for one, \x02, or a soft hyphen) after a letter at a line's end.
_BROKEN_WORD = re.compile(r"(?<=[^\W\d_])[-\x02\xad]$")
_LIST_ITEM = re.compile(r"(?:[•●▪◦‣∙·*–-]|\(?\d{1,3}[.)]|[a-z][.)])\s")


def line_bottoms(textpage: pypdfium2.PdfTextPage, text: str) -> list[float] | None:
    """Where each line of `text` (the page's text, LINE_END between lines) sits: the bottom
    of its first character's box, from the font's height; None where the text's characters
    are not the page's one for one (then the lines are joined by their lengths alone)."""
    if textpage.count_chars() != len(text):
        return None
    bottoms = []
    start = 0
    for line in text.split(LINE_END):
        bottoms.append(textpage.get_charbox(start, loose=True)[1] if line else float("nan"))
        start += len(line) + len(LINE_END)
    return bottoms


def prose_text(lines: list[str], bottoms: list[float] | None = None) -> str:
    """The page's lines, those wrapped inside a paragraph joined; `bottoms` (line_bottoms),
    where known, part paragraphs whose lines are as long as the page's."""
    wrapped = _wrapped_length(lines)
    spacing = _line_spacing(bottoms)
    text = lines[0] if lines else ""
    for index, (before, after) in enumerate(pairwise(lines)):
        if not _goes_on(before, after, wrapped) or _paragraph_gap(bottoms, index, spacing):
            text += "\n" + after
        elif _BROKEN_WORD.search(before) and after[:1].islower():
            text = text[:-1] + after
        else:
            text += " " + after.lstrip()
    return text


def _wrapped_length(lines: list[str]) -> float:
    """How long a line is that the page wrapped; infinite on a page without prose lines."""
    lengths = sorted(len(line) for line in lines if line.strip())
    if not lengths:
        return float("inf")
    width = lengths[int(WIDTH_PERCENTILE * (len(lengths) - 1))]
    return WRAPPED_SHARE * width if width >= MIN_PROSE_LINE else float("inf")


def _goes_on(line: str, next_line: str, wrapped: float) -> bool:
    return (len(line) >= wrapped and bool(next_line.strip())
            and not _LIST_ITEM.match(next_line.lstrip()))


def _line_spacing(bottoms: list[float] | None) -> float | None:
    if bottoms is None:
        return None
    steps = [high - low for high, low in pairwise(bottoms) if high - low > 0]
    return median(steps) if steps else None


def _paragraph_gap(bottoms: list[float] | None, index: int, spacing: float | None) -> bool:
    """Whether more than a line's spacing lies between line `index` and the next (or the next
    is not below it: another column)."""
    if bottoms is None or spacing is None:
        return False
    step = bottoms[index] - bottoms[index + 1]
    return not 0 < step <= PARAGRAPH_GAP * spacing
