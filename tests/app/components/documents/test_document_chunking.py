"""chunk_document: passages of a bounded size, cut where the text allows, that know their page
and their section."""

from __future__ import annotations

import itertools
import time

import pytest

from pagoda.app.components.documents import Chunk, Document, chunk_document
from pagoda.app.components.documents.document import Kind, join_pages
from pagoda.app.components.documents.passages.chunking import (
    CHUNK_CHARS,
    MIN_CUT_CHARS,
    OVERLAP_CHARS,
)


def sentences(count: int, topic: str = "harbour") -> str:
    return " ".join(f"Sentence {n} says the {topic} master counted {n * 3} boats at dawn."
                    for n in range(1, count + 1))


def paragraphs(count: int, per_paragraph: int = 6) -> str:
    return "\n\n".join(sentences(per_paragraph, f"harbour{n}") for n in range(count))


def document(text: str, kind: Kind = "text", page_starts: tuple[int, ...] = ()) -> Document:
    pages = len(page_starts) if page_starts else None
    return Document(name="notes", kind=kind, size_bytes=len(text.encode()), pages=pages,
                    text=text, page_starts=page_starts)


def assert_within_bounds(chunks: list[Chunk]) -> None:
    for chunk in chunks:
        assert len(chunk.text) <= CHUNK_CHARS


def test_short_document_is_one_chunk() -> None:
    chunks = chunk_document(document("  Forty boats came back.\n\n"))

    assert chunks == [Chunk(ordinal=0, text="Forty boats came back.", page=None, heading=None,
                            start=2)]


def test_chunk_text_is_the_documents_text_at_its_start() -> None:
    text = paragraphs(20)

    for chunk in chunk_document(document(text)):
        assert text[chunk.start:chunk.start + len(chunk.text)] == chunk.text


def test_chunks_are_numbered_in_order() -> None:
    chunks = chunk_document(document(paragraphs(20)))

    assert [chunk.ordinal for chunk in chunks] == list(range(len(chunks)))
    assert [chunk.start for chunk in chunks] == sorted(chunk.start for chunk in chunks)


def test_chunks_stay_within_size_bounds() -> None:
    chunks = chunk_document(document(paragraphs(40)))

    assert len(chunks) > 5
    assert_within_bounds(chunks)
    assert all(len(chunk.text) >= MIN_CUT_CHARS - 2 for chunk in chunks[:-1])


def test_chunks_end_between_paragraphs_when_they_can() -> None:
    text = paragraphs(40)

    for chunk in chunk_document(document(text))[:-1]:
        assert text[chunk.start + len(chunk.text):].startswith("\n\n")


def test_consecutive_chunks_overlap_by_at_most_the_overlap_from_a_sentence_start() -> None:
    text = sentences(200)
    chunks = chunk_document(document(text))

    for before, after in itertools.pairwise(chunks):
        overlap = before.start + len(before.text) - after.start
        assert 0 < overlap <= OVERLAP_CHARS
        assert after.text.startswith("Sentence ")
        assert text[after.start - 2:after.start] == ". "


def test_chunks_never_begin_or_end_inside_a_word() -> None:
    text = " ".join(f"word{n}" for n in range(2000))
    chunks = chunk_document(document(text))

    assert len(chunks) > 5
    for chunk in chunks:
        end = chunk.start + len(chunk.text)
        assert chunk.start == 0 or text[chunk.start - 1] == " "
        assert end == len(text) or text[end] == " "


def test_chunks_never_cross_pages_and_know_their_page() -> None:
    pages = [sentences(40, "north"), "", sentences(5, "south")]
    text, starts = join_pages(pages)

    chunks = chunk_document(document(text, "pdf", starts))

    assert {chunk.page for chunk in chunks} == {1, 3}
    assert all("south" not in chunk.text for chunk in chunks if chunk.page == 1)
    assert all("north" not in chunk.text for chunk in chunks if chunk.page == 3)
    assert_within_bounds(chunks)


