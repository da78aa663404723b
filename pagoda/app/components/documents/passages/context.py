"""How attached documents go into the prompt: whole, when they fit the model's context, or as the
passages retrieved for the question, numbered so the reply can cite them as [n]."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from itertools import pairwise

from pagoda.app.components.documents.document import Document, Kind
from pagoda.app.components.documents.passages.chunking import Chunk

_WHOLE_INSTRUCTION = ("The user attached these files. Answer from them, and say which file (and "
                      "page, where there are pages) each fact comes from.")
_PASSAGES_INSTRUCTION = ("Answer from these passages and cite each one you use as [n], e.g. [1]. "
                         "If they do not hold the answer, say so.")
_NO_PASSAGES = ("No passage of the attached files matches this question. If the answer needs "
                "them, say that it is not in the attached files.")


@dataclass(frozen=True, slots=True)
class Hit:
    """A passage chosen for the question: `chunk` of the attached file called `name`."""

    name: str
    kind: Kind
    chunk: Chunk


@dataclass(frozen=True, slots=True)
class Source:
    """What the reply shows for citation [number]: `label` ("[1] report.pdf, page 12"), the
    attachment's name, the page (None without pages) and the chunk's ordinal in its document."""

    number: int
    label: str
    name: str
    page: int | None
    ordinal: int


def whole_documents_message(documents: Sequence[Document]) -> str:
    """The documents' text, each in a <file> block naming it, with a marker at each page.

    Pass them in the order they were attached: a new attachment then adds to the end, and the
    text of the earlier ones stays a prefix the engine's prefix cache keeps across turns."""
    if not documents:
        raise ValueError("whole_documents_message needs at least one document")
    blocks = "\n\n".join(_file_block(document) for document in documents)
    return f"{_WHOLE_INSTRUCTION}\n\n{blocks}"


def retrieved_passages_message(hits: Sequence[Hit]) -> str:
    """The passages, best first, each under its label, then how to cite them; with no passages,
    a note that the files hold nothing on the question."""
    if not hits:
        return _NO_PASSAGES
    passages = "\n\n".join(f"{source.label}\n{hit.chunk.text}"
                           for source, hit in zip(passage_sources(hits), hits))
    return f"Passages from the attached files:\n\n{passages}\n\n{_PASSAGES_INSTRUCTION}"


def passage_sources(hits: Sequence[Hit]) -> list[Source]:
    """The sources of `hits`, numbered from 1 in the order retrieved_passages_message shows them."""
    return [Source(number, _label(number, hit), hit.name, hit.chunk.page, hit.chunk.ordinal)
            for number, hit in enumerate(hits, 1)]


def _label(number: int, hit: Hit) -> str:
    if hit.chunk.page is not None:
        return f"[{number}] {hit.name}, {_page_word(hit.kind)} {hit.chunk.page}"
    if hit.chunk.heading is not None:
        return f'[{number}] {hit.name}, section "{hit.chunk.heading}"'
    return f"[{number}] {hit.name}"


def _file_block(document: Document) -> str:
    pages = f' {_page_word(document.kind)}s="{document.pages}"' if document.pages else ""
    return (f'<file name="{escape(document.name)}"{pages}>\n{_with_page_markers(document)}\n'
            "</file>")


def _with_page_markers(document: Document) -> str:
    if not document.page_starts:
        return document.text
    bounds = (*document.page_starts, len(document.text))
    word = _page_word(document.kind)
    return "\n\n".join(f"--- {word} {number} ---\n{document.text[low:high].strip()}"
                       for number, (low, high) in enumerate(pairwise(bounds), 1))


def _page_word(kind: Kind) -> str:
    return "slide" if kind == "pptx" else "page"
