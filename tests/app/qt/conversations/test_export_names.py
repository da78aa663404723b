"""The file name an export suggests: the chat's title, safe on every file system, and the day."""

from __future__ import annotations

from datetime import date

from PySide6.QtWidgets import QFileDialog

from pagoda.app.components.conversations.export_names import (
    MAX_TITLE_CHARS,
    export_file_name,
    with_suffix,
)

DAY = date(2026, 12, 1)


def test_the_name_holds_the_title_and_the_day():
    assert export_file_name("Trip to Kyoto", DAY) == "pagoda-trip-to-kyoto-2026-12-01.md"
    assert export_file_name("Trip to Kyoto", DAY, "json") == "pagoda-trip-to-kyoto-2026-12-01.json"


def test_an_untitled_chat_is_named_chat():
    assert export_file_name(None, DAY) == "pagoda-chat-2026-12-01.md"
    assert export_file_name("  ?? ", DAY) == "pagoda-chat-2026-12-01.md"


def test_characters_a_file_system_refuses_are_left_out_and_the_title_is_bounded():
    name = export_file_name('a/b\\c:d*e?"f"<g>|h\ti\nj', DAY)
    assert name == "pagoda-a-b-c-d-e-f-g-h-i-j-2026-12-01.md"
    long = export_file_name("x" * 500, DAY)
    assert long == f"pagoda-{'x' * MAX_TITLE_CHARS}-2026-12-01.md"
    assert export_file_name("首都是哪里", DAY) == "pagoda-首都是哪里-2026-12-01.md"


def test_picking_the_other_format_swaps_the_suffix():
    assert with_suffix("pagoda-chat-2026-12-01.md", "json") == "pagoda-chat-2026-12-01.json"
    assert with_suffix("notes", "md") == "notes.md"


def test_the_export_dialog_suggests_the_chats_name(window_on, run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    cid = window.chats.current
    run_async(window.chat_list.rename(cid, "Trip to Kyoto"))

    window.sidebar.export_requested.emit(cid)

    dialog = window.findChild(QFileDialog, "exportDialog")
    assert dialog is not None and dialog.isVisible()
    expected = f"pagoda-trip-to-kyoto-{date.today().isoformat()}.md"
    assert [f.rsplit("/", 1)[-1] for f in dialog.selectedFiles()] == [expected]
    dialog.selectNameFilter("JSON (*.json)")
    dialog.filterSelected.emit("JSON (*.json)")
    assert dialog.selectedFiles()[0].endswith(expected.removesuffix(".md") + ".json")
    dialog.reject()
