"""convert_document on real files of every kind a user attaches, and on the ones it must refuse."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pagoda.app.components.documents import (
    DocumentTooLargeError,
    EmptyDocumentError,
    EncryptedDocumentError,
    NoTextLayerError,
    UnreadableDocumentError,
    UnsupportedDocumentError,
    chunk_document,
)
from pagoda.app.components.documents.reading import convert, office, pdf
from pagoda.app.components.documents.reading.convert import convert_document
from pagoda.app.components.documents.reading.pdf_lines import prose_text
from tests.app.components.documents.document_files import (
    write_docx,
    write_long_pdf,
    write_pdf,
    write_pptx,
    write_scanned_pdf,
    write_xlsx,
)

THREE_CHAPTERS = [
    ("Chapter one: the harbour", ["The harbour master counted forty boats.",
                                  "The tide rose over the old pier."]),
    ("Chapter two: the storm", ["A storm came in from the west.", "The boats stayed in."]),
    ("Chapter three: the market", ["Fish sold for two crowns a basket."]),
]


def test_pdf_text_is_read_page_by_page(tmp_path: Path) -> None:
    document = convert_document(write_pdf(tmp_path / "harbour.pdf", THREE_CHAPTERS))

    assert (document.name, document.kind, document.pages) == ("harbour.pdf", "pdf", 3)
    assert len(document.page_starts) == 3
    for start, (heading, lines) in zip(document.page_starts, THREE_CHAPTERS, strict=True):
        assert document.text[start:].startswith(heading)
        assert lines[-1] in document.text[start:]
    assert document.size_bytes == (tmp_path / "harbour.pdf").stat().st_size


def test_pdf_paragraphs_read_as_prose_not_as_the_pdfs_lines(tmp_path: Path) -> None:
    document = convert_document(write_long_pdf(tmp_path / "book.pdf", pages=2))

    lines = document.text.split("\n")
    for page, paragraph in ((1, 1), (1, 4), (2, 3)):
        sentence = (f"On page {page}, paragraph {paragraph}, the harbour master counted "
                    f"{page * paragraph} boats while the tide rose over the old pier.")
        assert " ".join([sentence] * 5) in lines
    assert "Chapter 2: the harbour in season 2" in lines


def test_a_word_broken_at_a_pdf_lines_end_is_made_whole(tmp_path: Path) -> None:
    lines = ["The keeper of the lighthouse climbed the stairs at dusk and lit the great",
             "lamp; the harbour master counted forty boats from the old light-",
             "house gallery before the tide turned against the fleet."]

    document = convert_document(write_pdf(tmp_path / "keeper.pdf", [("The keeper", lines)]))

    assert document.text == ("The keeper\nThe keeper of the lighthouse climbed the stairs at "
                             "dusk and lit the great lamp; the harbour master counted forty boats "
                             "from the old lighthouse gallery before the tide turned against the "
                             "fleet.")


def test_a_pdfs_short_lines_and_list_items_stay_lines() -> None:
    lines = ["Pack these for the boat trip that leaves the old pier at seven tomorrow:",
             "• two coils of rope and a spare anchor chain for the small dinghy",
             "• oilskins",
             "Harbour office",
             "12 Quay Street"]

    assert prose_text(lines) == "\n".join(lines)


def test_pdf_chunks_know_their_page(tmp_path: Path) -> None:
    document = convert_document(write_pdf(tmp_path / "harbour.pdf", THREE_CHAPTERS))

    pages = {chunk.page for chunk in chunk_document(document) if "storm" in chunk.text}

    assert pages == {2}


def test_pdf_progress_is_reported_after_each_page(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []

    convert_document(write_pdf(tmp_path / "harbour.pdf", THREE_CHAPTERS),
                     on_progress=lambda done, total: calls.append((done, total)))

    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_pdf_reading_stops_when_progress_raises(tmp_path: Path) -> None:
    class Cancelled(Exception):
        pass

    def cancel_at_page_two(done: int, total: int) -> None:
        if done == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        convert_document(write_pdf(tmp_path / "harbour.pdf", THREE_CHAPTERS),
                         on_progress=cancel_at_page_two)
    assert convert_document(tmp_path / "harbour.pdf").pages == 3


def test_password_protected_pdf_is_refused_in_words(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "secret.pdf", THREE_CHAPTERS, password="hunter2")

    with pytest.raises(EncryptedDocumentError, match=r"secret\.pdf is password-protected"):
        convert_document(path)


def test_scanned_pdf_is_refused_with_advice_to_run_ocr(tmp_path: Path) -> None:
    path = write_scanned_pdf(tmp_path / "scan.pdf", pages=3)

    with pytest.raises(NoTextLayerError) as raised:
        convert_document(path)

    assert "scan.pdf has no text to read" in str(raised.value)
    assert "scanned image" in str(raised.value) and "OCR" in str(raised.value)


def test_pdf_with_a_blank_page_lists_it_and_keeps_the_others(tmp_path: Path) -> None:
    pages = [THREE_CHAPTERS[0], ("", []), THREE_CHAPTERS[2]]

    document = convert_document(write_pdf(tmp_path / "gaps.pdf", pages))

    assert (document.pages, document.textless_pages) == (3, (2,))
    assert "Fish sold" in document.text[document.page_starts[2]:]


def test_pdf_with_more_pages_than_the_bound_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdf, "MAX_PAGES", 2)

    with pytest.raises(DocumentTooLargeError, match=r"harbour\.pdf is too large.*3 pages"):
        convert_document(write_pdf(tmp_path / "harbour.pdf", THREE_CHAPTERS))


def test_pdf_content_is_read_as_pdf_whatever_its_name(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "harbour.pdf", THREE_CHAPTERS).rename(tmp_path / "harbour.txt")

    assert convert_document(path).kind == "pdf"


def test_notes_that_mention_a_pdf_header_are_still_notes(tmp_path: Path) -> None:
    path = tmp_path / "formats.md"
    path.write_text("# PDF\n\nEvery PDF begins with `%PDF-1.7` or similar.\n", encoding="utf-8")

    assert convert_document(path).kind == "markdown"


def test_file_named_pdf_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fake.pdf"
    path.write_text("just some words", encoding="utf-8")

    with pytest.raises(UnreadableDocumentError, match=r"fake\.pdf.*no %PDF header"):
        convert_document(path)


def test_broken_pdf_is_refused_as_damaged(tmp_path: Path) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8)

    with pytest.raises(UnreadableDocumentError, match=r"could not read broken\.pdf.*damaged"):
        convert_document(path)


def test_docx_headings_and_paragraphs_become_markdown(tmp_path: Path) -> None:
    path = write_docx(tmp_path / "report.docx", [
        ("Methods", ["We counted boats at dawn."]),
        ("Results", ["Forty boats came back before noon."]),
    ])

    document = convert_document(path)

    assert (document.kind, document.pages, document.page_starts) == ("docx", None, ())
    assert "# Methods\n\nWe counted boats at dawn." in document.text
    assert "# Results" in document.text


def test_docx_chunks_know_the_heading_above_them(tmp_path: Path) -> None:
    long_paragraph = "The harbour master wrote down every boat that came in. " * 30
    path = write_docx(tmp_path / "report.docx", [
        ("Methods", [long_paragraph]),
        ("Results", ["Forty boats came back before noon.", long_paragraph]),
    ])

    chunks = chunk_document(convert_document(path))

    result_chunks = [chunk for chunk in chunks if "Forty boats" in chunk.text]
    assert [chunk.heading for chunk in result_chunks] == ["Results"]
    assert chunks[-1].heading == "Results"
    assert {chunk.heading for chunk in chunks} >= {"Methods", "Results"}


def test_word_file_locked_with_a_password_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "locked.docx"  # Office stores an encrypted .docx in a compound file
    path.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(2048))

    with pytest.raises(EncryptedDocumentError, match=r"locked\.docx is password-protected"):
        convert_document(path)


def test_docx_that_is_not_a_zip_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.docx"
    path.write_text("plain words, not a Word file", encoding="utf-8")

    with pytest.raises(UnreadableDocumentError, match=r"notes\.docx.*not a \.docx file inside"):
        convert_document(path)


def test_zip_archive_named_docx_without_a_document_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "photos.docx"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("holiday.txt", "sun")

    with pytest.raises(UnreadableDocumentError, match=r"photos\.docx.*no Word document inside"):
        convert_document(path)


def test_office_file_that_unpacks_past_the_bound_is_refused_before_converting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_docx(tmp_path / "report.docx", [("Methods", ["We counted boats."])])
    monkeypatch.setattr(office, "MAX_UNPACKED_BYTES", 1024)

    with pytest.raises(DocumentTooLargeError, match=r"report\.docx is too large.*unpacked"):
        convert_document(path)


def test_corrupt_docx_is_refused_naming_what_failed(tmp_path: Path) -> None:
    path = tmp_path / "mangled.docx"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("word/document.xml", "<not really xml")

    with pytest.raises(UnreadableDocumentError, match=r"mangled\.docx.*as a Word document failed"):
        convert_document(path)


def test_old_word_format_is_refused_with_advice_to_save_as_docx(tmp_path: Path) -> None:
    path = tmp_path / "memo.doc"
    path.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(2048))

    with pytest.raises(UnsupportedDocumentError,
                       match=r"memo\.doc: it is in an old .*Save it as \.docx in Word"):
        convert_document(path)


def test_presentation_slides_are_its_pages(tmp_path: Path) -> None:
    path = write_pptx(tmp_path / "deck.pptx", [("Budget", "Costs fell by a tenth."),
                                               ("Plans", "Two new boats in spring.")])

    document = convert_document(path)

    assert (document.kind, document.pages) == ("pptx", 2)
    assert document.text[document.page_starts[1]:].startswith("# Plans")
    assert "Slide number" not in document.text
    assert [(chunk.page, chunk.heading) for chunk in chunk_document(document)] == [
        (1, "Budget"), (2, "Plans")]


def test_workbook_sheets_become_headed_tables(tmp_path: Path) -> None:
    path = write_xlsx(tmp_path / "sales.xlsx", {"North": [["Month", "Boats"], ["May", 12]],
                                                "South": [["Month", "Boats"], ["May", 7]]})

    document = convert_document(path)

    assert document.kind == "xlsx"
    assert "## North" in document.text and "| May | 12 |" in document.text
    assert "## South" in document.text and "| May | 7 |" in document.text


def test_html_page_becomes_markdown_without_its_scripts(tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    path.write_text("<html><head><title>Tides</title><script>track()</script></head><body>"
                    "<h1>Tide tables</h1><p>High water at <b>06:12</b>.</p>"
                    "<h2>Notes</h2><p>Spring tides &amp; neap tides.</p></body></html>",
                    encoding="utf-8")

    document = convert_document(path)

    assert document.kind == "html"
    assert "# Tide tables" in document.text and "## Notes" in document.text
    assert "Spring tides & neap tides." in document.text
    assert "track()" not in document.text


def test_html_in_latin1_is_decoded(tmp_path: Path) -> None:
    path = tmp_path / "café.htm"
    path.write_bytes("<html><body><p>Le café du port est ouvert à midi, été comme hiver, "
                     "déjà depuis des années.</p></body></html>".encode("latin-1"))

    assert "Le café du port est ouvert à midi" in convert_document(path).text


def test_markdown_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("# Notes\n\nBring **rope**.\n", encoding="utf-8")

    document = convert_document(path)

    assert (document.kind, document.text) == ("markdown", "# Notes\n\nBring **rope**.\n")


def test_python_file_is_fenced_with_its_language(tmp_path: Path) -> None:
    path = tmp_path / "tides.py"
    path.write_text("# high water\ndef high_water():\n    return 6.2\n", encoding="utf-8")

    document = convert_document(path)

    assert document.kind == "code"
    assert document.text == "```python\n# high water\ndef high_water():\n    return 6.2\n```"
    assert chunk_document(document)[0].heading is None


def test_code_holding_a_fence_gets_a_longer_fence(tmp_path: Path) -> None:
    path = tmp_path / "readme_tool.py"
    path.write_text('DOC = """\n```bash\nls\n```\n"""\n', encoding="utf-8")

    text = convert_document(path).text

    assert text.startswith("````python\n") and text.endswith("\n````")


def test_utf16_text_is_decoded(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_text("Boats: 40\r\nWind: 5 Bft, gusting ≥ 7\r\n", encoding="utf-16")

    document = convert_document(path)

    assert (document.kind, document.text) == ("text", "Boats: 40\nWind: 5 Bft, gusting ≥ 7\n")


@pytest.mark.parametrize(("text", "encoding"), [
    (("Le café du port ouvre à six heures. Les pêcheurs déjà rentrés boivent leur café crème "
     "près de la fenêtre, où l'été dure jusqu'en octobre.\n"), "latin-1"),
    ("El niño comió piña en la mañana; el pescador llegó tarde al puerto.\n", "cp1252"),
    ("Zażółć gęślą jaźń, to jest polski tekst. Łódź leży w środku kraju.\n", "cp1250"),
    ("Привет! Порт открыт днём, и рыбаки везут рыбу на рынок.\n", "cp1251"),
])
def test_legacy_encoded_text_is_decoded(tmp_path: Path, text: str, encoding: str) -> None:
    path = tmp_path / "port.txt"
    path.write_bytes(text.encode(encoding))

    assert convert_document(path).text == text


def test_text_with_an_unknown_extension_is_read_as_text(tmp_path: Path) -> None:
    path = tmp_path / "harbour.notes"
    path.write_text("Forty boats came back.\n", encoding="utf-8")

    assert convert_document(path).kind == "text"


def test_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nothing.txt"
    path.write_bytes(b"")

    with pytest.raises(EmptyDocumentError, match=r"nothing\.txt is empty"):
        convert_document(path)


def test_file_of_blank_space_is_refused_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "blank.md"
    path.write_text("  \n\n\t\n", encoding="utf-8")

    with pytest.raises(EmptyDocumentError, match=r"blank\.md is empty"):
        convert_document(path)


def test_binary_bytes_named_txt_are_refused_as_not_text(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_bytes(bytes(range(256)) * 16)

    with pytest.raises(UnsupportedDocumentError, match=r"data\.txt: it does not hold text"):
        convert_document(path)


def test_binary_file_with_an_unknown_extension_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "firmware.qqq"
    path.write_bytes(b"\x00\x01\x02\xfe\xff" * 400)

    with pytest.raises(UnsupportedDocumentError) as raised:
        convert_document(path)

    assert "firmware.qqq" in str(raised.value)
    assert "Pagoda reads PDF, Word (.docx)" in str(raised.value)


def test_image_is_refused_as_an_image(tmp_path: Path) -> None:
    path = tmp_path / "boat.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(500))

    with pytest.raises(UnsupportedDocumentError, match=r"boat\.png: it is a PNG image"):
        convert_document(path)


def test_text_that_starts_like_a_program_header_is_still_text(tmp_path: Path) -> None:
    path = tmp_path / "minutes.txt"
    path.write_text("MZ Harbour Group minutes: forty boats.\n", encoding="utf-8")

    assert convert_document(path).text.startswith("MZ Harbour Group")


def test_file_past_the_size_bound_is_refused_before_reading_it_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.txt"
    path.write_text("boats " * 1000, encoding="utf-8")
    monkeypatch.setattr(convert, "MAX_FILE_BYTES", 2**20 // 1024)

    with pytest.raises(DocumentTooLargeError, match=r"big\.txt is too large"):
        convert_document(path)


def test_text_past_the_character_bound_is_refused(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "long.md"
    path.write_text("boats " * 100, encoding="utf-8")
    monkeypatch.setattr(convert, "MAX_TEXT_CHARS", 100)

    with pytest.raises(DocumentTooLargeError, match=r"long\.md is too large.*600 characters"):
        convert_document(path)


def test_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "reports").mkdir()

    with pytest.raises(UnsupportedDocumentError, match=r"reports: it is a folder"):
        convert_document(tmp_path / "reports")


def test_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UnreadableDocumentError,
                       match=r"could not read gone\.pdf: no such file.*still there"):
        convert_document(tmp_path / "gone.pdf")


def test_importing_the_package_leaves_markitdown_and_pdfium_unloaded() -> None:
    probe = ("import sys, pagoda.app.components.documents; "
             "print(sorted({'markitdown', 'pypdfium2', 'charset_normalizer'} & set(sys.modules)))")

    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, cwd=Path(__file__).parents[4])

    assert result.stdout.strip() == "[]"
