"""The transcript: what a user sees of a conversation and what its links do."""

from __future__ import annotations

from datetime import datetime

import pytest
from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import (
    QColor,
    QFont,
    QGuiApplication,
    QPalette,
    QTextCursor,
    QTextDocumentFragment,
    QTextFrame,
    QTextTable,
)
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMainWindow,
    QTextBrowser,
    QToolButton,
    QWidget,
)

from pagoda.app.components.shared.view_models import MessageView
from pagoda.app.qt.chat import transcript
from pagoda.app.qt.chat.markdown.markdown_render import Segment, split_fenced_code
from pagoda.app.qt.chat.transcript import TranscriptView

NOW = datetime(2026, 11, 29, 14, 3)
ANSWER = """Here is a **bold** word and a list:

- first item
- second item

```python
def greet(name):
    return f"hello {name}"
```

Done.
"""


def message(message_id: int, role: str, content: str, **fields) -> MessageView:
    return MessageView(message_id, role, content, NOW, **fields)


def browser(view: TranscriptView) -> QTextBrowser:
    return view.findChild(QTextBrowser)


def frames(view: TranscriptView) -> list[QTextFrame]:
    return browser(view).document().rootFrame().childFrames()


def frame_text(view: TranscriptView, index: int) -> str:
    return _frame_fragment(view, frames(view)[index]).toPlainText()


def frame_html(view: TranscriptView, index: int) -> str:
    return _frame_fragment(view, frames(view)[index]).toHtml()


def _frame_fragment(view: TranscriptView, frame: QTextFrame) -> QTextDocumentFragment:
    # Never frame.document(): PySide6 then ties the document's life to the frame's wrapper.
    cursor = QTextCursor(browser(view).document())
    cursor.setPosition(frame.firstPosition())
    cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
    return cursor.selection()


def fragments(view: TranscriptView, message_id: int):
    """(text, char format) of every run of text inside one message's block."""
    frame = frames(view)[view.message_ids().index(message_id)]
    block = browser(view).document().findBlock(frame.firstPosition())
    while block.isValid() and block.position() < frame.lastPosition():
        iterator = block.begin()
        while not iterator.atEnd():
            fragment = iterator.fragment()
            yield fragment.text(), fragment.charFormat()
            iterator += 1
        block = block.next()


def links(view: TranscriptView, message_id: int) -> dict[str, list[QUrl]]:
    found: dict[str, list[QUrl]] = {}
    for text, fmt in fragments(view, message_id):
        if fmt.isAnchor():
            found.setdefault(text, []).append(QUrl(fmt.anchorHref()))
    return found


def click(view: TranscriptView, message_id: int, label: str, nth: int = 0) -> None:
    browser(view).anchorClicked.emit(links(view, message_id)[label][nth])


def conversation() -> list[MessageView]:
    return [
        message(1, "user", "What is Python?"),
        message(2, "assistant", "A programming language.", stats_text="38.2 tok/s"),
        message(3, "user", "Show me code"),
        message(4, "assistant", ANSWER, sibling_index=1, sibling_count=3),
    ]


def test_window_finds_the_transcript_by_object_name(qtbot):
    window = QMainWindow()
    qtbot.addWidget(window)
    transcript = TranscriptView()
    window.setCentralWidget(transcript)
    assert window.findChild(QWidget, "transcript") is transcript


def test_set_messages_shows_every_message_in_order(view):
    view.set_messages(conversation())

    assert view.message_ids() == [1, 2, 3, 4]
    text = view.plain_text()
    positions = [text.index(s) for s in ("What is Python?", "A programming", "Show me code", "def greet")]
    assert positions == sorted(positions)
    assert "38.2 tok/s" in text
    assert view.message_text(4) == ANSWER


def test_set_messages_replaces_a_previous_branch(view):
    view.set_messages(conversation())
    view.set_messages([message(1, "user", "What is Python?"), message(7, "assistant", "A snake.")])

    assert view.message_ids() == [1, 7]
    assert "A snake." in view.plain_text()
    assert "Show me code" not in view.plain_text()
    assert len(frames(view)) == 2


def test_set_messages_keeps_the_unchanged_start_of_the_branch(view):
    view.set_messages(conversation())
    first_html = frame_html(view, 0)
    changes: list[int] = []
    browser(view).document().contentsChange.connect(lambda pos, removed, added: changes.append(pos))

    other_reply = message(9, "assistant", "Another answer", sibling_index=2, sibling_count=3)
    view.set_messages(conversation()[:3] + [other_reply])

    assert view.message_ids() == [1, 2, 3, 9]
    assert min(changes) > frames(view)[2].lastPosition()
    assert frame_html(view, 0) == first_html


