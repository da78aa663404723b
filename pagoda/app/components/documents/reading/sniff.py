"""What kind of file this is, from its name and its first bytes. The bytes win where they are
certain (a PDF is a PDF whatever its name); the name decides among the kinds of text.

No machine-learned guesser (markitdown's magika): it is slow to load and it guesses at text, where
the name says more (a .md file is Markdown even when it reads like prose). Text is confirmed later,
when it is decoded: bytes that are not text are refused then."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from pagoda.app.components.documents.document import Kind
from pagoda.app.components.documents.errors import (
    EncryptedDocumentError,
    UnreadableDocumentError,
    UnsupportedDocumentError,
)
from pagoda.app.components.documents.reading.languages import code_language

HEAD_BYTES = 1024  # a .pdf file's header may come anywhere in its first kilobyte

_OFFICE: dict[str, Kind] = {".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx"}
_ZIP = b"PK\x03\x04"
# Old Office files, and Office files locked with a password (Office wraps those in this format).
_COMPOUND_FILE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_SAVE_AS = {
    ".doc": "Save it as .docx in Word (or LibreOffice) and attach that.",
    ".xls": "Save it as .xlsx in Excel (or LibreOffice) and attach that.",
    ".ppt": "Save it as .pptx in PowerPoint (or LibreOffice) and attach that.",
    ".rtf": "Save it as .docx in Word (or LibreOffice) and attach that.",
    ".odt": "Save it as .docx in LibreOffice and attach that.",
    ".ods": "Save it as .xlsx in LibreOffice and attach that.",
    ".odp": "Save it as .pptx in LibreOffice and attach that.",
    ".pages": "Export it as .docx or PDF from Pages and attach that.",
    ".numbers": "Export it as .xlsx from Numbers and attach that.",
    ".key": "Export it as .pptx or PDF from Keynote and attach that.",
    ".epub": "Convert it to PDF and attach that.",
}
_BINARY_MAGIC = (
    (b"\x89PNG", "it is a PNG image"),
    (b"\xff\xd8\xff", "it is a JPEG image"),
    (b"GIF8", "it is a GIF image"),
    (b"RIFF", "it is a media file (RIFF)"),
    (b"ID3", "it is an MP3 audio file"),
    (b"OggS", "it is an Ogg media file"),
    (b"\x1f\x8b", "it is a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "it is a 7-Zip archive"),
    (b"Rar!", "it is a RAR archive"),
    (b"\x7fELF", "it is a program (ELF)"),
    (b"MZ", "it is a Windows program"),
    (b"SQLite format 3\x00", "it is an SQLite database"),
    (_ZIP, "it is a ZIP archive"),
)
_MARKDOWN = {".md", ".markdown", ".mdown", ".mkd", ".mdx"}
_HTML = {".html", ".htm", ".xhtml"}
# Text a folder's files are read as by their name (any other name is read as text only when
# attached by hand: in a folder it is more often data than prose).
_PLAIN_TEXT = {".txt", ".text", ".rst", ".csv", ".tsv"}


@dataclass(frozen=True, slots=True)
class FileType:
    """The kind to read a file as; `language` names a code file's language for its fence."""

    kind: Kind
    language: str | None = None


def detect_type(name: str, head: bytes) -> FileType:
    """How to read the file called `name` whose first bytes are `head` (at least HEAD_BYTES of
    them where the file has that many); raises a DocumentError for a file Pagoda does not read."""
    suffix = PurePath(name).suffix.lower()
    if head.startswith(b"%PDF-") or (suffix == ".pdf" and b"%PDF-" in head[:HEAD_BYTES]):
        return FileType("pdf")
    if suffix == ".pdf":
        raise UnreadableDocumentError(name, "it does not start like a PDF file (no %PDF header)")
    if head.startswith(_COMPOUND_FILE):
        return _compound_file(name, suffix)
    if suffix in _OFFICE:
        return _office(name, suffix, head)
    if suffix in _SAVE_AS:
        raise UnsupportedDocumentError(name, f"Pagoda does not read {suffix} files",
                                       _SAVE_AS[suffix])
    return _text_type(name, suffix)


def named_readable(name: str) -> bool:
    """Whether the name of a file says it is one Pagoda reads: PDF, Word, PowerPoint, Excel,
    HTML, Markdown, plain text, or source code."""
    suffix = PurePath(name).suffix.lower()
    return (suffix == ".pdf" or suffix in _OFFICE or suffix in _HTML or suffix in _MARKDOWN
            or suffix in _PLAIN_TEXT or code_language(name) is not None)


def _compound_file(name: str, suffix: str) -> FileType:
    if suffix in _OFFICE:
        raise EncryptedDocumentError(name)
    fix = _SAVE_AS.get(suffix, "Save it as .docx, .xlsx or .pptx in its app and attach that.")
    raise UnsupportedDocumentError(name, "it is in an old Microsoft Office format", fix)


def _office(name: str, suffix: str, head: bytes) -> FileType:
    if not head.startswith(_ZIP):
        raise UnreadableDocumentError(name, f"it is not a {suffix} file inside (those are ZIP "
                                            "archives, and this is not one)")
    return FileType(_OFFICE[suffix])


def binary_description(head: bytes) -> str:
    """Why bytes that did not decode as text are refused: what they are, where that is known.
    Only asked once decoding failed, so a text that happens to start with "MZ" is still text."""
    for magic, what in _BINARY_MAGIC:
        if head.startswith(magic):
            return what
    return "it does not hold text (its bytes look like binary data)"


def _text_type(name: str, suffix: str) -> FileType:
    if suffix in _MARKDOWN:
        return FileType("markdown")
    if suffix in _HTML:
        return FileType("html")
    language = code_language(name)
    if language is not None:
        return FileType("code", language)
    return FileType("text")
