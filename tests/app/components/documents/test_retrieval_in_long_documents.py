"""The passage that answers a question is found in a 200-page PDF, in English and in Chinese:
read, cut into passages, indexed by the store and searched as a chat searches it."""

from __future__ import annotations

from pathlib import Path

import pytest
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.cidfonts import UnicodeCIDFont
from reportlab.pdfgen.canvas import Canvas

from pagoda.app.components.documents import chunk_document, fts_query, read_document
from pagoda.app.components.documents.chat_documents import attachment_of
from pagoda.app.store import ConversationStore

PAGES = 200
ANSWER_PAGE = 137
ENGLISH_FILLER = ["The keeper wrote down the wind, the sea and the ships that passed each day.",
                  "Supplies came by boat on Mondays; the lamp was trimmed every evening.",
                  "Gulls nested on the gallery rail through the spring and the summer."]
ENGLISH_ANSWER = "The harbour master's launch was repainted dark green in the spring of 1987."
CHINESE_FILLER = ["看守人每天记录风向、海况和经过的船只。", "补给每周一由小船送来，灯每晚都要修剪。",
                  "春夏两季，海鸥在栏杆上筑巢。"]
CHINESE_ANSWER = "一九八七年春天，港务长的汽艇被重新漆成了深绿色。"


def write_pdf(path: Path, filler: list[str], answer: str, font: str) -> None:
    canvas = Canvas(str(path))
    for page in range(1, PAGES + 1):
        text = canvas.beginText(40, 800)
        text.setFont(font, 10)
        for line in range(30):
            text.textLine(filler[(page + line) % len(filler)])
        if page == ANSWER_PAGE:
            text.textLine(answer)
        canvas.drawText(text)
        canvas.showPage()
    canvas.save()


@pytest.fixture
def indexed(store: ConversationStore, tmp_path: Path):
    """index(filler, answer, font) -> (the attachment's id) of a 200-page PDF in the store."""
    message = store.append_user_message(store.create_conversation().id, "read this")

    def index(filler: list[str], answer: str, font: str) -> int:
        path = tmp_path / f"log-{font}.pdf"
        write_pdf(path, filler, answer, font)
        document = read_document(path)
        assert document.pages == PAGES
        attachment = attachment_of(document, chunk_document(document))
        return store.add_attachment(message.id, attachment).id

    return index


@pytest.mark.parametrize("question", ["What colour was the harbour master's launch painted?",
                                      "When was the launch repainted?"])
def test_an_english_question_finds_its_page_in_200(store, indexed, question) -> None:
    attachment = indexed(ENGLISH_FILLER, ENGLISH_ANSWER, "Helvetica")
    hits = store.search_passages([attachment], fts_query(question), question, 3)
    assert hits[0].chunk.page == ANSWER_PAGE and "dark green" in hits[0].chunk.text


@pytest.mark.parametrize("question", ["港务长的汽艇是什么颜色？", "汽艇是哪一年重新漆的？"])
def test_a_chinese_question_finds_its_page_in_200(store, indexed, question) -> None:
    pdfmetrics.registerFont(UnicodeCIDFont("STSong-Light"))
    attachment = indexed(CHINESE_FILLER, CHINESE_ANSWER, "STSong-Light")
    hits = store.search_passages([attachment], fts_query(question), question, 3)
    assert hits[0].chunk.page == ANSWER_PAGE and "深绿色" in hits[0].chunk.text