def test_streamed_deltas_concatenate_exactly(view):
    view.set_messages(conversation()[:3])
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    deltas = ["Py", "thon 是一种", "编程语言 🐍", "\n", "第二行 👍🏽 done"]

    for delta in deltas:
        view.append_delta(5, delta)

    assert view.message_text(5) == "".join(deltas)
    assert "".join(deltas) in frame_text(view, -1)


def test_begin_stream_shows_partial_content(view):
    view.begin_stream(message(5, "assistant", "Already here", status="streaming"))
    view.append_delta(5, ", and more")

    assert view.message_text(5) == "Already here, and more"
    assert "Already here, and more" in view.plain_text()


def test_delta_for_a_message_not_streaming_is_ignored(view):
    view.set_messages(conversation())

    view.append_delta(2, "late")
    view.append_delta(99, "unknown")

    assert view.message_text(2) == "A programming language."
    assert "late" not in view.plain_text()


def test_end_stream_renders_markdown(view):
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    view.append_delta(5, ANSWER)
    view.end_stream(message(5, "assistant", ANSWER, stats_text="40.0 tok/s · TTFT 0.2 s"))

    runs = list(fragments(view, 5))
    assert any(text == "bold" and fmt.fontWeight() == QFont.Weight.Bold for text, fmt in runs)
    assert "**" not in view.plain_text()
    document = browser(view).document()
    listed = [document.findBlock(document.find("first item").position()).textList()]
    assert listed[0] is not None and listed[0].count() == 2
    assert "40.0 tok/s · TTFT 0.2 s" in view.plain_text()


def test_end_stream_highlights_fenced_code_in_monospace(view):
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    view.end_stream(message(5, "assistant", ANSWER))

    code_runs = [(t, fmt) for t, fmt in fragments(view, 5) if fmt.fontFixedPitch()]
    assert "def" in [t.strip() for t, _ in code_runs]
    assert any(fmt.foreground().color().name() != "#000000" for t, fmt in code_runs if t == "def")
    html = frame_html(view, 0)
    code_html = html[html.index("greet") - 300 : html.index("greet")]
    assert "color:#" in code_html
    assert 'def greet(name):\n    return f"hello {name}"' in view.plain_text()


def test_html_in_content_is_shown_as_text(view):
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    view.append_delta(5, "say <b>hi</b>")
    assert "say <b>hi</b>" in view.plain_text()

    view.end_stream(message(5, "assistant", "say <b>hi</b>\n\n<div>block</div>"))
    assert "say <b>hi</b>" in view.plain_text()
    assert "<div>block</div>" in view.plain_text()
    assert not any(t == "hi" and fmt.fontWeight() == QFont.Weight.Bold for t, fmt in fragments(view, 5))


def test_remote_images_and_links_in_markdown_render_without_fetching(view):
    content = '![pic](http://example.invalid/a.png) [site](https://example.invalid) <img src="x.png">'
    view.set_messages([message(1, "assistant", content)])
    browser(view).viewport().repaint()

    assert "[site]" not in view.plain_text()
    assert "site" in view.plain_text()


def test_action_links_written_by_the_model_do_nothing(view, qtbot):
    view.set_messages([message(1, "user", "hi"), message(2, "assistant", "[edit](pagoda://x/edit/1)")])
    forged = links(view, 2)["edit"][0]

    with qtbot.assertNotEmitted(view.edit_requested):
        browser(view).anchorClicked.emit(forged)


def test_copy_puts_the_message_on_the_clipboard(view, qtbot):
    view.set_messages(conversation())

    with qtbot.waitSignal(view.copied) as copied:
        click(view, 4, "Copy")

    assert copied.args == [ANSWER]
    assert QGuiApplication.clipboard().text() == ANSWER


def test_copy_reads_copied_for_a_moment(view, qtbot, monkeypatch):
    monkeypatch.setattr(transcript, "COPIED_FEEDBACK_MS", 100)
    view.set_messages(conversation())

    click(view, 4, "Copy")

    assert QGuiApplication.clipboard().text() == ANSWER
    assert len(links(view, 4)["Copied"]) == 1  # the message's link; its code block's still says Copy
    assert len(links(view, 4)["Copy"]) == 1
    qtbot.waitUntil(lambda: "Copied" not in links(view, 4), timeout=2000)
    assert len(links(view, 4)["Copy"]) == 2


