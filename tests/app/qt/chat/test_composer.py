"""The composer: how a user sends, stops and edits, driven by real key presses."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QPushButton

from pagoda.app.qt.chat.composer import EDIT_BANNER, KEPT_NOTE, STREAMING_HINT, Composer


@pytest.fixture
def composer(qtbot) -> Composer:
    widget = Composer()
    qtbot.addWidget(widget)
    widget.show()
    return widget


def box(composer: Composer) -> QPlainTextEdit:
    return composer.findChild(QPlainTextEdit, "composer")


def button(composer: Composer, name: str) -> QPushButton:
    return composer.findChild(QPushButton, name)


def banner(composer: Composer) -> QLabel:
    return composer.findChild(QLabel, "editBanner")


def streaming_hint(composer: Composer) -> QLabel:
    return composer.findChild(QLabel, "streamingHint")


def test_enter_sends_the_text_and_clears_the_box(composer, qtbot):
    qtbot.keyClicks(box(composer), "Hello, ")
    box(composer).insertPlainText("世界 👋")  # QTest types ASCII only (it aborts on others)

    with qtbot.waitSignal(composer.send_requested) as sent:
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)

    assert sent.args == ["Hello, 世界 👋"]
    assert composer.text() == ""


def test_keypad_enter_sends_too(composer, qtbot):
    composer.set_text("hi")

    with qtbot.waitSignal(composer.send_requested) as sent:
        qtbot.keyClick(box(composer), Qt.Key.Key_Enter, Qt.KeyboardModifier.KeypadModifier)

    assert sent.args == ["hi"]


def test_shift_enter_inserts_a_newline(composer, qtbot):
    qtbot.keyClicks(box(composer), "first")

    with qtbot.assertNotEmitted(composer.send_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box(composer), "second")

    assert composer.text() == "first\nsecond"


def test_send_button_sends(composer, qtbot):
    composer.set_text("via button")

    with qtbot.waitSignal(composer.send_requested) as sent:
        qtbot.mouseClick(button(composer, "sendButton"), Qt.MouseButton.LeftButton)

    assert sent.args == ["via button"]


def test_whitespace_only_text_is_not_sent(composer, qtbot):
    composer.set_text("  \n\t ")

    with qtbot.assertNotEmitted(composer.send_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)
        qtbot.mouseClick(button(composer, "sendButton"), Qt.MouseButton.LeftButton)

    assert composer.text() == "  \n\t "


LOADING = "A model is loading: send again once it is ready."


def test_send_is_disabled_while_the_engine_loads_but_typing_works(composer, qtbot):
    composer.set_send_blocked(LOADING)
    assert not button(composer, "sendButton").isEnabled()
    assert button(composer, "sendButton").toolTip() == LOADING

    qtbot.keyClicks(box(composer), "early question")
    with qtbot.assertNotEmitted(composer.send_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)
    assert composer.text() == "early question"

    composer.set_send_blocked(None)
    assert button(composer, "sendButton").isEnabled()


def test_streaming_shows_stop_instead_of_send(composer):
    composer.set_streaming(True)
    assert button(composer, "stopButton").isVisible()
    assert not button(composer, "sendButton").isVisible()

    composer.set_streaming(False)
    assert button(composer, "sendButton").isVisible()
    assert not button(composer, "stopButton").isVisible()


def test_esc_while_streaming_emits_stop(composer, qtbot):
    composer.set_streaming(True)

    with qtbot.waitSignal(composer.stop_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Escape)


def test_stop_button_emits_stop(composer, qtbot):
    composer.set_streaming(True)

    with qtbot.waitSignal(composer.stop_requested):
        qtbot.mouseClick(button(composer, "stopButton"), Qt.MouseButton.LeftButton)


def test_esc_when_not_streaming_does_nothing(composer, qtbot):
    composer.set_text("keep me")

    with qtbot.assertNotEmitted(composer.stop_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Escape)

    assert composer.text() == "keep me"


def test_enter_while_streaming_keeps_the_text_for_later(composer, qtbot):
    composer.set_streaming(True)
    qtbot.keyClicks(box(composer), "next question")

    with qtbot.assertNotEmitted(composer.send_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)

    assert composer.text() == "next question"


def test_enter_while_streaming_says_how_to_send_then_sends_once_the_reply_ends(composer, qtbot):
    assert not streaming_hint(composer).isVisible()
    composer.set_streaming(True)
    qtbot.keyClicks(box(composer), "next question")

    with qtbot.assertNotEmitted(composer.send_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)

    assert streaming_hint(composer).isVisible()
    assert streaming_hint(composer).text() == STREAMING_HINT
    assert composer.text() == "next question"

    composer.set_streaming(False)
    assert not streaming_hint(composer).isVisible()
    with qtbot.waitSignal(composer.send_requested) as sent:
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)
    assert sent.args == ["next question"]


def test_enter_while_the_model_loads_says_so_and_keeps_the_text(composer, qtbot):
    composer.set_send_blocked(LOADING)
    qtbot.keyClicks(box(composer), "hello")

    with qtbot.assertNotEmitted(composer.send_requested):
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)

    assert streaming_hint(composer).isVisible()
    assert streaming_hint(composer).text() == f"{LOADING} {KEPT_NOTE}"
    assert composer.text() == "hello"
    composer.set_send_blocked(None)
    assert not streaming_hint(composer).isVisible()


def test_the_hint_follows_a_new_reason_for_not_sending(composer, qtbot):
    composer.set_send_blocked(LOADING)
    qtbot.keyClicks(box(composer), "hello")
    qtbot.keyClick(box(composer), Qt.Key.Key_Return)

    composer.set_send_blocked("No model is loaded: choose one in the model picker.")

    assert streaming_hint(composer).text() == (
        f"No model is loaded: choose one in the model picker. {KEPT_NOTE}")
    assert not button(composer, "sendButton").isEnabled()


def test_edit_mode_submits_an_edit_instead_of_a_new_message(composer, qtbot):
    composer.set_text("my draft")
    composer.begin_edit(7, "original question")
    assert composer.text() == "original question"
    assert banner(composer).isVisible()
    assert banner(composer).text() == EDIT_BANNER

    qtbot.keyClicks(box(composer), ", reworded")
    with (
        qtbot.assertNotEmitted(composer.send_requested),
        qtbot.waitSignal(composer.edit_submitted) as edited,
    ):
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)

    assert edited.args == [7, "original question, reworded"]
    assert not banner(composer).isVisible()
    assert composer.text() == "my draft"


def test_esc_cancels_an_edit_and_restores_the_draft(composer, qtbot):
    composer.set_text("my draft")
    composer.begin_edit(7, "original question")

    with qtbot.assertNotEmitted(composer.edit_submitted):
        qtbot.keyClick(box(composer), Qt.Key.Key_Escape)

    assert composer.text() == "my draft"
    assert not banner(composer).isVisible()
    with qtbot.waitSignal(composer.send_requested) as sent:
        qtbot.keyClick(box(composer), Qt.Key.Key_Return)
    assert sent.args == ["my draft"]


def test_editing_another_message_keeps_the_first_draft(composer, qtbot):
    composer.set_text("my draft")
    composer.begin_edit(3, "first")
    composer.begin_edit(5, "second")

    qtbot.keyClick(box(composer), Qt.Key.Key_Escape)

    assert composer.text() == "my draft"


def test_box_grows_with_its_text_up_to_a_limit(composer):
    small = box(composer).height()
    composer.set_text("\n".join(["line"] * 5))
    grown = box(composer).height()
    composer.set_text("\n".join(["line"] * 50))
    capped = box(composer).height()
    composer.set_text("\n".join(["line"] * 80))

    assert small < grown < capped
    assert box(composer).height() == capped
