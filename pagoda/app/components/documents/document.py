"""A file read into text: what `read_document` hands back, and the bounds it reads within."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Literal

Kind = Literal["pdf", "docx", "pptx", "xlsx", "html", "text", "markdown", "code"]

# Bounds on what an attached file may make us allocate. 64 MiB holds any report or book as PDF or
# DOCX; 5,000 pages is past any real document; 20 M characters (~5 M tokens) is 40 long novels,
# far more than any model's context and already minutes of indexing.
MAX_FILE_BYTES = 64 * 2**20
MAX_PAGES = 5_000
MAX_TEXT_CHARS = 20_000_000
# Office files are ZIP archives: their unpacked size, checked before a parser inflates them, bounds
# what a small file of highly compressed XML (a "ZIP bomb") could make the parser allocate.
MAX_UNPACKED_BYTES = 256 * 2**20
# A sheet is read as a table as wide as its widest row and as long as its last row, every cell
# filled in: one cell far out (XFD1048576) makes 17 G of them. A cell takes at least two
# characters of the Markdown table, so a sheet of more cells is past MAX_TEXT_CHARS anyway.
MAX_SHEET_CELLS = MAX_TEXT_CHARS // 2

PAGE_SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class Document:
    """A file's text as Markdown. `pages` is the page count of a PDF or the slide count of a
    PowerPoint file, None for formats without pages. `page_starts[i]` is the offset in `text` where
    page i + 1 begins (empty without pages). `textless_pages` lists the pages (1-based) of a PDF
    that hold no text (scanned or blank), so the window can say which parts were not read."""

    name: str
    kind: Kind
    size_bytes: int
    pages: int | None
    text: str
    page_starts: tuple[int, ...] = ()
    textless_pages: tuple[int, ...] = ()

    def page_at(self, offset: int) -> int | None:
        """The page (1-based) that holds the character at `offset`; None without pages."""
        if not self.page_starts:
            return None
        return max(bisect_right(self.page_starts, offset), 1)



def join_pages(texts: list[str]) -> tuple[str, tuple[int, ...]]:
    """The pages' texts as one, a blank line between pages, and where each page begins in it."""
    starts: list[int] = []
    offset = 0
    for text in texts:
        starts.append(offset)
        offset += len(text) + len(PAGE_SEPARATOR)
    return PAGE_SEPARATOR.join(texts), tuple(starts)