def test_copy_on_a_code_block_reads_copied_there(view, qtbot, monkeypatch):
    monkeypatch.setattr(transcript, "COPIED_FEEDBACK_MS", 100)
    view.set_messages(conversation())

    click(view, 4, "Copy", nth=1)

    assert QGuiApplication.clipboard().text() == 'def greet(name):\n    return f"hello {name}"'
    assert len(links(view, 4)["Copied"]) == 1
    assert "copy-code" in links(view, 4)["Copied"][0].path()
    qtbot.waitUntil(lambda: "Copied" not in links(view, 4), timeout=2000)


def test_copy_on_a_code_block_copies_only_that_code(view):
    content = "One:\n\n```\nfirst()\n```\n\nTwo:\n\n~~~js\nsecond();\nthird();\n~~~\n"
    view.set_messages([message(1, "assistant", content)])

    click(view, 1, "Copy", nth=2)  # the message's own Copy comes first

    assert QGuiApplication.clipboard().text() == "second();\nthird();"


def test_switcher_emits_branch_requested_with_direction(view, qtbot):
    view.set_messages(conversation())

    with qtbot.waitSignal(view.branch_requested) as previous:
        click(view, 4, "‹")
    with qtbot.waitSignal(view.branch_requested) as following:
        click(view, 4, "›")

    assert previous.args == [4, -1]
    assert following.args == [4, 1]
    assert "2/3" in frame_text(view, 3)


def test_switcher_has_no_link_past_either_end(view):
    view.set_messages([message(1, "user", "a", sibling_index=0, sibling_count=2)])
    assert "›" in links(view, 1) and "‹" not in links(view, 1)

    view.set_messages([message(1, "user", "a", sibling_index=1, sibling_count=2)])
    assert "‹" in links(view, 1) and "›" not in links(view, 1)


def test_no_switcher_for_a_message_without_siblings(view):
    view.set_messages(conversation()[:1])
    assert "‹" not in view.plain_text()


def test_edit_emits_edit_requested_for_user_messages_only(view, qtbot):
    view.set_messages(conversation())

    with qtbot.waitSignal(view.edit_requested) as edit:
        click(view, 3, "Edit")

    assert edit.args == [3]
    assert "Edit" not in links(view, 2)


def test_regenerate_is_offered_on_the_last_assistant_message_only(view, qtbot):
    view.set_messages(conversation())
    assert "Regenerate" not in links(view, 2)

    with qtbot.waitSignal(view.regenerate_requested) as regenerate:
        click(view, 4, "Regenerate")

    assert regenerate.args == [4]


def test_regenerate_moves_to_a_new_reply_once_it_finishes(view):
    view.set_messages(conversation()[:2])
    view.set_messages(conversation()[:3])
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    assert "Regenerate" not in links(view, 2)
    assert "Regenerate" not in links(view, 5)

    view.end_stream(message(5, "assistant", "Done"))
    assert "Regenerate" in links(view, 5)


def test_end_stream_leaves_other_blocks_untouched(view):
    view.set_messages(conversation())
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    view.append_delta(5, ANSWER)
    before = [frame_html(view, i) for i in range(len(frames(view)) - 1)]
    changes: list[tuple[int, int]] = []
    document = browser(view).document()
    document.contentsChange.connect(lambda pos, removed, added: changes.append((pos, added)))

    view.end_stream(message(5, "assistant", ANSWER))

    target = frames(view)[-1]
    assert changes
    assert all(target.firstPosition() <= pos and pos + added <= target.lastPosition() + 1
               for pos, added in changes)
    assert [frame_html(view, i) for i in range(len(frames(view)) - 1)] == before


def test_update_message_shows_stats_that_arrive_later(view):
    view.set_messages(conversation())
    view.update_message(message(2, "assistant", "A programming language.", stats_text="99 tok/s"))

    assert "99 tok/s" in frame_text(view, 1)
    assert "38.2 tok/s" not in view.plain_text()


def test_interrupted_and_failed_messages_say_so(view):
    view.set_messages([
        message(1, "assistant", "Half an ans", status="interrupted"),
        message(2, "assistant", "", status="error", error="Out of KV cache blocks"),
    ])

    assert "interrupted" in frame_text(view, 0)
    assert "Out of KV cache blocks" in frame_text(view, 1)


