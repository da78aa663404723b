"""The settings panel: what the user edits becomes one SamplingView signal; what code sets stays quiet."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QPushButton

from pagoda.app.backends import SAMPLING_FIELDS
from pagoda.app.components.view_models import SamplingView, ToolServerView
from pagoda.app.qt.widgets.settings_panel import (
    ALREADY_DEFAULTS,
    BUILT_IN_DONE,
    RESET_DONE,
    RESET_TO_BUILT_IN,
    TEXT_DEBOUNCE_MS,
    UNDONE,
    SettingsPanel,
)

CUSTOM = SamplingView(
    system_prompt="Answer in French.\nBe brief.",
    temperature=1.3,
    top_p=0.5,
    top_k=40,
    min_p=0.05,
    repetition_penalty=1.25,
    max_tokens=300,
    seed=1234,
)


def make_panel(qtbot) -> SettingsPanel:
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    return panel


def panel_between(qtbot, defaults: SamplingView,
                  settings: SamplingView = CUSTOM) -> tuple[SettingsPanel, list[SamplingView]]:
    """A panel showing `settings`, with `defaults` for new chats, and the list of what it
    emits from then on."""
    panel = make_panel(qtbot)
    panel.set_defaults(defaults)
    panel.set_settings(settings)
    received: list[SamplingView] = []
    panel.settings_changed.connect(received.append)
    return panel, received


def test_settings_round_trip(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(CUSTOM)
    assert panel.settings() == CUSTOM
    assert panel.objectName() == "settingsPanel"


def test_new_panel_shows_defaults(qtbot):
    assert make_panel(qtbot).settings() == SamplingView()


def test_empty_seed_round_trips_as_random(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(SamplingView(seed=None))
    assert panel.seed_edit.text() == ""
    assert panel.settings().seed is None


def test_programmatic_set_settings_does_not_emit(qtbot):
    panel = make_panel(qtbot)
    received: list[SamplingView] = []
    panel.settings_changed.connect(received.append)
    panel.set_settings(CUSTOM)
    panel.set_settings(SamplingView())
    qtbot.wait(TEXT_DEBOUNCE_MS + 100)
    assert received == []


def test_typing_a_system_prompt_emits_once_after_debounce(qtbot):
    panel = make_panel(qtbot)
    received: list[SamplingView] = []
    panel.settings_changed.connect(received.append)
    qtbot.keyClicks(panel.system_prompt_edit, "Be terse.")
    assert received == []  # still typing
    qtbot.waitUntil(lambda: len(received) == 1, timeout=2000)
    qtbot.wait(TEXT_DEBOUNCE_MS + 100)
    assert len(received) == 1
    assert received[0].system_prompt == "Be terse."


def test_spin_box_edit_emits_immediately(qtbot):
    panel = make_panel(qtbot)
    with qtbot.waitSignal(panel.settings_changed, timeout=100) as blocker:
        qtbot.keyClick(panel.sampling_spins["temperature"], Qt.Key.Key_Up)
    assert blocker.args[0].temperature == 0.75


def test_typing_a_number_emits_when_the_edit_is_finished(qtbot):
    panel = make_panel(qtbot)
    received: list[SamplingView] = []
    panel.settings_changed.connect(received.append)
    panel.max_tokens_spin.lineEdit().selectAll()
    qtbot.keyClicks(panel.max_tokens_spin, "2048")
    assert received == []
    qtbot.keyClick(panel.max_tokens_spin, Qt.Key.Key_Return)
    assert [s.max_tokens for s in received] == [2048]


def test_spin_edit_flushes_a_pending_prompt_edit_into_one_signal(qtbot):
    panel = make_panel(qtbot)
    received: list[SamplingView] = []
    panel.settings_changed.connect(received.append)
    qtbot.keyClicks(panel.system_prompt_edit, "Hi")
    qtbot.keyClick(panel.sampling_spins["top_k"], Qt.Key.Key_Up)
    qtbot.wait(TEXT_DEBOUNCE_MS + 100)
    assert len(received) == 1
    assert (received[0].system_prompt, received[0].top_k) == ("Hi", 1)


def test_typing_a_seed_emits_debounced(qtbot):
    panel = make_panel(qtbot)
    with qtbot.waitSignal(panel.settings_changed, timeout=2000) as blocker:
        qtbot.keyClicks(panel.seed_edit, "42x")
    assert blocker.args[0].seed == 42
    assert panel.seed_edit.text() == "42"


def test_out_of_range_values_are_clamped(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(
        SamplingView(
            temperature=5.0,
            top_p=0.0,
            top_k=-3,
            min_p=2.0,
            repetition_penalty=0.5,
            max_tokens=10**9,
            seed=2**40,
        )
    )
    got = panel.settings()
    assert got.temperature == 2.0
    assert got.top_p == 0.01
    assert got.top_k == 0
    assert got.min_p == 1.0
    assert got.repetition_penalty == 1.0
    assert got.max_tokens == 32768
    assert got.seed == 2**31 - 1


def test_typed_seed_beyond_int32_is_clamped(qtbot):
    panel = make_panel(qtbot)
    qtbot.keyClicks(panel.seed_edit, "9999999999")
    assert panel.settings().seed == 2**31 - 1


def test_max_tokens_limit_caps_the_value_without_emitting(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(SamplingView(max_tokens=4096))
    received: list[SamplingView] = []
    panel.settings_changed.connect(received.append)
    panel.set_max_tokens_limit(2048)
    assert panel.settings().max_tokens == 2048
    assert panel.max_tokens_spin.maximum() == 2048
    assert received == []
    panel.set_max_tokens_limit(10**6)
    assert panel.max_tokens_spin.maximum() == 32768


def test_reset_gives_the_chat_the_defaults_system_prompt_included_and_says_so(qtbot):
    defaults = SamplingView(system_prompt="Be kind.", temperature=0.2)
    panel, received = panel_between(qtbot, defaults)

    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)

    assert panel.settings() == defaults
    qtbot.wait(TEXT_DEBOUNCE_MS + 100)
    assert received == [defaults]
    assert panel.note() == RESET_DONE and panel.note_label.isVisibleTo(panel)


def test_reset_without_defaults_of_ones_own_says_they_are_the_built_in_ones(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(CUSTOM)

    panel.reset_to_defaults()

    assert panel.settings() == SamplingView()
    assert panel.note() == RESET_TO_BUILT_IN


def test_reset_when_nothing_differs_says_so_and_emits_nothing(qtbot):
    panel = make_panel(qtbot)
    received: list[SamplingView] = []
    panel.settings_changed.connect(received.append)

    panel.reset_to_defaults()

    assert received == [] and panel.note() == ALREADY_DEFAULTS


def test_restoring_built_in_values_resets_the_chat_and_the_defaults(qtbot):
    panel, received = panel_between(qtbot, CUSTOM)

    panel.reset_to_defaults()  # nothing to reset: the built-in values are offered
    assert panel.note() == ALREADY_DEFAULTS and panel.restore_built_in_button.isVisibleTo(panel)
    with qtbot.waitSignal(panel.built_in_defaults_requested):
        panel.restore_built_in_button.click()

    assert panel.settings() == SamplingView() and received == [SamplingView()]
    assert panel.note() == BUILT_IN_DONE
    panel.set_settings(CUSTOM)  # another chat shown: the note was about the last one
    assert panel.note() == ""
    panel.reset_to_defaults()
    assert panel.settings() == SamplingView()


def test_reset_is_a_plain_button_and_one_click_can_be_undone(qtbot):
    panel, received = panel_between(qtbot, SamplingView(system_prompt="Be kind."))

    assert isinstance(panel.reset_button, QPushButton) and panel.reset_button.menu() is None
    assert "▾" not in panel.reset_button.text()
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert panel.settings().system_prompt == "Be kind."
    assert panel.undo_reset_button.isVisibleTo(panel)
    qtbot.mouseClick(panel.undo_reset_button, Qt.MouseButton.LeftButton)

    assert panel.settings() == CUSTOM and received[-1] == CUSTOM
    assert panel.note() == UNDONE and not panel.undo_reset_button.isVisibleTo(panel)


def test_undo_after_the_built_in_values_gives_back_the_chat_and_the_defaults(qtbot):
    defaults = SamplingView(system_prompt="Be kind.", temperature=0.2)
    panel, _received = panel_between(qtbot, defaults)
    restored: list[SamplingView] = []
    panel.defaults_requested.connect(restored.append)

    panel.reset_to_defaults()
    panel.restore_built_in_button.click()
    assert panel.settings() == SamplingView()
    panel.undo_reset_button.click()

    assert panel.settings() == CUSTOM  # as before the first reset
    assert restored == [defaults]
    panel.reset_to_defaults()
    assert panel.settings() == defaults


def test_an_edit_or_another_chat_ends_the_undo(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(CUSTOM)
    panel.reset_to_defaults()
    panel.sampling_spins["temperature"].setValue(0.9)  # as the user's edit
    assert not panel.undo_reset_button.isVisibleTo(panel) and panel.note() == ""
    panel.set_settings(CUSTOM)
    panel.reset_to_defaults()
    panel.set_settings(CUSTOM)  # another chat shown
    assert not panel.undo_reset_button.isVisibleTo(panel)


def test_every_knob_has_a_label_with_a_one_line_tooltip(qtbot):
    panel = make_panel(qtbot)
    labels = [label for label in panel.findChildren(QLabel)
              if label not in (panel.target_label, panel.note_label, panel.no_tools_label)]
    # The system prompt, a row per sampling field of the table, max tokens, seed, thinking, tools.
    assert len(labels) == 5 + len(SAMPLING_FIELDS)
    for label in labels:
        assert label.toolTip()
        assert "\n" not in label.toolTip()


def test_view_defaults_and_round_trip_follow_the_stores_sampling_settings():
    from pagoda.app.store import SamplingSettings

    assert SamplingView().sampling() == SamplingSettings()
    stored = SamplingSettings(temperature=0.2, top_k=40, max_tokens=77, seed=3)
    view = SamplingView.of("Be brief.", stored)
    assert view.system_prompt == "Be brief." and view.sampling() == stored


def test_a_long_title_is_cut_in_the_heading_and_whole_in_its_tooltip(qtbot):
    panel = make_panel(qtbot)
    title = "pagoda " * 20

    panel.set_target(title)

    assert len(panel.target_label.text()) < len(title)
    assert "…" in panel.target_label.text() and panel.target_label.toolTip() == title
    panel.set_target("Short")
    assert panel.target_label.text() == "Settings of “Short” (this chat only)"
    assert panel.target_label.toolTip() == ""


SERVERS = [ToolServerView("files", (("read", "Reads a file"), ("write", "Writes a file"))),
           ToolServerView("math", (("add", "Adds"),), "running")]


def tool_item(panel: SettingsPanel, *names: str):
    item = next(panel.tools_tree.topLevelItem(i) for i in range(panel.tools_tree.topLevelItemCount())
                if panel.tools_tree.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole) == names[0])
    if len(names) == 1:
        return item
    return next(item.child(j) for j in range(item.childCount())
                if item.child(j).text(0) == names[1])


def test_the_thinking_choice_round_trips_and_is_greyed_where_the_model_has_no_switch(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(SamplingView(enable_thinking=False))
    assert panel.settings().enable_thinking is False
    with qtbot.waitSignal(panel.settings_changed) as emitted:
        panel.thinking_combo.setCurrentIndex(1)
    assert emitted.args[0].enable_thinking is True
    panel.set_thinking_switch(False)
    assert not panel.thinking_combo.isEnabled()
    assert "no thinking switch" in panel.thinking_combo.toolTip()


def test_checking_a_server_or_single_tools_chooses_them_for_the_chat(qtbot):
    panel = make_panel(qtbot)
    panel.set_tool_servers(SERVERS)
    assert panel.no_tools_label.isHidden()
    with qtbot.waitSignal(panel.settings_changed) as emitted:
        tool_item(panel, "files", "read").setCheckState(0, Qt.CheckState.Checked)
    assert emitted.args[0].tools == ("files/read",)
    with qtbot.waitSignal(panel.settings_changed) as emitted:
        tool_item(panel, "math").setCheckState(0, Qt.CheckState.Checked)
    assert emitted.args[0].tools == ("files/read", "math")
    assert tool_item(panel, "math", "add").checkState(0) == Qt.CheckState.Checked


def test_a_chats_tools_survive_edits_of_other_knobs_and_servers_not_listed(qtbot):
    panel = make_panel(qtbot)
    panel.set_settings(SamplingView(tools=("files", "gone/tool")))
    panel.set_tool_servers(SERVERS)
    assert tool_item(panel, "files", "write").checkState(0) == Qt.CheckState.Checked
    with qtbot.waitSignal(panel.settings_changed) as emitted:
        panel.sampling_spins["temperature"].setValue(0.3)
    assert set(emitted.args[0].tools) == {"files", "gone/tool"}


def test_without_servers_the_panel_says_where_to_add_them(qtbot):
    panel = make_panel(qtbot)
    panel.set_tool_servers([])
    assert panel.tools_tree.isHidden() and not panel.no_tools_label.isHidden()


def test_a_tool_checked_stays_checked_when_the_servers_are_shown_again(qtbot):
    panel = make_panel(qtbot)
    panel.set_tool_servers(SERVERS)
    with qtbot.waitSignal(panel.settings_changed):
        tool_item(panel, "math").setCheckState(0, Qt.CheckState.Checked)
    panel.set_tool_servers([replace(SERVERS[0]), replace(SERVERS[1], state="starting")])
    assert tool_item(panel, "math").checkState(0) == Qt.CheckState.Checked
    assert panel.settings().tools == ("math",)
