"""The words shown for a chat's documents: a file's pages and size, where its reading stands, the
sources a reply cites and where a cited passage is. Strings only; the composer's chips, the
transcript and the passage dialog draw them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pagoda.app.components.shared.view_models import AttachmentView, PassageView, SourceView

# A page with lines: in the fonts every desktop has (an emoji needs an emoji font).
DOCUMENT_MARK = "▤"
READING = "reading…"
HEADING_CHARS = 40  # of the heading a source names; the passage dialog shows it whole


def size_text(num_bytes: int) -> str:
    """"812 bytes", "4.5 KB", "340 KB", "2.4 MB": a file's size as file managers write it."""
    if num_bytes < 1000:
        return f"{num_bytes} bytes"
    value, unit = num_bytes / 1000, "KB"
    for bigger in ("MB", "GB"):
        if value < 999.5:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}" if value < 9.95 else f"{value:.0f} {unit}"


def pages_text(pages: int | None) -> str:
    if pages is None:
        return ""
    return "1 page" if pages == 1 else f"{pages:,} pages"


def attachment_details(view: AttachmentView) -> str:
    """"12 pages · 340 KB" (a file without pages: its size alone)."""
    return " · ".join(part for part in (pages_text(view.pages), size_text(view.size_bytes)) if part)


def attachment_status(view: AttachmentView) -> str:
    """A waiting document's second line: its progress while read, its error when it failed,
    its pages and size when it is ready."""
    if view.state == "reading":
        return f"{READING} {view.progress}" if view.progress else READING
    if view.state == "failed":
        return view.error or "could not be read"
    return attachment_details(view)


def reading_reason(views: list[AttachmentView]) -> str | None:
    """Why Send waits, "Reading report.pdf…", while a document is still read; None once none is."""
    reading = [view.name for view in views if view.state == "reading"]
    if not reading:
        return None
    more = f" and {len(reading) - 1} more" if len(reading) > 1 else ""
    return f"Reading {reading[0]}{more}…"


def source_labels(sources: Sequence[SourceView]) -> list[str]:
    """A reply's sources as it lists them: "[1] report.pdf, p. 12", "[2] report.docx › Results";
    where two would still read alike (one page or heading, or neither), each says which
    passage of its file it is: "[3] notes.txt, passage 4" (where that tells them apart)."""
    places = [_place(source) for source in sources]
    alike = Counter(places)
    passages = Counter((place, s.ordinal) for place, s in zip(places, sources, strict=True))
    return [f"[{s.number}] {place}" + (f", passage {s.ordinal + 1}"
                                       if alike[place] > 1 and passages[place, s.ordinal] == 1
                                       else "")
            for s, place in zip(sources, places, strict=True)]


def _place(source: SourceView) -> str:
    page = f", p. {source.page}" if source.page is not None else ""
    heading = f" › {_cut(source.heading, HEADING_CHARS)}" if source.heading else ""
    return f"{source.name}{page}{heading}"


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def passage_place(view: PassageView) -> str:
    """"report.pdf · page 12": where a cited passage is."""
    return f"{view.name} · page {view.page}" if view.page is not None else view.name