def test_streaming_keeps_the_view_at_the_bottom(view, qtbot):
    view.set_messages([message(i, "user", f"message {i}\n" * 5) for i in range(1, 30)])
    view.begin_stream(message(100, "assistant", "", status="streaming"))
    bar = browser(view).verticalScrollBar()
    assert bar.maximum() > 0

    for _ in range(20):
        view.append_delta(100, "more text\n")

    assert bar.value() == bar.maximum()


def test_streaming_leaves_a_scrolled_up_view_where_it_is(view):
    view.set_messages([message(i, "user", f"message {i}\n" * 5) for i in range(1, 30)])
    view.begin_stream(message(100, "assistant", "", status="streaming"))
    bar = browser(view).verticalScrollBar()
    bar.setValue(10)

    for _ in range(20):
        view.append_delta(100, "more text\n")

    assert bar.value() == 10


def long_chat(first_id: int = 1) -> list[MessageView]:
    return [message(i, "user", f"message {i}\n" * 5) for i in range(first_id, first_id + 30)]


def jump_button(view: TranscriptView) -> QToolButton:
    return view.findChild(QToolButton, "jumpToLatest")


def test_a_chat_opened_before_it_is_shown_shows_its_newest_message(qtbot):
    widget = TranscriptView()
    qtbot.addWidget(widget)
    widget.set_messages(long_chat())

    widget.resize(640, 480)
    widget.show()
    qtbot.waitExposed(widget)
    QApplication.processEvents()

    bar = browser(widget).verticalScrollBar()
    assert bar.maximum() > 0
    assert bar.value() == bar.maximum()


def test_opening_another_chat_shows_its_newest_message_though_scrolled_up(view):
    view.set_messages(long_chat())
    bar = browser(view).verticalScrollBar()
    bar.setValue(0)

    view.set_messages(long_chat(first_id=100))

    assert bar.value() == bar.maximum() > 0
    assert not jump_button(view).isVisible()


def test_a_scrolled_up_view_offers_to_jump_to_the_latest_text(view, qtbot):
    view.set_messages(long_chat())
    view.begin_stream(message(100, "assistant", "", status="streaming"))
    bar = browser(view).verticalScrollBar()
    bar.setValue(10)
    assert not jump_button(view).isVisible()

    view.append_delta(100, "more text\n" * 5)

    assert bar.value() == 10
    assert jump_button(view).isVisible()
    assert view.rect().contains(jump_button(view).geometry())
    qtbot.mouseClick(jump_button(view), Qt.MouseButton.LeftButton)
    assert bar.value() == bar.maximum()
    assert not jump_button(view).isVisible()
    view.append_delta(100, "and more\n" * 5)
    assert bar.value() == bar.maximum()  # following the bottom again


def test_scrolling_back_down_by_hand_hides_the_jump_button(view):
    view.set_messages(long_chat())
    view.begin_stream(message(100, "assistant", "", status="streaming"))
    bar = browser(view).verticalScrollBar()
    bar.setValue(10)
    view.append_delta(100, "more text\n" * 5)
    assert jump_button(view).isVisible()

    bar.setValue(bar.maximum())

    assert not jump_button(view).isVisible()
    view.append_delta(100, "and more\n" * 5)
    assert bar.value() == bar.maximum()


def test_sending_shows_the_new_reply_though_scrolled_up(view):
    chat = long_chat()
    view.set_messages(chat)
    bar = browser(view).verticalScrollBar()
    bar.setValue(10)

    view.set_messages([*chat, message(50, "user", "a new question")])
    view.begin_stream(message(51, "assistant", "", status="streaming"))
    view.append_delta(51, "the answer\n" * 5)

    assert bar.value() == bar.maximum()
    assert not jump_button(view).isVisible()


def test_clicking_a_link_with_the_mouse_triggers_it(view, qtbot):
    view.set_messages(conversation()[:1])
    text_view = browser(view)
    document = text_view.document()
    cursor = QTextCursor(document.find("Edit", document.find("Copy").position()))
    cursor.setPosition(cursor.selectionStart() + 1)
    point = text_view.cursorRect(cursor).center()

    with qtbot.waitSignal(view.edit_requested):
        qtbot.mouseClick(text_view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(point))


