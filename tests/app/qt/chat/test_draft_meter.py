"""The composer's text counts in the tab's context meter a moment after typing stops."""

from fake_engine import WAIT_MS

from pagoda.app.qt.chat.controller import DRAFT_COUNT_DELAY_MS


def test_typing_updates_the_context_meter_after_a_pause(tab, qtbot):
    meter = tab.view.context_meter
    tab.view.composer.set_text("one two three four five")
    qtbot.waitUntil(lambda: meter.label.text().startswith("5 / "), timeout=WAIT_MS)
    tab.view.composer.set_text("")
    qtbot.waitUntil(lambda: meter.label.text().startswith("0 / "), timeout=WAIT_MS)


def test_each_keystroke_does_not_count_the_chat_again(tab, qtbot):
    gate = tab.models.built[None].tokenizer.gate
    before = gate.calls
    for text in ("a", "a b", "a b c", "a b c d"):
        tab.view.composer.set_text(text)
    qtbot.wait(DRAFT_COUNT_DELAY_MS * 2)
    qtbot.waitUntil(lambda: tab.view.context_meter.label.text().startswith("4 / "),
                    timeout=WAIT_MS)
    assert gate.calls - before == 1
