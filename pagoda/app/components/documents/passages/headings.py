"""The Markdown headings (`#` to `######`) of a text, outside its fenced code blocks."""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

_LINE = re.compile(r"^ {0,3}(?:(?P<fence>`{3,}|~{3,})|#{1,6}[ \t]+(?P<title>[^\n]*))",
                   re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Outline:
    """A text's headings: `starts[i]` is the offset where the line of heading `titles[i]` begins."""

    starts: tuple[int, ...] = ()
    titles: tuple[str, ...] = ()

    def title_at(self, offset: int) -> str | None:
        """The last heading that begins at or before `offset`; None before the first."""
        index = bisect_right(self.starts, offset)
        return self.titles[index - 1] if index else None


def markdown_outline(text: str) -> Outline:
    """The ATX headings of `text`, in order; a `#` line inside a ``` or ~~~ fence is code."""
    starts: list[int] = []
    titles: list[str] = []
    open_fence = ""
    for match in _LINE.finditer(text):
        fence = match.group("fence")
        if fence is not None:
            open_fence = _after_fence_line(open_fence, fence)
        elif not open_fence:
            title = match.group("title").strip().rstrip("#").strip()
            if title:
                starts.append(match.start())
                titles.append(title)
    return Outline(tuple(starts), tuple(titles))


def _after_fence_line(open_fence: str, fence: str) -> str:
    if not open_fence:
        return fence
    closes = fence[0] == open_fence[0] and len(fence) >= len(open_fence)
    return "" if closes else open_fence
