"""Documents in a chat, as the window shows them: attached by the paperclip, a paste or a drop,
waiting as chips above the box (Send waits while one is read), listed under the user's message,
and cited under the reply as links that open the passage."""

from __future__ import annotations

from datetime import datetime

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QFrame,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QToolButton,
    QWidget,
)

from pagoda.app.components.shared.view_models import (
    AttachmentView,
    MessageView,
    PassageView,
    SourceView,
)
from pagoda.app.qt.chat.chat_tab import ChatTab
from pagoda.app.qt.chat.composer import ATTACH_TIP
from pagoda.app.qt.chat.controller import ChatController
from pagoda.app.qt.documents.attachment_text import size_text, source_labels
from pagoda.app.qt.documents.passage_dialog import PassageDialog

NOW = datetime(2026, 11, 29, 14, 3)
REPORT = AttachmentView("report.pdf", "pdf", 340_000, 12)
READING = AttachmentView("big.pdf", "pdf", 8_200_000, None, "reading", progress="page 40 / 200")
FAILED = AttachmentView("old.doc", "", 24_000, None, "failed",
                        error="Pagoda does not read .doc files. Save it as .docx and attach that.")
SOURCES = (SourceView(1, "report.pdf", 12), SourceView(2, "notes.md"))


@pytest.fixture
def tab(qtbot) -> ChatTab:
    widget = ChatTab(1)
    widget.resize(720, 560)
    qtbot.addWidget(widget)
    widget.show()
    return widget


def box(tab: ChatTab) -> QPlainTextEdit:
    return tab.composer.findChild(QPlainTextEdit, "composer")


def send_button(tab: ChatTab) -> QPushButton:
    return tab.composer.findChild(QPushButton, "sendButton")


def chips(tab: ChatTab) -> list[QFrame]:
    """The chips shown (those taken off are hidden at once, deleted later)."""
    return [chip for chip in tab.composer.findChildren(QFrame, "attachmentChip")
            if not chip.isHidden()]


def chip_texts(tab: ChatTab) -> list[tuple[str, str]]:
    return [(chip.findChild(QLabel, "attachmentName").text(),
             chip.findChild(QLabel, "attachmentStatus").text()) for chip in chips(tab)]


def remove_buttons(tab: ChatTab) -> list[QToolButton]:
    return [chip.findChild(QToolButton, "removeAttachment") for chip in chips(tab)]


def files_mime(*paths) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path)) for path in paths])
    return mime


