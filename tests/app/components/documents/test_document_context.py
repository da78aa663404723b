"""How documents go into the prompt: whole, under headers naming each file, or as numbered
passages the reply cites as [n]."""

from __future__ import annotations

import pytest

from pagoda.app.components.documents import (
    Chunk,
    Document,
    Hit,
    Source,
    passage_sources,
    retrieved_passages_message,
    whole_documents_message,
)
from pagoda.app.components.documents.document import join_pages


def pdf(name: str, pages: list[str]) -> Document:
    text, starts = join_pages(pages)
    return Document(name=name, kind="pdf", size_bytes=1000, pages=len(pages), text=text,
                    page_starts=starts)


def notes(name: str, text: str) -> Document:
    return Document(name=name, kind="markdown", size_bytes=len(text), pages=None, text=text)


def hit(name: str, text: str, page: int | None = None, heading: str | None = None,
        ordinal: int = 0) -> Hit:
    kind = "pdf" if page is not None else "markdown"
    return Hit(name, kind, Chunk(ordinal=ordinal, text=text, page=page, heading=heading, start=0))


def test_whole_documents_are_each_under_a_header_naming_the_file() -> None:
    message = whole_documents_message([notes("plan.md", "# Plan\n\nFix the pier."),
                                       notes("crew.md", "Ten sailors.")])

    assert '<file name="plan.md">\n# Plan\n\nFix the pier.\n</file>' in message
    assert '<file name="crew.md">\nTen sailors.\n</file>' in message
    assert message.index("plan.md") < message.index("crew.md")


def test_whole_pdf_marks_each_page_so_the_model_can_cite_it() -> None:
    message = whole_documents_message([pdf("report.pdf", ["Forty boats.", "A storm."])])

    assert ('<file name="report.pdf" pages="2">\n--- page 1 ---\nForty boats.\n\n'
            "--- page 2 ---\nA storm.\n</file>") in message


def test_whole_presentation_marks_slides() -> None:
    text, starts = join_pages(["# Budget", "# Plans"])
    deck = Document(name="deck.pptx", kind="pptx", size_bytes=1, pages=2, text=text,
                    page_starts=starts)

    assert '<file name="deck.pptx" slides="2">\n--- slide 1 ---\n# Budget' in (
        whole_documents_message([deck]))


def test_attaching_another_document_keeps_the_earlier_message_as_a_prefix() -> None:
    first = [pdf("report.pdf", ["Forty boats."])]

    before = whole_documents_message(first)
    after = whole_documents_message([*first, notes("crew.md", "Ten sailors.")])

    assert after.startswith(before)


def test_whole_documents_message_says_to_answer_from_the_files() -> None:
    message = whole_documents_message([notes("plan.md", "Fix the pier.")])

    assert message.startswith("The user attached these files. Answer from them")


def test_file_names_cannot_break_their_header() -> None:
    message = whole_documents_message([notes('a"b<c>.md', "text")])

    assert '<file name="a&quot;b&lt;c&gt;.md">' in message


def test_whole_documents_message_needs_a_document() -> None:
    with pytest.raises(ValueError, match="at least one document"):
        whole_documents_message([])


def test_passages_are_numbered_and_labelled_with_file_and_page() -> None:
    message = retrieved_passages_message([hit("report.pdf", "Forty boats came back.", page=12),
                                          hit("plan.md", "Fix the pier.", heading="Repairs")])

    assert "[1] report.pdf, page 12\nForty boats came back." in message
    assert '[2] plan.md, section "Repairs"\nFix the pier.' in message
    assert message.index("[1]") < message.index("[2]")
    assert "cite each one you use as [n]" in message


def test_passage_without_page_or_heading_is_labelled_with_its_file() -> None:
    assert passage_sources([hit("log.txt", "Wind 5 Bft.")])[0].label == "[1] log.txt"


def test_slide_passage_is_labelled_with_its_slide() -> None:
    chunk = Chunk(ordinal=3, text="Two new boats.", page=2, heading="Plans", start=40)

    assert passage_sources([Hit("deck.pptx", "pptx", chunk)])[0].label == "[1] deck.pptx, slide 2"


def test_sources_match_the_numbers_in_the_message() -> None:
    hits = [hit("report.pdf", "Forty boats.", page=12, ordinal=30),
            hit("plan.md", "Fix the pier.", ordinal=2)]

    sources = passage_sources(hits)

    assert sources == [Source(1, "[1] report.pdf, page 12", "report.pdf", 12, 30),
                       Source(2, "[2] plan.md", "plan.md", None, 2)]
    message = retrieved_passages_message(hits)
    assert all(source.label in message for source in sources)


def test_no_passages_tells_the_model_the_files_hold_nothing_on_it() -> None:
    message = retrieved_passages_message([])

    assert "No passage of the attached files matches this question" in message
    assert passage_sources([]) == []
