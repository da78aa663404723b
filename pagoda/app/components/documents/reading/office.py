"""Word, PowerPoint, Excel and HTML files, converted to Markdown by markitdown's converters.

We call the one converter the file's type needs (the type is already known, see sniff.py) rather
than MarkItDown().convert, which loads a machine-learned type guesser and tries converters in
turn. markitdown is imported on the first such file: it takes ~0.5 s to import."""

from __future__ import annotations

import io
import re
import zipfile
import zlib

from pagoda.app.components.documents.document import (
    MAX_PAGES,
    MAX_SHEET_CELLS,
    MAX_UNPACKED_BYTES,
    Document,
    Kind,
    join_pages,
)
from pagoda.app.components.documents.errors import DocumentTooLargeError, UnreadableDocumentError
from pagoda.app.components.documents.reading.text_files import decode_text

_MAIN_PART = {"docx": "word/document.xml", "pptx": "ppt/presentation.xml",
              "xlsx": "xl/workbook.xml"}
_APP_NAME = {"docx": "Word document", "pptx": "PowerPoint presentation",
             "xlsx": "Excel workbook", "html": "HTML page"}
_SLIDE_MARK = re.compile(r"^<!-- Slide number: \d+ -->\n?", re.MULTILINE)
_MAX_REASON_CHARS = 200
_SHEET = re.compile(r"xl/worksheets/[^/]+\.xml")
# A cell's and a row's position in a sheet's XML (the attributes before r= bounded, so that a
# run of "<c " without a ">" is not searched from each one to its end).
_CELL_AT = re.compile(rb"<(?:\w{1,16}:)?c\s[^>]{0,256}?\br=\"([A-Z]{1,3})([0-9]{1,7})\"")
_ROW_AT = re.compile(rb"<(?:\w{1,16}:)?row\s[^>]{0,256}?\br=\"([0-9]{1,7})\"")
_SCAN_BYTES = 2**20
_SCAN_OVERLAP = 512  # longer than either pattern can match


def read_office_file(name: str, data: bytes, kind: Kind) -> Document:
    """A .docx, .pptx or .xlsx file as Markdown; a presentation's slides are its pages."""
    _check_archive(name, data, kind)
    markdown = _markdown(name, kind, data)
    if kind == "pptx":
        return _slides_document(name, data, markdown)
    return Document(name=name, kind=kind, size_bytes=len(data), pages=None, text=markdown)


def read_html_file(name: str, data: bytes) -> Document:
    """An HTML page's content (scripts and styles left out) as Markdown."""
    utf8 = decode_text(name, data).encode("utf-8")
    return Document(name=name, kind="html", size_bytes=len(data), pages=None,
                    text=_markdown(name, "html", utf8))


def _check_archive(name: str, data: bytes, kind: Kind) -> None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        raise UnreadableDocumentError(name, f"its ZIP container is broken ({error})") from None
    unpacked = sum(member.file_size for member in members)
    if unpacked > MAX_UNPACKED_BYTES:
        raise DocumentTooLargeError(name, f"{unpacked / 2**20:,.0f} MiB once unpacked",
                                    f"{MAX_UNPACKED_BYTES // 2**20} MiB unpacked")
    if _MAIN_PART[kind] not in {member.filename for member in members}:
        raise UnreadableDocumentError(name, f"it is a ZIP archive with no {_APP_NAME[kind]} "
                                            "inside")
    if kind == "xlsx":
        _check_sheet_extents(name, data, members)


def _check_sheet_extents(name: str, data: bytes, members: list[zipfile.ZipInfo]) -> None:
    """Each sheet's table (last row × widest column) within MAX_SHEET_CELLS, found by a pass
    over its XML in bounded pieces, before a parser fills every cell in."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for member in members:
            if not _SHEET.fullmatch(member.filename):
                continue
            rows, columns = _sheet_extent(name, archive, member)
            if rows * columns > MAX_SHEET_CELLS:
                sheet = member.filename.rsplit("/", 1)[-1].removesuffix(".xml")
                raise DocumentTooLargeError(name, f"a sheet ({sheet}) that spans {rows:,} rows "
                                                  f"× {columns:,} columns",
                                            f"{MAX_SHEET_CELLS:,} cells in a sheet")


def _sheet_extent(name: str, archive: zipfile.ZipFile, member: zipfile.ZipInfo
                  ) -> tuple[int, int]:
    rows = columns = 0
    tail = b""
    try:
        with archive.open(member) as xml:
            while piece := xml.read(_SCAN_BYTES):
                text = tail + piece
                for cell in _CELL_AT.finditer(text):
                    columns = max(columns, _column_number(cell.group(1)))
                    rows = max(rows, int(cell.group(2)))
                for row in _ROW_AT.finditer(text):
                    rows = max(rows, int(row.group(1)))
                tail = text[-_SCAN_OVERLAP:]
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as error:
        raise UnreadableDocumentError(name, f"its ZIP container is broken ({error})") from None
    return rows, max(columns, 1 if rows else 0)


def _column_number(letters: bytes) -> int:
    """A column's number from its letters: A is 1, Z 26, AA 27, XFD 16,384."""
    number = 0
    for letter in letters:
        number = number * 26 + letter - ord("A") + 1
    return number


def _markdown(name: str, kind: Kind, data: bytes) -> str:
    """`data` (UTF-8 for HTML) converted by markitdown's converter for `kind`."""
    from markitdown import StreamInfo  # imported here: slow, and only for these formats
    from markitdown.converters import DocxConverter, HtmlConverter, PptxConverter, XlsxConverter

    converter = {"docx": DocxConverter, "pptx": PptxConverter, "xlsx": XlsxConverter,
                 "html": HtmlConverter}[kind]()
    try:
        result = converter.convert(io.BytesIO(data),
                                   StreamInfo(extension=f".{kind}", charset="utf-8"))
    except MemoryError:
        raise  # past the reading process's limit: it says so
    # The parsers under markitdown (mammoth, python-pptx, openpyxl, BeautifulSoup, lxml) raise
    # whatever they meet in a damaged file; each is this file's failure, said in words.
    except Exception as error:  # noqa: BLE001
        reason = f"{type(error).__name__}: {error}"[:_MAX_REASON_CHARS]
        raise UnreadableDocumentError(name, f"reading it as a {_APP_NAME[kind]} failed "
                                            f"({reason})") from None
    return result.markdown.strip()


def _slides_document(name: str, data: bytes, markdown: str) -> Document:
    slides = [part.strip() for part in _SLIDE_MARK.split(markdown)[1:]]
    if len(slides) > MAX_PAGES:
        raise DocumentTooLargeError(name, f"{len(slides):,} slides", f"{MAX_PAGES:,} slides")
    text, starts = join_pages(slides)
    return Document(name=name, kind="pptx", size_bytes=len(data), pages=len(slides), text=text,
                    page_starts=starts)
