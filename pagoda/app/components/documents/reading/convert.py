"""An attached file read into a Document: its type told from its name and bytes, its text
extracted by the reader for that type, every bound checked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pagoda.app.components.documents.document import MAX_FILE_BYTES, MAX_TEXT_CHARS, Document
from pagoda.app.components.documents.errors import (
    DocumentTooLargeError,
    EmptyDocumentError,
    UnreadableDocumentError,
    UnsupportedDocumentError,
)
from pagoda.app.components.documents.reading.office import read_html_file, read_office_file
from pagoda.app.components.documents.reading.pdf import ProgressCallback, read_pdf
from pagoda.app.components.documents.reading.sniff import HEAD_BYTES, detect_type
from pagoda.app.components.documents.reading.text_files import read_text_file

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def convert_document(path: Path, on_progress: ProgressCallback | None = None) -> Document:
    """The file at `path` as Markdown text; raises a DocumentError in words when it cannot be read.

    Blocking and CPU-bound (a 200-page PDF ~0.3 s, the first Office or HTML file ~1 s more while
    markitdown imports), and with no bound on the memory or time its parsers take: the app calls
    it in its reading process (reading_process.read_document), never in its own. `on_progress(
    done, total)` is called after each page of a PDF; an exception it raises stops the reading
    and comes out of convert_document."""
    data = _bytes_of(path)
    file_type = detect_type(path.name, data[:HEAD_BYTES])
    if file_type.kind == "pdf":
        document = read_pdf(path.name, data, on_progress)
    elif file_type.kind == "html":
        document = read_html_file(path.name, data)
    elif file_type.kind in ("docx", "pptx", "xlsx"):
        document = read_office_file(path.name, data, file_type.kind)
    else:
        document = read_text_file(path.name, data, file_type)
    return _checked(document)


def _bytes_of(path: Path) -> bytes:
    name = path.name
    try:
        # Opened without waiting (a named pipe would wait for a writer), then checked: a check
        # of the name before opening could be answered by another file than the one opened.
        descriptor = os.open(path, _OPEN_FLAGS)
        try:
            mode = os.fstat(descriptor).st_mode
            if not stat.S_ISREG(mode):
                raise _not_a_file(name, mode)
            with open(descriptor, "rb", closefd=False) as file:
                data = file.read(MAX_FILE_BYTES + 1)
        finally:
            os.close(descriptor)
    except OSError as error:
        raise UnreadableDocumentError(name, (error.strerror or str(error)).lower(),
                                      "Check that the file is still there and that you may "
                                      "open it.") from None
    if len(data) > MAX_FILE_BYTES:
        raise DocumentTooLargeError(name, f"more than {MAX_FILE_BYTES // 2**20} MiB",
                                    f"{MAX_FILE_BYTES // 2**20} MiB")
    if not data:
        raise EmptyDocumentError(name)
    return data


def _not_a_file(name: str, mode: int) -> UnsupportedDocumentError:
    if stat.S_ISDIR(mode):
        return UnsupportedDocumentError(name, "it is a folder, not a file",
                                        "Attach the files inside it one by one.")
    return UnsupportedDocumentError(name, "it is a named pipe or a device, not a file",
                                    "Attach a file saved on disk.")


def _checked(document: Document) -> Document:
    if not document.text.strip():
        raise EmptyDocumentError(document.name)
    if len(document.text) > MAX_TEXT_CHARS:
        raise DocumentTooLargeError(document.name, f"{len(document.text):,} characters of text",
                                    f"{MAX_TEXT_CHARS:,} characters")
    return document
