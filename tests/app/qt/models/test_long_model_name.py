"""A served model's name can be as long as the path of its .gguf file (llama.cpp's server names
its model so): the window shows it cut in the middle, the whole name in a tooltip, and keeps
its own size and the sidebar's width."""

from pagoda.app.qt.models.models_controller import SERVER_ITEM_PREFIX

LONG_NAME = "/home/someone/models/" + "very-long-folder-name/" * 12 + "Qwen2.5-7B-Instruct.gguf"
LONG_NAME = LONG_NAME[-300:]


def _sizes(window, qtbot) -> tuple[int, int]:
    qtbot.wait(50)  # the layouts settle
    return window.width(), window.sidebar.width()


def test_a_300_character_model_name_changes_neither_the_window_nor_the_sidebar(
        window_on, fake_vllm, qtbot, run_async, tmp_path):
    _, url = fake_vllm
    window = window_on(tmp_path / "chats.db")
    before = _sizes(window, qtbot)
    connection = run_async(window.sources.saved.add(url, LONG_NAME, None))
    window.models_controller.refresh_picker()

    window.models_controller.picked(window.model_picker.findData(SERVER_ITEM_PREFIX + connection.id))
    assert _sizes(window, qtbot) == before
    window.models_controller.picked(window.model_picker.findData(""))
    assert _sizes(window, qtbot) == before


def test_a_long_model_name_is_cut_with_the_whole_of_it_in_a_tooltip(
        window_on, fake_vllm, qtbot, run_async, tmp_path):
    _, url = fake_vllm
    window = window_on(tmp_path / "chats.db")
    connection = run_async(window.sources.saved.add(url, LONG_NAME, None))
    window.models_controller.refresh_picker()
    window.models_controller.picked(window.model_picker.findData(SERVER_ITEM_PREFIX + connection.id))

    picker, tab = window.model_picker, window.chat_tabs.current_controller().view
    assert len(picker.currentText()) < 100 and "…" in picker.currentText()
    assert LONG_NAME in picker.toolTip()
    shown = tab.source_label.shown_text()
    assert len(shown) < 100 and "…" in shown and LONG_NAME in tab.source_label.toolTip()
    assert len(window.status.state_label.text()) < 100
    assert LONG_NAME in window.status.state_label.toolTip()
