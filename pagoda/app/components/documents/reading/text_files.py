"""Files that are text already: plain text, Markdown and source code, read as they are. Their bytes
are decoded as UTF-8 where they are UTF-8 (nearly all files today), else as the encoding their
byte-order mark names, else as the encoding charset-normalizer finds; bytes that are no text in
any encoding are refused, never shown as mojibake."""

from __future__ import annotations

import codecs
import re

from pagoda.app.components.documents.document import Document
from pagoda.app.components.documents.errors import UnsupportedDocumentError
from pagoda.app.components.documents.reading.sniff import FileType, binary_description

# charset-normalizer reads a sample to guess; the guess is then checked on the whole file.
_GUESS_SAMPLE_BYTES = 2**20
_WESTERN_CHAOS_MARGIN = 0.1
# Text holds a few control characters (form feeds, escapes in logs); binary data holds many.
_MAX_CONTROL_FRACTION = 0.01
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_BACKTICKS = re.compile(r"`{3,}")


def read_text_file(name: str, data: bytes, file_type: FileType) -> Document:
    """A text, Markdown or code file as a Document; code is fenced with its language."""
    text = decode_text(name, data)
    if file_type.kind == "code":
        text = fenced(text, file_type.language or "")
    return Document(name=name, kind=file_type.kind, size_bytes=len(data), pages=None, text=text)


def decode_text(name: str, data: bytes) -> str:
    """`data` as text with "\\n" line ends; refused when it is not text."""
    text = _decoded(data)
    if text is None or _looks_binary(text):
        raise UnsupportedDocumentError(name, binary_description(data))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def fenced(code: str, language: str) -> str:
    """`code` in a Markdown fence longer than any run of backticks inside it."""
    longest = max((len(run) for run in _BACKTICKS.findall(code)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{language}\n{code.rstrip()}\n{fence}"


def _decoded(data: bytes) -> str | None:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return _strict(data, encoding)
    utf8 = _strict(data, "utf-8")
    if utf8 is not None or b"\x00" in data[:_GUESS_SAMPLE_BYTES]:
        return utf8
    return _guessed(data)


def _guessed(data: bytes) -> str | None:
    from charset_normalizer import from_bytes  # imported here: only for files that are not UTF-8

    matches = from_bytes(data[:_GUESS_SAMPLE_BYTES])
    best = matches.best()
    if best is None:
        return None
    # Western European (Windows-1252, a superset of Latin-1) is by far the most common legacy
    # encoding, and on short texts charset-normalizer ranks its Baltic and Central European
    # neighbours first ("à" read as "ą"); it wins whenever it reads nearly as cleanly.
    western = any("cp1252" in match.could_be_from_charset
                  and match.chaos <= best.chaos + _WESTERN_CHAOS_MARGIN for match in matches)
    if western:
        return _strict(data, "cp1252") or _strict(data, best.encoding)
    return _strict(data, best.encoding)


def _strict(data: bytes, encoding: str) -> str | None:
    try:
        return data.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        return None


def _looks_binary(text: str) -> bool:
    controls = len(_CONTROL.findall(text[:_GUESS_SAMPLE_BYTES]))
    return controls > _MAX_CONTROL_FRACTION * min(len(text), _GUESS_SAMPLE_BYTES)
