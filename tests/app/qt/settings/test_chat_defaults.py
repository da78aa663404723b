"""Defaults for new chats, in the window: the settings panel names the chat it edits, "Use as
default for new chats" keeps its settings in the store, and new chats start with them."""


from pagoda.app.components.settings.chat_defaults import (
    NEW_CHAT_DEFAULTS_SETTING,
    chat_defaults_from,
    load_chat_defaults,
)
from pagoda.app.components.shared.view_models import SamplingView
from pagoda.app.qt.settings.settings_panel import SYSTEM_PROMPT_MIN_LINES


def _edit(panel, **changes):
    from dataclasses import replace

    panel.set_settings(replace(panel.settings(), **changes))
    panel.settings_changed.emit(panel.settings())


def test_the_settings_panel_names_the_chat_it_edits(window_on, run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    run_async(window.chat_list.rename(window.chats.current, "Trip to Kyoto"))
    assert "Trip to Kyoto" in window.settings_panel.target_label.text()
    assert window.windowTitle() == "Trip to Kyoto · Pagoda"


def test_a_new_chat_starts_with_the_settings_made_default(window_on, qtbot, run_async,
                                                          tmp_path):
    window = window_on(tmp_path / "chats.db")
    panel = window.settings_panel
    _edit(panel, system_prompt="Answer in French.", temperature=0.2, max_tokens=77)
    panel.make_default_button.click()
    qtbot.waitUntil(lambda: window.db.store.get_setting(NEW_CHAT_DEFAULTS_SETTING) is not None,
                    timeout=5000)

    run_async(window.chat_tabs.new_chat())

    conversation = window.db.store.get_conversation(window.chats.current)
    assert conversation.system_prompt == "Answer in French."
    assert (conversation.sampling.temperature, conversation.sampling.max_tokens) == (0.2, 77)
    assert panel.settings().max_tokens == 77


def test_defaults_survive_a_restart_and_reset_restores_them(window_on, qtbot, run_async,
                                                            tmp_path):
    db_path = tmp_path / "chats.db"
    window = window_on(db_path)
    _edit(window.settings_panel, top_p=0.5)
    run_async(window.settings_dock.use_as_defaults(window.settings_panel.settings()))
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock

    again = window_on(db_path)
    _edit(again.settings_panel, top_p=0.95)
    _edit(again.settings_panel, system_prompt="Be brief.")
    again.settings_panel.reset_to_defaults()
    assert again.settings_panel.settings().top_p == 0.5
    assert again.settings_panel.settings().system_prompt == ""
    assert again.settings_panel.note() != ""


def test_a_malformed_defaults_setting_gives_the_built_in_defaults(window_on, run_async,
                                                                  tmp_path):
    window = window_on(tmp_path / "chats.db")
    window.db.store.set_setting(NEW_CHAT_DEFAULTS_SETTING, {"temperature": "hot", "top_k": 5})
    defaults = run_async(load_chat_defaults(window.db))
    assert defaults == SamplingView(top_k=5)
    window.db.store.set_setting(NEW_CHAT_DEFAULTS_SETTING, [1, 2])
    assert run_async(load_chat_defaults(window.db)) == SamplingView()


def test_restoring_built_in_values_brings_them_back_for_new_chats_too(window_on, qtbot,
                                                                      run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    panel = window.settings_panel
    _edit(panel, system_prompt="Answer in French.", top_p=0.5)
    run_async(window.settings_dock.use_as_defaults(panel.settings()))

    panel.reset_to_defaults()
    panel.restore_built_in_button.click()

    qtbot.waitUntil(lambda: chat_defaults_from(window.db.store.get_setting(
        NEW_CHAT_DEFAULTS_SETTING)) == SamplingView(), timeout=5000)
    assert "built-in" in panel.note()
    qtbot.waitUntil(lambda: window.db.store.get_conversation(window.chats.current).sampling
                    == SamplingView().sampling(), timeout=5000)
    run_async(window.chat_tabs.new_chat())
    conversation = window.db.store.get_conversation(window.chats.current)
    assert conversation.system_prompt is None and conversation.sampling.top_p == SamplingView().top_p


def test_undo_after_a_reset_gives_the_chat_its_settings_back_in_the_store(window_on, qtbot,
                                                                         run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    panel = window.settings_panel
    _edit(panel, system_prompt="Answer in French.", top_p=0.5)

    def stored():
        return window.db.store.get_conversation(window.chats.current)

    qtbot.waitUntil(lambda: stored().sampling.top_p == 0.5, timeout=5000)

    panel.reset_button.click()
    qtbot.waitUntil(lambda: stored().sampling.top_p == SamplingView().top_p, timeout=5000)
    panel.undo_reset_button.click()

    qtbot.waitUntil(lambda: stored().sampling.top_p == 0.5, timeout=5000)
    assert stored().system_prompt == "Answer in French."


def test_the_system_prompt_box_keeps_its_lines_when_a_long_title_wraps(window_on, run_async,
                                                                       qtbot, tmp_path):
    window = window_on(tmp_path / "chats.db")
    panel = window.settings_panel
    line = panel.system_prompt_edit.fontMetrics().lineSpacing()

    run_async(window.chat_list.rename(window.chats.current, "A long title that wraps in the panel " * 4))
    qtbot.waitUntil(lambda: panel.target_label.height() >= 2 * line)

    assert panel.system_prompt_edit.height() >= SYSTEM_PROMPT_MIN_LINES * line