def test_message_text_is_selectable(view):
    flags = browser(view).textInteractionFlags()
    assert flags & Qt.TextInteractionFlag.TextSelectableByMouse


def test_user_and_assistant_blocks_look_different_and_follow_a_dark_palette(view):
    view.set_messages(conversation())
    light = [frame.frameFormat().background().color() for frame in frames(view)]
    assert light[0] != light[1]

    dark = QPalette()
    for role, color in [(QPalette.ColorRole.Base, "#1e1e1e"), (QPalette.ColorRole.Text, "#e0e0e0"),
                        (QPalette.ColorRole.Highlight, "#3d7bd9")]:
        dark.setColor(role, QColor(color))
    view.setPalette(dark)

    backgrounds = [frame.frameFormat().background().color() for frame in frames(view)]
    assert all(color.lightnessF() < 0.5 for color in backgrounds)
    assert backgrounds[0] != backgrounds[1]
    assert view.message_ids() == [1, 2, 3, 4]
    assert "def greet" in view.plain_text()


def test_a_palette_change_mid_stream_keeps_the_streamed_text(view):
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    view.append_delta(5, "so far")

    view.setPalette(QPalette(QColor("#202020")))
    view.append_delta(5, ", and on")

    assert "so far, and on" in view.plain_text()


def test_single_newlines_stay_line_breaks_once_rendered(view):
    view.set_messages([message(1, "assistant", "Roses are red\nViolets are blue\n\n- a\n  b")])

    assert "Roses are red\nViolets are blue" in view.plain_text()
    document = browser(view).document()
    item = document.findBlock(document.find("a b").position())
    assert item.textList() is not None and item.textList().count() == 1


POEM = "Roses are red\nViolets are blue\n\nSugar is sweet\nAnd so are you"


def test_a_poem_keeps_its_stanza_break_and_its_line_breaks_once_rendered(view):
    view.set_messages([message(1, "assistant", POEM)])

    document = browser(view).document()
    first = document.findBlock(document.find("Roses").position())
    second = first.next()
    assert first.text() == "Roses are red\u2028Violets are blue"  # one paragraph, a line break
    assert second.text() == "Sugar is sweet\u2028And so are you"
    gap = first.blockFormat().bottomMargin() + second.blockFormat().topMargin()
    assert gap > 0
    assert "Roses are red\nViolets are blue\nSugar is sweet\nAnd so are you" in view.plain_text()


def test_line_breaks_leave_headings_lists_tables_and_code_as_they_were(view):
    content = "Intro\n# Title\nText\n- a\n- b\n\na | b\n--|--\n1 | 2\n\n```py\nx = 1\n\ny = 2\n```\nAfter"
    view.set_messages([message(1, "assistant", content)])

    document = browser(view).document()
    title = document.findBlock(document.find("Title").position())
    assert title.text() == "Title" and title.blockFormat().headingLevel() == 1
    item = document.findBlock(document.find("b").position())
    assert item.textList() is not None and item.textList().count() == 2
    assert any(isinstance(child, QTextTable) for child in frames(view)[0].childFrames())
    assert "x = 1\n\ny = 2" in view.plain_text()
    assert view.message_text(1) == content


def test_fenced_code_is_cut_out_of_the_prose():
    text = "Intro\n\n```python\nx = 1\n\ny = 2\n```\nOutro\n~~~\nraw ``` inside\n~~~"

    assert split_fenced_code(text) == [
        Segment("Intro\n"),
        Segment("x = 1\n\ny = 2", "python"),
        Segment("Outro"),
        Segment("raw ``` inside", ""),
    ]


def test_an_unclosed_fence_runs_to_the_end():
    assert split_fenced_code("Look:\n```js\nlet a;\n") == [
        Segment("Look:"),
        Segment("let a;\n", "js"),
    ]


def test_an_indented_fence_strips_its_indent_and_needs_a_long_enough_close():
    text = "  ````\n  code\n   ```\n  ````\nafter"

    assert split_fenced_code(text) == [Segment("code\n ```", ""), Segment("after")]


def test_inline_triple_backticks_are_not_a_fence():
    assert split_fenced_code("use ```a``` inline") == [Segment("use ```a``` inline")]


