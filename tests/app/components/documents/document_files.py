"""Real files for the reading tests, written into tmp_path: PDFs drawn with reportlab, Word
files with python-docx, presentations with python-pptx, workbooks with openpyxl."""

from __future__ import annotations

from pathlib import Path

PAGE_HEIGHT = 842  # A4, in points


def write_pdf(path: Path, pages: list[tuple[str, list[str]]], password: str | None = None) -> Path:
    """A PDF with one page per (heading, lines): the heading in bold, then the lines."""
    from reportlab.pdfgen.canvas import Canvas

    canvas = Canvas(str(path), pagesize=(595, PAGE_HEIGHT), encrypt=password)
    for heading, lines in pages:
        canvas.setFont("Helvetica-Bold", 16)
        canvas.drawString(72, PAGE_HEIGHT - 72, heading)
        canvas.setFont("Helvetica", 11)
        for number, line in enumerate(lines):
            canvas.drawString(72, PAGE_HEIGHT - 110 - 16 * number, line)
        canvas.showPage()
    canvas.save()
    return path


def write_scanned_pdf(path: Path, pages: int) -> Path:
    """A PDF whose pages hold only drawings, as a scan without OCR holds only an image."""
    from reportlab.pdfgen.canvas import Canvas

    canvas = Canvas(str(path), pagesize=(595, PAGE_HEIGHT))
    for _ in range(pages):
        canvas.rect(72, 200, 450, 500, fill=1)
        canvas.circle(300, 400, 80)
        canvas.showPage()
    canvas.save()
    return path


def write_long_pdf(path: Path, pages: int) -> Path:
    """A book-like PDF: a chapter heading and four wrapped paragraphs on each page."""
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate

    styles = getSampleStyleSheet()
    story = []
    for page in range(1, pages + 1):
        story.append(Paragraph(f"Chapter {page}: the harbour in season {page}", styles["Heading1"]))
        for paragraph in range(1, 5):
            sentence = (f"On page {page}, paragraph {paragraph}, the harbour master counted "
                        f"{page * paragraph} boats while the tide rose over the old pier. ")
            story.append(Paragraph(sentence * 5, styles["BodyText"]))
        story.append(PageBreak())
    SimpleDocTemplate(str(path)).build(story)
    return path


def write_docx(path: Path, sections: list[tuple[str, list[str]]]) -> Path:
    """A Word file: a title, then each (heading, paragraphs) as a level-1 heading and text."""
    from docx import Document

    document = Document()
    document.add_heading("Field report", level=0)
    for heading, paragraphs in sections:
        document.add_heading(heading, level=1)
        for paragraph in paragraphs:
            document.add_paragraph(paragraph)
    document.save(str(path))
    return path


def write_pptx(path: Path, slides: list[tuple[str, str]]) -> Path:
    """A presentation with one title-and-content slide per (title, body)."""
    from pptx import Presentation

    presentation = Presentation()
    for title, body in slides:
        slide = presentation.slides.add_slide(presentation.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    presentation.save(str(path))
    return path


def write_xlsx(path: Path, sheets: dict[str, list[list[object]]]) -> Path:
    """A workbook with the given sheets and rows."""
    from openpyxl import Workbook

    workbook = Workbook()
    workbook.remove(workbook.active)
    for title, rows in sheets.items():
        sheet = workbook.create_sheet(title)
        for row in rows:
            sheet.append(row)
    workbook.save(str(path))
    return path
