"""The prefix cache on disk in the app: on by default in the user's cache folder, its size a
setting kept for the next start, what it holds shown, and "Clear the cache" removing it all."""

from __future__ import annotations

import os
from pathlib import Path

from pagoda.app.qt.models.disk_cache_settings import DISK_CACHE_SETTING, USAGE_REFRESH_MS
from pagoda.app.qt.models.model_settings import GIB, format_bytes
from pagoda.app.store import SamplingSettings
from pagoda.engine.config import DEFAULT_DISK_CACHE_BYTES
from pagoda.engine.disk_cache.store import DiskBlockStore

# The prompt's blocks are what is saved: a reply of the default length (up to 1024 tokens) only
# adds time.
SHORT_REPLY = SamplingSettings(temperature=0.0, max_tokens=24, repetition_penalty=1.0)


def kv_folder() -> Path:
    return Path(os.environ["PAGODA_KV_CACHE_DIR"])


def some_blocks_on_disk(n: int = 3) -> int:
    store = DiskBlockStore(kv_folder(), "abc123", 1 << 30)
    store.save([(bytes([i]) * 16, (i,), b"k" * 4000) for i in range(n)])
    return store.stats().size_bytes


def test_the_engine_keeps_its_prefix_cache_on_disk_by_default(window_on, tmp_path):
    window = window_on(tmp_path / "chats.db")

    config = window.host.engine_config()

    assert config.disk_cache_dir == kv_folder()
    assert config.disk_cache_bytes == DEFAULT_DISK_CACHE_BYTES
    assert window.model_settings.disk_cache_bytes() == DEFAULT_DISK_CACHE_BYTES


def test_a_new_size_is_kept_for_the_next_start_and_the_next_load(window_on, tmp_path, run_async,
                                                                 qtbot):
    window = window_on(tmp_path / "chats.db")
    run_async(window.models_controller.restore_model_settings())
    box = window.model_settings.disk_cache_box

    box.setValue(0.5)
    box.editingFinished.emit()

    assert window.host.engine_config().disk_cache_bytes == GIB // 2
    qtbot.waitUntil(lambda: window.db.store.get_setting(DISK_CACHE_SETTING) == GIB // 2)
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock
    again = window_on(tmp_path / "chats.db")
    run_async(again.models_controller.restore_model_settings())
    assert again.model_settings.disk_cache_bytes() == GIB // 2


def test_a_size_of_zero_turns_the_disk_cache_off(window_on, tmp_path):
    window = window_on(tmp_path / "chats.db")
    box = window.model_settings.disk_cache_box

    box.setValue(0)
    box.editingFinished.emit()

    assert window.host.engine_config().disk_cache_dir is None
    assert box.text() == "Off"


def test_the_settings_say_what_is_on_disk_and_clearing_removes_it(window_on, tmp_path,
                                                                   run_async):
    size = some_blocks_on_disk()
    window = window_on(tmp_path / "chats.db")
    run_async(window.models_controller.restore_model_settings())
    panel = window.model_settings
    assert panel.disk_cache_usage.text() == f"{format_bytes(size)} on disk"
    assert panel.clear_disk_cache_button.isEnabled()
    assert str(kv_folder()) in panel.disk_cache_box.toolTip()

    run_async(window.disk_cache.clear())

    assert not list(kv_folder().rglob("*.kv"))
    assert panel.disk_cache_usage.text() == "0 bytes on disk"
    assert not panel.clear_disk_cache_button.isEnabled()


def test_a_stored_size_that_is_not_a_size_is_ignored(window_on, tmp_path, run_async):
    window = window_on(tmp_path / "chats.db")
    window.db.store.set_setting(DISK_CACHE_SETTING, "lots")

    run_async(window.models_controller.restore_model_settings())

    assert window.host.disk_cache_bytes == DEFAULT_DISK_CACHE_BYTES


def test_sizes_read_as_people_write_them():
    assert format_bytes(0) == "0 bytes"
    assert format_bytes(3000) == "2 KiB"
    assert format_bytes(5 * (1 << 20) + 1) == "5.0 MiB"
    assert format_bytes(3 * GIB // 2) == "1.5 GiB"


def test_a_real_engine_saves_a_chats_blocks_and_clear_removes_them(make_disk_window, qtbot,
                                                                   run_async):
    window = make_disk_window()
    conversation = window.db.store.create_conversation(sampling=SHORT_REPLY)
    run_async(window.chat_tabs.open_conversation(conversation.id))
    controller = window.chat_tabs.current_controller()
    run_async(controller.session.send("Tell me about lighthouses. " * 12))
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=60_000)
    qtbot.waitUntil(lambda: any(kv_folder().rglob("*.kv")), timeout=10_000)

    run_async(window.disk_cache.refresh_usage())
    assert window.model_settings.disk_cache_usage.text() != "0 bytes on disk"
    run_async(window.disk_cache.clear())
    assert not list(kv_folder().rglob("*.kv"))


def test_opening_the_settings_shows_what_is_on_disk_now(window_on, tmp_path, qtbot):
    window = window_on(tmp_path / "chats.db")
    window.settings_dock.setVisible(False)
    size = some_blocks_on_disk()

    window.settings_dock.setVisible(True)

    qtbot.waitUntil(lambda: window.model_settings.disk_cache_usage.text()
                    == f"{format_bytes(size)} on disk", timeout=5_000)


def test_the_size_on_disk_follows_what_is_written_while_the_settings_are_shown(
        window_on, tmp_path, run_async, qtbot):
    window = window_on(tmp_path / "chats.db")
    run_async(window.models_controller.restore_model_settings())
    panel = window.model_settings
    assert panel.disk_cache_usage.text() == "0 bytes on disk"

    size = some_blocks_on_disk()  # as the engine writes them after a reply

    qtbot.waitUntil(lambda: panel.disk_cache_usage.text() == f"{format_bytes(size)} on disk",
                    timeout=3 * USAGE_REFRESH_MS)
    assert panel.clear_disk_cache_button.isEnabled()
