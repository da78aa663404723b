"""A reply's thinking and tool calls in the transcript: the reasoning folded above the answer,
each call with Run / Always / Deny while it waits for the user, and the tools' results in
compact frames of their own, folded to a line."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication, QTextCursor, QTextFrame
from PySide6.QtWidgets import QTextBrowser

from pagoda.app.components.shared.view_models import MessageView, ToolCallView
from pagoda.app.qt.chat.transcript import TranscriptView

NOW = datetime(2026, 11, 29, 14, 3)
REASONING = "The user wants 2 + 3.\nAdding them gives 5."
ARGS = '{"a": 2,\n "b": 3}'


def message(message_id: int, role: str, content: str, **fields) -> MessageView:
    return MessageView(message_id, role, content, NOW, **fields)


def add_call(state: str = "asking", call_id: str = "call_1", arguments: str = ARGS) -> ToolCallView:
    return ToolCallView(call_id, "add", arguments, state, "calculator")


def tool_turn(state: str = "done") -> list[MessageView]:
    """user -> reply calling add -> add's result -> the answer."""
    return [
        message(1, "user", "What is 2 + 3?"),
        message(2, "assistant", "", finish_reason="tool_calls", tool_calls=(add_call(state),)),
        message(3, "tool", "5", tool_name="add", finish_reason="done"),
        message(4, "assistant", "It is **5**.", finish_reason="stop"),
    ]


def browser(view: TranscriptView) -> QTextBrowser:
    return view.findChild(QTextBrowser)


def frame(view: TranscriptView, message_id: int) -> QTextFrame:
    return browser(view).document().rootFrame().childFrames()[view.message_ids().index(message_id)]


def frame_text(view: TranscriptView, message_id: int) -> str:
    # Never frame.document(): PySide6 then ties the document's life to the frame's wrapper.
    cursor = QTextCursor(browser(view).document())
    cursor.setPosition(frame(view, message_id).firstPosition())
    cursor.setPosition(frame(view, message_id).lastPosition(), QTextCursor.MoveMode.KeepAnchor)
    return cursor.selection().toPlainText()


def runs(view: TranscriptView, message_id: int):
    """(text, char format) of every run of text inside one message's frame."""
    document = browser(view).document()
    block = document.findBlock(frame(view, message_id).firstPosition())
    while block.isValid() and block.position() < frame(view, message_id).lastPosition():
        iterator = block.begin()
        while not iterator.atEnd():
            fragment = iterator.fragment()
            yield fragment.text(), fragment.charFormat()
            iterator += 1
        block = block.next()


def links(view: TranscriptView, message_id: int) -> dict[str, QUrl]:
    return {text: QUrl(fmt.anchorHref()) for text, fmt in runs(view, message_id) if fmt.isAnchor()}


def click(view: TranscriptView, message_id: int, label_start: str) -> None:
    """Click the link of the message whose label starts with `label_start`."""
    (url,) = [u for text, u in links(view, message_id).items() if text.startswith(label_start)]
    browser(view).anchorClicked.emit(url)


def streaming_reply(view: TranscriptView) -> None:
    view.set_messages([message(1, "user", "What is 2 + 3?")])
    view.begin_stream(message(2, "assistant", "", status="streaming"))


# -- thinking ------------------------------------------------------------------------------------


def test_reasoning_streams_folded_under_thinking(view):
    streaming_reply(view)

    view.append_reasoning(2, "The user wants")

    text = frame_text(view, 2)
    assert "▸ Thinking…" in text
    assert "The user wants" not in text
    assert view.reasoning_text(2) == "The user wants"


def test_folded_reasoning_streams_without_touching_the_document(view):
    streaming_reply(view)
    view.append_reasoning(2, "The user")
    changes: list[int] = []
    browser(view).document().contentsChange.connect(lambda pos, removed, added: changes.append(pos))

    for delta in [" wants", " 2 + 3.", "\nAdding them gives 5."]:
        view.append_reasoning(2, delta)

    assert changes == []
    assert view.reasoning_text(2) == REASONING
    assert "Adding" not in view.plain_text()


def test_the_thinking_line_says_how_long_once_the_reply_ends(view):
    streaming_reply(view)
    view.append_reasoning(2, REASONING)
    view.append_delta(2, "It is 5.")
    assert "▸ Thought" in frame_text(view, 2) and "Thinking…" not in frame_text(view, 2)

    view.end_stream(message(2, "assistant", "It is 5.", reasoning=REASONING, reasoning_s=12.3))

    text = frame_text(view, 2)
    assert "▸ Thought for 12 s" in text
    assert text.index("Thought for 12 s") < text.index("It is 5.")


@pytest.mark.parametrize("seconds, label", [(0.4, "Thought for a moment"), (None, "Thought"),
                                            (125, "Thought for 2 min 5 s")])
def test_the_thinking_line_words_short_unknown_and_long_times(view, seconds, label):
    view.set_messages([message(1, "assistant", "5", reasoning=REASONING, reasoning_s=seconds)])

    assert f"▸ {label}\n" in frame_text(view, 1)


