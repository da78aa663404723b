"""A document cut into passages for retrieval. A chunk never crosses a page or a Markdown heading,
so its page and its section are its own; within one, chunks are at most CHUNK_CHARS long, cut
where the text allows (between paragraphs, sentences, lines, words; in Chinese and Japanese text,
after 。！？ or between any two characters), each overlapping the one before it by a sentence or
so. Deterministic: the same text always gives the same chunks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

from pagoda.app.components.documents.document import Document
from pagoda.app.components.documents.passages.cjk import CJK_CLASS
from pagoda.app.components.documents.passages.headings import Outline, markdown_outline

# ~375 tokens of English, ~1,000 of Chinese: a passage long enough to carry its context, short
# enough that eight of them fit a small model's context with room for the answer.
CHUNK_CHARS = 1_500
# A chunk is cut no sooner than this into it, unless its page or section ends first.
MIN_CUT_CHARS = 1_000
# At most this much of a chunk's end begins the next one in the same page and section.
OVERLAP_CHARS = 200

_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
# A run of marks is tried from its first mark only, and never given back: tried from each mark
# in turn, a long run of "." that no space follows took time quadratic in its length.
_SENTENCE = re.compile(r"(?<![.!?…])[.!?…]++[\"'”’)\]]*+\s+|[。！？；]++[」』”’）]*+\s*")
_LINE = re.compile(r"\n\s*")
_WORD = re.compile(r"\s+")
_VISIBLE = re.compile(r"\S")
_CJK_CHAR = re.compile(f"[{CJK_CLASS}]")
# Where a chunk may end, best first: the last such place in the window wins.
_CUTS = (_PARAGRAPH, _SENTENCE, _LINE, _WORD, _CJK_CHAR)
# Where an overlap may begin, best first: the earliest such place within OVERLAP_CHARS wins.
_OVERLAP_STARTS = (_SENTENCE, _WORD, _CJK_CHAR)
_HEADED_KINDS = frozenset({"markdown", "docx", "html", "pptx", "xlsx"})


@dataclass(frozen=True, slots=True)
class Chunk:
    """A passage of a document: `text` is `document.text[start:start + len(text)]`; `page` the
    page it is on (None without pages); `heading` the nearest Markdown heading above it."""

    ordinal: int
    text: str
    page: int | None
    heading: str | None
    start: int


def chunk_document(document: Document) -> list[Chunk]:
    """The document's passages in order, numbered from 0."""
    text = document.text
    outline = markdown_outline(text) if document.kind in _HEADED_KINDS else Outline()
    spans = [span for low, high in _sections(document, outline) for span in _spans(text, low, high)]
    return [Chunk(ordinal, text[start:end], document.page_at(start), outline.title_at(start), start)
            for ordinal, (start, end) in enumerate(spans)]


def _sections(document: Document, outline: Outline) -> Iterator[tuple[int, int]]:
    """The extents between page starts and heading lines."""
    bounds = sorted({0, len(document.text), *document.page_starts, *outline.starts})
    return pairwise(bounds)


def _spans(text: str, low: int, high: int) -> Iterator[tuple[int, int]]:
    start = _skip_space(text, low, high)
    while start < high:
        if high - start <= CHUNK_CHARS:
            yield start, _trim_end(text, start, high)
            return
        cut = _cut(text, start)
        yield start, _trim_end(text, start, cut)
        start = _skip_space(text, _overlap_start(text, start, cut), high)


def _cut(text: str, start: int) -> int:
    """Where the chunk beginning at `start` ends: the last best place in its window."""
    limit = start + CHUNK_CHARS
    for pattern in _CUTS:
        ends = [match.end() for match in pattern.finditer(text, start + MIN_CUT_CHARS, limit)]
        if ends:
            return ends[-1]
    return limit


def _overlap_start(text: str, start: int, cut: int) -> int:
    """Where the chunk after `cut` begins: a little before it, at a sentence or word."""
    low = max(cut - OVERLAP_CHARS, start + 1)
    for pattern in _OVERLAP_STARTS:
        for match in pattern.finditer(text, low, cut):
            if match.end() < cut:
                return match.end()
    return cut


def _skip_space(text: str, start: int, high: int) -> int:
    visible = _VISIBLE.search(text, start, high)
    return visible.start() if visible is not None else high


def _trim_end(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1].isspace():
        end -= 1
    return end
