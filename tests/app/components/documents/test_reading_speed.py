"""A 200-page book read and chunked well inside the issue's 10 s budget for attach + index."""

from __future__ import annotations

import time
from pathlib import Path

from pagoda.app.components.documents import chunk_document
from pagoda.app.components.documents.reading.convert import convert_document
from tests.app.components.documents.document_files import write_long_pdf

PAGES = 200
# The budget for attaching and indexing a 200-page PDF; reading and chunking are ~0.3 s
# of it on a 2-core machine, which leaves the index the rest.
BUDGET_S = 10.0


def test_200_page_pdf_is_read_and_chunked_well_within_the_budget(tmp_path: Path) -> None:
    path = write_long_pdf(tmp_path / "book.pdf", PAGES)

    began = time.perf_counter()
    document = convert_document(path)
    read_s = time.perf_counter() - began
    chunks = chunk_document(document)
    total_s = time.perf_counter() - began

    print(f"\n{PAGES} pages, {len(document.text):,} characters: read {read_s:.2f} s, "
          f"chunked {total_s - read_s:.3f} s, {len(chunks)} chunks")
    assert document.pages == PAGES
    assert {chunk.page for chunk in chunks} == set(range(1, PAGES + 1))
    assert total_s < BUDGET_S / 2