def test_a_click_opens_the_reasoning_and_another_folds_it(view):
    view.set_messages([message(1, "user", "2 + 3?"),
                       message(2, "assistant", "It is 5.", reasoning=REASONING, reasoning_s=12)])

    click(view, 2, "▸ Thought")
    text = frame_text(view, 2)
    assert "▾ Thought for 12 s" in text
    assert text.index("Thought for 12 s") < text.index("Adding them gives 5.") < text.index("It is 5.")

    click(view, 2, "▾ Thought")
    assert "Adding them" not in frame_text(view, 2)
    assert "▸ Thought for 12 s" in frame_text(view, 2)


def test_an_opened_reasoning_stays_open_when_its_message_is_drawn_again(view):
    view.set_messages([message(2, "assistant", "It is 5.", reasoning=REASONING, reasoning_s=12)])
    click(view, 2, "▸ Thought")

    view.update_message(message(2, "assistant", "It is 5.", reasoning=REASONING, reasoning_s=12,
                                stats_text="40 tok/s"))
    view.set_messages([message(2, "assistant", "It is 5.", reasoning=REASONING, reasoning_s=12),
                       message(3, "user", "thanks")])

    assert "Adding them gives 5." in frame_text(view, 2)


def test_opened_reasoning_streams_in_above_the_answer(view):
    streaming_reply(view)
    view.append_reasoning(2, "The user")
    click(view, 2, "▸ Thinking")

    view.append_reasoning(2, " wants 2 + 3.")
    view.append_reasoning(2, "\nAdding them gives 5.")
    view.append_delta(2, "It is")
    view.append_delta(2, " 5.")

    text = frame_text(view, 2)
    assert text.index("▾ Thought") < text.index(REASONING) < text.index("It is 5.")
    assert view.message_text(2) == "It is 5."


def test_opening_reasoning_leaves_the_view_where_the_user_clicked(view):
    chat = [message(i, "user", f"message {i}\n" * 5) for i in range(1, 30)]
    long_reasoning = "\n".join(f"step {i}" for i in range(40))
    view.set_messages([*chat, message(30, "assistant", "It is 5.", reasoning=long_reasoning)])
    bar = browser(view).verticalScrollBar()
    bottom = bar.value()
    assert bottom == bar.maximum() > 0

    click(view, 30, "▸ Thought")

    assert bar.value() == bottom < bar.maximum()
    assert "step 39" in frame_text(view, 30)


def test_the_answer_alone_is_copied_and_counted_as_the_message(view, qtbot):
    view.set_messages([message(2, "assistant", "It is 5.", reasoning=REASONING, reasoning_s=12)])
    assert "Adding them" not in view.plain_text()
    click(view, 2, "▸ Thought")

    with qtbot.waitSignal(view.copied) as copied:
        click(view, 2, "Copy")

    assert copied.args == ["It is 5."]
    assert QGuiApplication.clipboard().text() == "It is 5."
    assert view.message_text(2) == "It is 5."


# -- tool calls in a reply -----------------------------------------------------------------------


def test_a_call_waiting_for_the_user_shows_its_function_arguments_and_choices(view):
    view.set_messages(tool_turn("asking")[:2])

    text = frame_text(view, 2)
    assert "⚙ add" in text and "calculator" in text
    assert '{"a": 2, "b": 3}' in text  # compact, on one line
    assert {"Run", "Always for this tool", "Deny"} <= set(links(view, 2))
    assert "Copy" not in links(view, 2)  # a reply that only called tools has no answer to copy


@pytest.mark.parametrize("label, decision", [("Run", "run"), ("Always for this tool", "always"),
                                             ("Deny", "deny")])
def test_each_choice_answers_the_call(view, qtbot, label, decision):
    view.set_messages(tool_turn("asking")[:2])

    with qtbot.waitSignal(view.tool_call_answered) as answered:
        click(view, 2, label)

    assert answered.args == [2, 0, decision]


def test_a_call_no_longer_asking_offers_no_choices(view, qtbot):
    view.set_messages(tool_turn("asking")[:2])
    stale = links(view, 2)["Run"]
    view.update_message(tool_turn("running")[1])

    with qtbot.assertNotEmitted(view.tool_call_answered):
        browser(view).anchorClicked.emit(stale)
    assert "Run" not in links(view, 2)


@pytest.mark.parametrize("state, word", [("running", "running…"), ("done", "✓ done"),
                                         ("denied", "denied"), ("failed", "✗ failed"),
                                         ("not run", "not run")])
def test_a_call_says_where_it_stands(view, state, word):
    view.set_messages(tool_turn(state)[:2])

    assert word in frame_text(view, 2)
    assert "Run" not in links(view, 2)


def test_long_arguments_are_cut_with_the_whole_in_a_tooltip(view):
    long = '{"text": "' + "x" * 400 + '<b>"}'
    view.set_messages([message(2, "assistant", "", tool_calls=(add_call(arguments=long),))])

    (shown, fmt), = [(t, f) for t, f in runs(view, 2) if t.strip().startswith('{"text"')]
    assert len(shown.strip()) == 200 and shown.endswith("…")
    assert "x" * 400 in fmt.toolTip() and "&lt;b&gt;" in fmt.toolTip()


