"""PDFs, read page by page with PDFium (pypdfium2) so each part of the text knows its page.

Not markitdown's PDF converter: it joins the pages (its table path drops the page breaks), and it
parses each file twice in pure Python, ~14 s for 200 pages here where PDFium takes ~0.2 s."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pagoda.app.components.documents.document import MAX_PAGES, MAX_TEXT_CHARS, Document, join_pages
from pagoda.app.components.documents.errors import (
    DocumentTooLargeError,
    EncryptedDocumentError,
    NoTextLayerError,
    UnreadableDocumentError,
)
from pagoda.app.components.documents.reading.pdf_lines import LINE_END, line_bottoms, prose_text

if TYPE_CHECKING:
    import pypdfium2

ProgressCallback = Callable[[int, int], None]

# A page with fewer visible characters than this holds no text worth reading (a page number, a
# scan's stray mark); a PDF that averages fewer over all its pages is a scan without a text layer.
MIN_PAGE_CHARS = 16
# PDFium is not thread-safe: two PDFs read at once, on two worker threads, take turns.
_PDFIUM = threading.Lock()
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffe\uffff]")


def read_pdf(name: str, data: bytes, on_progress: ProgressCallback | None = None) -> Document:
    """The PDF in `data` as a Document with one page_start per page. `on_progress(done, total)`
    is called after each page, on the calling thread."""
    with _PDFIUM:
        texts = _page_texts(name, data, on_progress)
    visible = [_visible(text) for text in texts]
    if sum(visible) < MIN_PAGE_CHARS * len(texts):
        raise NoTextLayerError(name, len(texts))
    text, starts = join_pages(texts)
    textless = tuple(number for number, count in enumerate(visible, 1) if count < MIN_PAGE_CHARS)
    return Document(name=name, kind="pdf", size_bytes=len(data), pages=len(texts), text=text,
                    page_starts=starts, textless_pages=textless)


def _page_texts(name: str, data: bytes, on_progress: ProgressCallback | None) -> list[str]:
    pdf = _opened(name, data)
    try:
        total = len(pdf)
        if total > MAX_PAGES:
            raise DocumentTooLargeError(name, f"{total:,} pages", f"{MAX_PAGES:,} pages")
        texts: list[str] = []
        chars = 0
        for index in range(total):
            texts.append(_page_text(name, pdf, index))
            chars += len(texts[-1])
            if chars > MAX_TEXT_CHARS:
                raise DocumentTooLargeError(name, f"more than {MAX_TEXT_CHARS:,} characters of "
                                                  f"text in its first {index + 1:,} pages",
                                            f"{MAX_TEXT_CHARS:,} characters")
            if on_progress is not None:
                on_progress(index + 1, total)
        return texts
    finally:
        pdf.close()


def _opened(name: str, data: bytes) -> pypdfium2.PdfDocument:
    import pypdfium2 as pdfium  # imported here: only when a PDF is attached

    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as error:
        if error.err_code == pdfium.raw.FPDF_ERR_PASSWORD:
            raise EncryptedDocumentError(name) from None
        if error.err_code == pdfium.raw.FPDF_ERR_SECURITY:
            raise UnreadableDocumentError(name, "it is encrypted in a way Pagoda's PDF reader "
                                                "does not support") from None
        reason = f"its PDF structure is broken: {error}".rstrip(".")
        raise UnreadableDocumentError(name, reason) from None


def _page_text(name: str, pdf: pypdfium2.PdfDocument, index: int) -> str:
    import pypdfium2 as pdfium

    try:
        page = pdf[index]
        try:
            textpage = page.get_textpage()
            try:
                text = textpage.get_text_range()
                bottoms = line_bottoms(textpage, text)
            finally:
                textpage.close()
        finally:
            page.close()
    except pdfium.PdfiumError as error:
        reason = f"page {index + 1} could not be read: {error}".rstrip(".")
        raise UnreadableDocumentError(name, reason) from None
    return _cleaned(text, bottoms)


def _cleaned(text: str, bottoms: list[float] | None) -> str:
    lines = [line.rstrip() for line in text.split(LINE_END)]
    text = prose_text(lines, bottoms).replace("\r", "\n")
    return _CONTROL.sub("", text).strip()


def _visible(text: str) -> int:
    return len("".join(text.split()))
