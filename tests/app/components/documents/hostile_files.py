"""Small files built to make a reader allocate or spin far past their size, written into tmp_path:
what an outside probe attached to take the app down."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

_PAGE = b"/Type /Page /Parent 2 0 R /MediaBox [0 0 595 842]"
_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def write_flate_bomb_pdf(path: Path, inflated_mib: int) -> Path:
    """A one-page PDF whose content stream inflates to `inflated_mib` MiB of one glyph run."""
    glyphs = b"A" * 2**20
    stream = _deflated([b"BT /F1 12 Tf 72 700 Td (", *[glyphs] * inflated_mib])
    path.write_bytes(_pdf(stream, pages=1))
    return path


def write_shared_stream_pdf(path: Path, pages: int, stream_mib: int) -> Path:
    """A PDF whose `pages` pages all draw one content stream of `stream_mib` MiB of short glyph
    runs, each at its own place: every page makes the reader parse all of it again."""
    runs = b"".join(b"BT /F1 9 Tf %d %d Td (cider) Tj ET\n" % (40 + 30 * (n % 7), 60 + n)
                    for n in range(700))  # within what Flate looks back at: it repeats cheaply
    stream = _deflated([runs] * (stream_mib * 2**20 // len(runs)))
    path.write_bytes(_pdf(stream, pages))
    return path


def write_far_cell_xlsx(path: Path) -> Path:
    """A workbook of two cells, one at A1 and one at XFD1048576, the last cell a sheet has."""
    from openpyxl import Workbook

    workbook = Workbook()
    workbook.active["A1"] = "north"
    workbook.active["XFD1048576"] = 1
    workbook.save(str(path))
    return path


def write_huge_xml_docx(path: Path, base: Path, xml_mib: float) -> Path:
    """The Word file `base` with its document's body made `xml_mib` MiB of short paragraphs."""
    paragraph = b"<w:p><w:r><w:t>cider apples</w:t></w:r></w:p>"
    with zipfile.ZipFile(base) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for member in source.infolist():
            data = source.read(member.filename)
            if member.filename == "word/document.xml":
                head, tail = data.split(b"<w:body>", 1)
                body = paragraph * int(xml_mib * 2**20 / len(paragraph))
                data = head + b"<w:body>" + body + tail
            out.writestr(member, data)
    return path


def _deflated(parts: list[bytes]) -> bytes:
    compressor = zlib.compressobj(9)
    return b"".join([*(compressor.compress(part) for part in parts), compressor.flush()])


def _pdf(content: bytes, pages: int) -> bytes:
    """A PDF of `pages` pages that all draw the one Flate-compressed `content`."""
    kids = b" ".join(b"%d 0 R" % (4 + page) for page in range(pages))
    font = 4 + pages
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(content),
                                                                                content)]
    objects += [b"<< %s /Contents 3 0 R /Resources << /Font << /F1 %d 0 R >> >> >>" % (_PAGE, font)
                for _ in range(pages)]
    objects.append(_FONT)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    table = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1,
                                                                              table)
    return bytes(out)