def test_a_reply_says_whether_it_was_stopped_interrupted_or_cut_at_max_tokens(view):
    view.set_messages([
        message(1, "assistant", "One, two", status="interrupted", finish_reason="stopped",
                stats_text="8.0 tok/s"),
        message(2, "assistant", "Half", status="interrupted"),
        message(3, "assistant", "Everything is", finish_reason="length", completion_tokens=512),
        message(4, "assistant", "Done.", finish_reason="stop"),
    ])
    assert "■ stopped" in frame_text(view, 0) and "8.0 tok/s" in frame_text(view, 0)
    assert "⚠ interrupted" in frame_text(view, 1) and "stopped" not in frame_text(view, 1)
    assert "cut at 512 tokens" in frame_text(view, 2)
    assert not any(mark in frame_text(view, 3) for mark in ("stopped", "interrupted", "cut at"))


def test_a_reply_cut_at_max_tokens_offers_continue(view, qtbot):
    view.set_messages([message(1, "user", "Write a poem"),
                       message(2, "assistant", "Roses are red,", finish_reason="length",
                               completion_tokens=4),
                       message(3, "assistant", "Done.", finish_reason="stop")])
    assert "Continue" in links(view, 2) and "Continue" not in links(view, 3)
    with qtbot.waitSignal(view.continue_requested) as asked:
        click(view, 2, "Continue")
    assert asked.args == [2]


def test_a_stopped_or_interrupted_reply_offers_continue_once_it_wrote_something(view, qtbot):
    view.set_messages([message(1, "user", "Write a poem"),
                       message(2, "assistant", "Roses are", status="interrupted",
                               finish_reason="stopped"),
                       message(3, "assistant", "Violets", status="interrupted"),
                       message(4, "assistant", "", status="interrupted", finish_reason="stopped")])
    assert "Continue" in links(view, 2) and "Continue" in links(view, 3)
    assert "Continue" not in links(view, 4)  # nothing to go on from: Regenerate
    with qtbot.waitSignal(view.continue_requested) as asked:
        click(view, 2, "Continue")
    assert asked.args == [2]


@pytest.mark.parametrize("written, max_tokens, note", [
    (16, 16, "✂ cut at 16 tokens (the chat's max tokens)"),
    (32, 16, "✂ cut at the chat's max tokens (16 a reply) · 32 tokens in all"),
    (12, 16, "✂ cut at 12 tokens (the context was full before the chat's 16)"),
])
def test_a_cut_reply_says_its_length_and_the_chats_max_tokens_where_they_differ(
        view, written, max_tokens, note):
    view.set_messages([message(1, "assistant", "Roses are red,", finish_reason="length",
                               completion_tokens=written, max_tokens=max_tokens)])
    assert note in frame_text(view, 0)


def test_a_streaming_reply_says_how_much_of_the_prompt_is_read_until_it_writes(view):
    view.begin_stream(message(5, "assistant", "", status="streaming"))
    assert view.activity_text(5) == "writing…"

    view.show_activity(5, "reading your message: 1,200 / 3,300 tokens")
    assert "reading your message: 1,200 / 3,300 tokens" in frame_text(view, -1)
    assert "writing…" not in frame_text(view, -1)

    view.show_activity(5, None)
    view.append_delta(5, "Hello")
    assert view.activity_text(5) == "writing…"
    assert "writing…" in frame_text(view, -1) and "reading" not in frame_text(view, -1)
    assert view.message_text(5) == "Hello"


def test_reading_is_not_shown_on_a_finished_message(view):
    view.set_messages(conversation())

    view.show_activity(2, "reading your message: 1 / 2 tokens")

    assert "reading" not in view.plain_text()
    assert view.activity_text(2) is None


def empty_hint(view) -> QLabel:
    return view.findChild(QLabel, "emptyChatHint")


def test_an_empty_chat_says_what_to_do_until_its_first_message(view):
    assert empty_hint(view).text() == transcript.EMPTY_CHAT_HINT
    assert empty_hint(view).isVisible()

    view.set_messages([message(1, "user", "Hello")])
    assert not empty_hint(view).isVisible()
    view.set_messages([])
    assert empty_hint(view).isVisible()


def test_the_empty_chats_hint_wraps_to_a_narrow_transcript_instead_of_being_cut(view, qtbot):
    view.resize(360, 300)
    qtbot.waitUntil(lambda: browser(view).viewport().width() < 360)
    hint, viewport = empty_hint(view), browser(view).viewport()
    assert hint.wordWrap() and hint.geometry().right() < viewport.width()
    assert hint.height() >= hint.heightForWidth(hint.width()) > hint.fontMetrics().height() * 2
    assert viewport.rect().contains(hint.geometry())