def test_calls_come_below_the_answer(view):
    reply = message(2, "assistant", "Let me add them.", tool_calls=(add_call("done"),),
                    stats_text="30 tok/s")
    view.set_messages([reply])

    text = frame_text(view, 2)
    assert text.index("Let me add them.") < text.index("⚙ add") < text.index("30 tok/s")


def test_new_call_states_redraw_a_finished_reply_keeping_its_answer_and_the_scroll(view):
    chat = [message(i, "user", f"message {i}\n" * 5) for i in range(1, 30)]
    reply = message(30, "assistant", "Let me **add** them.", tool_calls=(add_call("asking"),))
    view.set_messages([*chat, reply])
    bar = browser(view).verticalScrollBar()
    bar.setValue(bar.maximum() // 2)

    view.update_message(replace(reply, tool_calls=(add_call("running"),)))

    assert bar.value() == bar.maximum() // 2
    assert "Let me add them." in frame_text(view, 30)
    assert "running…" in frame_text(view, 30) and "Run" not in links(view, 30)


def test_new_call_states_redraw_a_streaming_reply_keeping_what_streamed(view):
    streaming_reply(view)
    view.append_reasoning(2, REASONING)
    view.append_delta(2, "Let me add")
    stale = message(2, "assistant", "Let", status="streaming", tool_calls=(add_call("asking"),))

    view.update_message(stale)
    view.append_delta(2, " them.")

    text = frame_text(view, 2)
    assert view.message_text(2) == "Let me add them."
    assert view.reasoning_text(2) == REASONING
    assert text.index("Let me add them.") < text.index("⚙ add")


# -- tool messages -------------------------------------------------------------------------------


def test_a_result_sits_between_the_call_and_the_answer_folded_to_a_line(view):
    view.set_messages(tool_turn())

    assert view.message_ids() == [1, 2, 3, 4]
    text = frame_text(view, 3)
    assert "Result of add" in text and "▸ 5" in text
    assert "You" not in text and "Assistant" not in text
    assert set(links(view, 3)) == {"Copy", "▸ 5"}  # no Edit, Regenerate nor branch switcher


def test_a_long_result_shows_its_first_line_until_opened_as_code(view):
    result = '{"rows": [' + ", ".join(str(i) for i in range(100)) + "]}\nsecond line"
    view.set_messages([message(3, "tool", result, tool_name="query", finish_reason="done")])
    folded = frame_text(view, 3)
    assert "second line" not in folded
    assert '▸ {"rows": [0, 1, 2' in folded and "99" not in folded

    click(view, 3, "▸")

    assert "second line" in frame_text(view, 3)
    code = [t for t, fmt in runs(view, 3) if fmt.fontFixedPitch()]
    assert "".join(code).startswith('{"rows"')
    click(view, 3, "▾")
    assert "second line" not in frame_text(view, 3)


def test_copy_on_a_result_copies_all_of_it(view):
    view.set_messages([message(3, "tool", "line one\nline two", tool_name="add")])

    click(view, 3, "Copy")

    assert QGuiApplication.clipboard().text() == "line one\nline two"


def test_a_denied_or_failed_call_says_so_the_failure_as_an_error(view):
    view.set_messages([
        message(3, "tool", "The user denied this call: it did not run.", tool_name="add",
                finish_reason="denied"),
        message(4, "tool", "calculator: the server exited (code 1)", tool_name="add",
                finish_reason="failed"),
    ])

    assert "add was denied" in frame_text(view, 3)
    (title,) = [fmt for text, fmt in runs(view, 4) if text == "add failed"]
    (denied,) = [fmt for text, fmt in runs(view, 3) if text == "add was denied"]
    assert title.foreground().color() != denied.foreground().color()
    assert title.foreground().color().red() > 150


def test_regenerate_stays_on_the_last_reply_past_results(view):
    view.set_messages(tool_turn())
    assert "Regenerate" in links(view, 4) and "Regenerate" not in links(view, 2)

    view.set_messages(tool_turn()[:3])  # a turn stopped after its call ran
    assert "Regenerate" in links(view, 2)
    assert "Regenerate" not in links(view, 3)


# -- the tab -------------------------------------------------------------------------------------


def test_run_in_a_tab_answers_the_session(tab, monkeypatch):
    answers: list[tuple[int, int, str]] = []
    monkeypatch.setattr(tab.session, "answer_tool_call", lambda *answer: answers.append(answer))
    tab.view.show_messages(tool_turn("asking")[:2])
    transcript = tab.view.transcript

    click(transcript, 2, "Run")

    assert answers == [(2, 0, "run")]


def test_a_tab_streams_reasoning_into_its_transcript(tab):
    tab.view.show_messages([message(1, "user", "2 + 3?")])
    tab.view.begin_stream(message(2, "assistant", "", status="streaming"))

    tab.view.append_reasoning(2, "Adding.")

    assert tab.view.transcript.reasoning_text(2) == "Adding."
    assert "Thinking…" in tab.view.transcript.plain_text()
