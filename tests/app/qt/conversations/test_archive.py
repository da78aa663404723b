"""Archiving a chat: it leaves the list and its tab closes, "Show archived chats" lists it
greyed with Unarchive in its menu, and an archived chat that came in an import is never out of
reach."""

from __future__ import annotations

from pagoda.app.store import SamplingSettings

SHORT = SamplingSettings(max_tokens=8)


def _menu_texts(window, cid: int) -> list[str]:
    return [a.text() for a in window.sidebar.build_context_menu(cid).actions() if a.text()]


def _written_chat(window, run_async, title: str) -> int:
    """A chat with a message, so closing its tab keeps it."""
    store = window.db.store
    conversation = store.create_conversation(title=title, sampling=SHORT)
    store.append_user_message(conversation.id, "Hello")
    run_async(window.chat_list.refresh())
    return conversation.id


def test_archiving_closes_the_tab_and_leaves_the_list(window_on, run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    cid = _written_chat(window, run_async, "Trip to Kyoto")
    run_async(window.chat_tabs.open_conversation(cid))
    assert window.chats.current == cid and "Archive" in _menu_texts(window, cid)

    run_async(window.chat_list.archive(cid, True))

    assert cid not in window.chats.ids
    assert "Trip to Kyoto" not in window.sidebar.conversation_titles()
    assert window.db.store.get_conversation(cid).archived
    assert "Show archived chats" in window.status.currentMessage()


def test_show_archived_lists_them_and_unarchive_brings_one_back(window_on, qtbot, run_async,
                                                                tmp_path):
    window = window_on(tmp_path / "chats.db")
    cid = _written_chat(window, run_async, "Sourdough starter")
    run_async(window.chat_list.archive(cid, True))

    window.sidebar.show_archived.setChecked(True)
    qtbot.waitUntil(lambda: "Sourdough starter" in window.sidebar.conversation_titles(),
                    timeout=5000)
    assert "Unarchive" in _menu_texts(window, cid)

    run_async(window.chat_list.archive(cid, False))
    window.sidebar.show_archived.setChecked(False)
    qtbot.waitUntil(lambda: "Sourdough starter" in window.sidebar.conversation_titles()
                    and not window.db.store.get_conversation(cid).archived, timeout=5000)
    assert "Archive" in _menu_texts(window, cid)


def test_an_imported_archived_chat_is_found_under_show_archived(window_on, qtbot, run_async,
                                                                tmp_path):
    window = window_on(tmp_path / "chats.db")
    store = window.db.store
    cid = _written_chat(window, run_async, "Old notes")
    store.set_archived(cid, True)
    (imported,) = store.import_json(store.export_json([cid]))
    run_async(window.chat_list.refresh())
    assert not any("Old notes" in t for t in window.sidebar.conversation_titles())

    window.sidebar.show_archived.setChecked(True)
    qtbot.waitUntil(lambda: {"Old notes", "Old notes (imported)"}
                    <= set(window.sidebar.conversation_titles()), timeout=5000)
    assert window.db.store.get_conversation(imported).archived


def test_archiving_an_untouched_new_chat_just_closes_it(window_on, run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    run_async(window.chat_tabs.new_chat())
    cid = window.chats.current

    run_async(window.chat_list.archive(cid, True))

    assert cid not in window.chats.ids
    assert cid not in {c.id for c in window.db.store.list_conversations(include_archived=True)}