def drop(target: QWidget, mime: QMimeData) -> bool:
    """Drag `mime` over `target` and let go; whether the drag was taken."""
    point = target.rect().center()
    enter = QDragEnterEvent(point, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(target, enter)
    if not enter.isAccepted():
        return False
    dropped = QDropEvent(QPointF(point), Qt.DropAction.CopyAction, mime,
                         Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(target, dropped)
    return dropped.isAccepted()


def message(message_id: int, role: str, content: str, **fields) -> MessageView:
    return MessageView(message_id, role, content, NOW, **fields)


def transcript_links(tab: ChatTab) -> dict[str, QUrl]:
    document = tab.transcript.findChild(QTextBrowser).document()
    found: dict[str, QUrl] = {}
    block = document.begin()
    while block.isValid():
        fragments = block.begin()
        while not fragments.atEnd():
            fragment = fragments.fragment()
            if fragment.charFormat().isAnchor():
                found[fragment.text()] = QUrl(fragment.charFormat().anchorHref())
            fragments += 1
        block = block.next()
    return found


# -- attaching --------------------------------------------------------------------------------


def test_the_paperclip_opens_a_file_dialog_and_the_chosen_files_are_attached(tab, qtbot, tmp_path):
    report, notes = tmp_path / "report.pdf", tmp_path / "notes.md"
    report.write_bytes(b"%PDF-1.7")
    notes.write_text("# Notes")
    paperclip = tab.composer.findChild(QToolButton, "attachButton")
    assert paperclip.toolTip() == ATTACH_TIP

    qtbot.mouseClick(paperclip, Qt.MouseButton.LeftButton)
    dialog = tab.findChild(QFileDialog, "attachDialog")
    assert dialog is not None and dialog.isVisible()
    assert dialog.fileMode() == QFileDialog.FileMode.ExistingFiles

    dialog.setDirectory(str(tmp_path))
    dialog.selectFile('"report.pdf" "notes.md"')
    with qtbot.waitSignal(tab.attach_requested) as attached:
        dialog.accept()
    assert sorted(attached.args[0]) == sorted([str(report), str(notes)])

    qtbot.mouseClick(paperclip, Qt.MouseButton.LeftButton)
    again = tab.findChild(QFileDialog, "attachDialog")
    assert again.directory().absolutePath() == str(tmp_path)  # where the user last chose from
    again.reject()


def test_pasting_copied_files_attaches_them_instead_of_pasting_their_paths(tab, qtbot, tmp_path):
    QGuiApplication.clipboard().setMimeData(files_mime(tmp_path / "report.pdf"))
    box(tab).setFocus()

    with qtbot.waitSignal(tab.attach_requested) as attached:
        qtbot.keyClick(box(tab), Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)

    assert attached.args == [[str(tmp_path / "report.pdf")]]
    assert tab.composer.text() == ""


def test_pasting_text_or_a_web_link_still_pastes_text(tab, qtbot):
    link = QMimeData()
    link.setUrls([QUrl("https://example.com/a.pdf")])
    link.setText("https://example.com/a.pdf")

    with qtbot.assertNotEmitted(tab.attach_requested):
        QGuiApplication.clipboard().setText("plain words ")
        box(tab).paste()
        QGuiApplication.clipboard().setMimeData(link)
        box(tab).paste()

    assert tab.composer.text() == "plain words https://example.com/a.pdf"


@pytest.mark.parametrize("where", ["transcript", "composer", "tab"])
def test_files_dropped_anywhere_on_the_tab_are_attached(tab, qtbot, tmp_path, where):
    target = {"transcript": tab.transcript.drop_area(), "composer": box(tab).viewport(),
              "tab": tab}[where]

    with qtbot.waitSignal(tab.attach_requested) as attached:
        assert drop(target, files_mime(tmp_path / "a.txt", tmp_path / "b.docx"))

    assert attached.args == [[str(tmp_path / "a.txt"), str(tmp_path / "b.docx")]]
    assert tab.composer.text() == ""


def test_dropping_text_on_the_transcript_attaches_nothing(tab, qtbot):
    words = QMimeData()
    words.setText("just words")

    with qtbot.assertNotEmitted(tab.attach_requested):
        assert not drop(tab.transcript.drop_area(), words)


# -- waiting documents --------------------------------------------------------------------------


def test_chips_show_each_waiting_document_and_where_it_stands(tab):
    tab.show_pending_attachments([REPORT, READING, FAILED])

    assert chip_texts(tab) == [
        ("▤ report.pdf", "12 pages · 340 KB"),
        ("▤ big.pdf", "reading… page 40 / 200"),
        ("▤ old.doc", FAILED.error),
    ]
    statuses = [chip.findChild(QLabel, "attachmentStatus") for chip in chips(tab)]
    assert [status.property("error") for status in statuses] == [None, None, True]
    assert tab.composer.findChild(QWidget, "attachmentChips").isVisible()


def test_the_cross_takes_that_document_off_failed_ones_too(tab, qtbot):
    tab.show_pending_attachments([REPORT, FAILED])

    with qtbot.waitSignal(tab.composer.pending_removed) as removed:
        qtbot.mouseClick(remove_buttons(tab)[1], Qt.MouseButton.LeftButton)
    assert removed.args == [1]
    assert remove_buttons(tab)[0].toolTip() == "Remove report.pdf"

    tab.show_pending_attachments([REPORT])
    assert chip_texts(tab) == [("▤ report.pdf", "12 pages · 340 KB")]
    tab.show_pending_attachments([])
    assert not tab.composer.findChild(QWidget, "attachmentChips").isVisible()


def test_send_waits_while_a_document_is_read(tab, qtbot):
    tab.composer.set_text("Summarize it")
    tab.show_pending_attachments([REPORT, READING])

    assert not send_button(tab).isEnabled()
    assert send_button(tab).toolTip() == "Reading big.pdf…"
    with qtbot.assertNotEmitted(tab.composer.send_requested):
        qtbot.keyClick(box(tab), Qt.Key.Key_Return)
    hint = tab.composer.findChild(QLabel, "streamingHint")
    assert hint.isVisible() and hint.text().startswith("Reading big.pdf…")
    assert tab.composer.text() == "Summarize it"

    tab.show_pending_attachments([REPORT, AttachmentView("big.pdf", "pdf", 8_200_000, 200)])
    assert send_button(tab).isEnabled() and not hint.isVisible()
    with qtbot.waitSignal(tab.composer.send_requested) as sent:
        qtbot.keyClick(box(tab), Qt.Key.Key_Return)
    assert sent.args == ["Summarize it"]


# -- in the transcript --------------------------------------------------------------------------


def test_a_user_message_lists_the_documents_it_brought(tab):
    tab.show_messages([message(1, "user", "What does it say?", attachments=(REPORT,))])

    text = tab.transcript.plain_text()
    assert "What does it say?" in text
    assert "▤ report.pdf · 12 pages · 340 KB" in text


def test_a_reply_links_its_sources_and_a_click_asks_for_the_passage(tab, qtbot):
    tab.show_messages([
        message(1, "user", "What does it say?", attachments=(REPORT,)),
        message(2, "assistant", "Sales grew [1].", sources=SOURCES),
    ])

    assert "Sources: [1] report.pdf, p. 12  ·  [2] notes.md" in tab.transcript.plain_text()
    with qtbot.waitSignal(tab.transcript.source_requested) as requested:
        tab.transcript.findChild(QTextBrowser).anchorClicked.emit(
            transcript_links(tab)["[2] notes.md"])
    assert requested.args == [2, 2]


def test_passages_of_one_file_are_told_apart_by_heading_and_page(tab):
    sources = (SourceView(1, "falcon-report.docx", None, "Flight tests", 3),
               SourceView(2, "falcon-report.docx", None, "Engine wear and inspection intervals "
                          "after the first hundred hours", 7),
               SourceView(3, "falcon-report.docx", None, "Flight tests", 4),
               SourceView(4, "falcon-report.pdf", 12, None, 20))
    tab.show_messages([message(1, "user", "Summarise the report."),
                       message(2, "assistant", "It flew [1][2][3][4].", sources=sources)])

    assert ("Sources: [1] falcon-report.docx › Flight tests, passage 4  ·  "
            "[2] falcon-report.docx › Engine wear and inspection intervals af…  ·  "
            "[3] falcon-report.docx › Flight tests, passage 5  ·  "
            "[4] falcon-report.pdf, p. 12") in tab.transcript.plain_text()


def test_passages_without_page_or_heading_say_which_passage_they_are():
    same_file = (SourceView(1, "notes.txt", None, None, 0), SourceView(2, "notes.txt", None, None, 5),
                 SourceView(3, "other.txt", None, None, 2))

    assert source_labels(same_file) == ["[1] notes.txt, passage 1", "[2] notes.txt, passage 6",
                                         "[3] other.txt"]
    whole_files = (SourceView(1, "report.pdf"), SourceView(2, "report.pdf"))  # two files, whole
    assert source_labels(whole_files) == ["[1] report.pdf", "[2] report.pdf"]


def test_a_streaming_reply_keeps_its_sources_below_the_answer(tab):
    tab.show_messages([message(1, "user", "What does it say?")])
    tab.begin_stream(message(2, "assistant", "", status="streaming", sources=SOURCES[:1]))
    tab.append_delta(2, "Sales ")
    tab.append_delta(2, "grew.")

    text = tab.transcript.plain_text()
    assert text.index("Sales grew.") < text.index("Sources: [1] report.pdf, p. 12")


def test_a_passage_opens_beside_the_chat_and_the_next_one_replaces_it(tab, qtbot):
    tab.show_passage(PassageView("report.pdf", 12, "Results", "Sales grew by 12 %."))

    dialog = tab.findChild(PassageDialog, "passageDialog")
    assert dialog.isVisible() and not dialog.isModal()
    assert dialog.findChild(QLabel, "passagePlace").text() == "report.pdf · page 12"
    assert dialog.findChild(QLabel, "passageHeading").text() == "Results"
    assert dialog.text() == "Sales grew by 12 %."
    flags = dialog.findChild(QPlainTextEdit, "passageText").textInteractionFlags()
    assert flags & Qt.TextInteractionFlag.TextSelectableByMouse

    tab.show_passage(PassageView("notes.md", None, None, "Call Ana."))
    assert tab.findChildren(PassageDialog) == [dialog]
    assert dialog.windowTitle() == "notes.md" and dialog.text() == "Call Ana."
    assert not dialog.findChild(QLabel, "passageHeading").isVisible()


def test_a_new_tab_takes_documents_before_showing_anything(qtbot):
    fresh = ChatTab(2)
    qtbot.addWidget(fresh)
    fresh.show_pending_attachments([])
    fresh.show_pending_attachments([REPORT])
    fresh.show_passage(PassageView("report.pdf", 1, None, "text"))

    assert chip_texts(fresh) == [("▤ report.pdf", "12 pages · 340 KB")]


# -- forwarded to the session -------------------------------------------------------------------


class RecordingSession:
    """What the controller calls of a ChatSession for documents, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.files = self  # the session's files (a ChatFiles) are recorded here too

    def spawn(self, call: tuple) -> None:
        self.calls.append(("spawn", *call))

    def attach(self, paths: list[str]) -> tuple:
        return ("attach", paths)

    def remove_pending(self, index: int) -> None:
        self.calls.append(("remove_pending", index))

    def open_source(self, message_id: int, number: int) -> tuple:
        return ("open_source", message_id, number)

    def stop(self) -> None: ...

    def begin_edit(self, message_id: int) -> None: ...

    def clear_notice(self) -> None: ...


def test_the_controller_forwards_attaching_removing_and_opening_a_source(tab, tmp_path):
    session = RecordingSession()
    ChatController(session, tab)
    tab.show_pending_attachments([REPORT])
    tab.show_messages([message(1, "user", "Q"), message(2, "assistant", "A", sources=SOURCES)])

    drop(tab.transcript.drop_area(), files_mime(tmp_path / "a.txt"))
    remove_buttons(tab)[0].click()
    tab.transcript.findChild(QTextBrowser).anchorClicked.emit(
        transcript_links(tab)["[1] report.pdf, p. 12"])

    assert session.calls == [
        ("spawn", "attach", [str(tmp_path / "a.txt")]),
        ("remove_pending", 0),
        ("spawn", "open_source", 2, 1),
    ]
    assert session.view is tab


@pytest.mark.parametrize(("num_bytes", "text"), [
    (812, "812 bytes"), (4_540, "4.5 KB"), (340_000, "340 KB"), (999_600, "1.0 MB"),
    (2_400_000, "2.4 MB"), (18_000_000, "18 MB"), (1_200_000_000, "1.2 GB"),
])
def test_sizes_read_as_a_file_manager_writes_them(num_bytes, text):
    assert size_text(num_bytes) == text