def test_chunks_know_the_heading_above_them() -> None:
    text = (f"Preface without a heading.\n\n# Methods\n\n{paragraphs(6)}\n\n"
            f"## Counting at dawn\n\n{sentences(3)}\n\n# Results\n\nForty boats came back.")

    chunks = chunk_document(document(text, "markdown"))

    assert chunks[0].heading is None
    assert {chunk.heading for chunk in chunks if "harbour3 master" in chunk.text} == {"Methods"}
    assert chunks[-2].heading == "Counting at dawn"
    assert chunks[-1].heading == "Results"
    assert chunks[-1].text == "# Results\n\nForty boats came back."


def test_a_heading_always_begins_a_chunk() -> None:
    text = f"# Methods\n\n{sentences(30)}\n\n# Results\n\n{sentences(3)}"

    chunks = chunk_document(document(text, "markdown"))

    assert [chunk.text.startswith("#") for chunk in chunks] == [True, False, True]
    assert "# Results" not in chunks[1].text


def test_hash_lines_in_code_fences_are_not_headings() -> None:
    text = "# Setup\n\n```bash\n# install the tools\nmake\n```\n\nThen run it."

    chunks = chunk_document(document(text, "markdown"))

    assert [chunk.heading for chunk in chunks] == ["Setup"]


def test_hash_lines_in_plain_text_and_pdfs_are_not_headings() -> None:
    text = "# 1 priority: the pier\n\nFix it first."

    for kind in ("text", "pdf", "code"):
        assert chunk_document(document(text, kind))[0].heading is None


def test_chinese_text_is_cut_after_sentence_marks() -> None:
    text = "".join(f"第{n}句：港口的渔民在清晨数了{n * 3}条船。" for n in range(300))

    chunks = chunk_document(document(text))

    assert len(chunks) > 3
    assert_within_bounds(chunks)
    assert all(chunk.text.endswith("。") for chunk in chunks)
    assert all(chunk.text.startswith("第") for chunk in chunks)
    assert all(len(chunk.text) >= MIN_CUT_CHARS - 30 for chunk in chunks[:-1])


def test_chinese_text_without_punctuation_is_cut_by_length() -> None:
    text = "港口的渔民在清晨数船" * 500

    chunks = chunk_document(document(text))

    assert_within_bounds(chunks)
    assert "".join(chunk.text for chunk in chunks).count("港") > 500
    for before, after in itertools.pairwise(chunks):
        assert 0 < before.start + len(before.text) - after.start <= OVERLAP_CHARS


def test_a_run_without_spaces_is_cut_at_the_size_bound() -> None:
    text = "QUJD" * 2000

    chunks = chunk_document(document(text))

    assert [len(chunk.text) for chunk in chunks[:-1]] == [CHUNK_CHARS] * (len(chunks) - 1)


def test_chunking_is_deterministic() -> None:
    text = paragraphs(30) + "\n\n# Tail\n\n" + sentences(50)

    assert chunk_document(document(text, "markdown")) == chunk_document(document(text, "markdown"))


def test_blank_pages_give_no_chunks() -> None:
    text, starts = join_pages(["", "   ", "Forty boats."])

    chunks = chunk_document(document(text, "pdf", starts))

    assert [(chunk.page, chunk.text) for chunk in chunks] == [(3, "Forty boats.")]


def test_overlap_never_reaches_back_past_a_heading() -> None:
    text = f"# Methods\n\n{sentences(60)}"

    chunks = chunk_document(document(text, "markdown"))

    assert chunks[0].text.startswith("# Methods")
    assert all("# Methods" not in chunk.text for chunk in chunks[1:])
    assert {chunk.heading for chunk in chunks} == {"Methods"}


@pytest.mark.parametrize("marks", [".", "…", "!?", '."'])
def test_a_long_run_of_punctuation_is_chunked_about_as_fast_as_prose(marks: str) -> None:
    """Runs of sentence marks with no space after them were tried from every mark, each try
    reading to the end of the window: 20 M such characters took about a minute, ~100x prose."""
    size = 1_000_000
    prose = (sentences(1) + " ") * (size // (len(sentences(1)) + 1))
    punctuation = marks * (size // len(marks))

    prose_s = _chunking_seconds(prose)
    punctuation_s = _chunking_seconds(punctuation)

    assert punctuation_s < 10 * prose_s + 1.0, (punctuation_s, prose_s)


def _chunking_seconds(text: str) -> float:
    began = time.perf_counter()
    chunks = chunk_document(document(text))
    assert chunks
    return time.perf_counter() - began
