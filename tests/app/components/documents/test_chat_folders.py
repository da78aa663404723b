"""A chat's folders, without a window: their files indexed in the background, questions
answered from their passages, files changed, added or deleted followed, a file that cannot be
read reported (and read again only once it changes), the bounds said, a folder removed with
its index, and a reopened chat still answering from its folders."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.documents import (
    ReadingLimits,
    ReadingProcess,
    folder_index,
    folder_scan,
    read_document,
    reading_thread,
)
from pagoda.app.components.documents.folder_index import ChatFolders
from pagoda.app.components.documents.folder_scan import FolderError
from tests.app.components.documents.document_files import write_docx
from tests.app.components.documents.hostile_files import write_huge_xml_docx
from tests.app.components.fake_backend import WAIT_S, ScriptedBackend, eventually

LIGHTHOUSE = """# Lighthouse log

The keeper lit the lamp at dusk. Oil use was forty litres a week in winter.
"""
HARBOUR = "The harbour master counted thirty boats at the old pier on Sunday.\n"
GARDEN = "<html><body><h1>Garden</h1><p>The tomatoes ripened in the greenhouse.</p></body></html>"
ORCHARD = "# Orchard\n\nThe apple trees gave nine crates of cider apples this autumn.\n"


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def notes_folder(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    write(root, "log/lighthouse.md", LIGHTHOUSE)
    write(root, "harbour.txt", HARBOUR)
    write(root, "garden.html", GARDEN)
    return root


def touch_later(path: Path, text: str) -> None:
    """Change the file's text and move its modification time on (as an editor's save does)."""
    later = path.stat().st_mtime_ns + 5_000_000_000
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(later, later))


async def ask(session: ChatSession, backend: ScriptedBackend, text: str):
    task = session.spawn(session.send(text))
    request = await backend.next_request()
    await request.say("ok", "stop")
    await asyncio.wait_for(task, WAIT_S)
    return request


async def with_folder(session: ChatSession, root: Path) -> None:
    await session.files.add_folder(str(root))
    await session.files.folders.settled()


async def indexed_texts(session: ChatSession) -> str:
    files = await session.files.folders.documents()
    return "\n".join([await session.db.attachment_text(f.attachment_id) for f in files])


async def test_a_folders_files_are_indexed_and_shown_up_to_date(session, view, tmp_path):
    root = notes_folder(tmp_path)
    await with_folder(session, root)
    (shown,) = session.files.folders.views
    assert (shown.name, shown.path, shown.state) == ("notes", str(root.resolve()), "ready")
    assert (shown.files, shown.indexed, shown.failed) == (3, 3, ())
    files = await session.files.folders.documents()
    assert [(f.source_path, f.kind) for f in files] == [
        ("garden.html", "html"), ("harbour.txt", "text"), ("log/lighthouse.md", "markdown")]
    states = [views[0].state for (views,) in view.called("show_folders") if views]
    assert states[0] == "scanning" and "indexing" in states and states[-1] == "ready"


async def test_a_question_is_answered_from_a_passage_of_a_folders_file(session, backend, view,
                                                                      tmp_path):
    await with_folder(session, notes_folder(tmp_path))
    request = await ask(session, backend, "How many litres of oil did the lamp use?")
    question = request.messages[-1]
    assert "[1] log/lighthouse.md" in question.content and "forty litres" in question.content
    assert all("<file" not in m.content for m in request.messages)
    reply = session.views[-1]
    assert reply.sources[0].name == "log/lighthouse.md"
    await session.files.open_source(reply.id, reply.sources[0].number)
    (passage,) = view.called("show_passage")
    assert "forty litres" in passage[0].text and passage[0].name == "log/lighthouse.md"


async def test_with_a_folder_attached_documents_are_given_as_passages_too(session, backend,
                                                                         tmp_path):
    await with_folder(session, notes_folder(tmp_path))
    await session.files.attach([str(write(tmp_path, "orchard.md", ORCHARD))])
    request = await ask(session, backend, "How many crates of cider apples, and how many boats?")
    question = request.messages[-1].content
    assert "[1]" in question and "orchard.md" in question and "harbour.txt" in question
    assert all("<file" not in m.content for m in request.messages)


async def test_a_changed_file_is_read_again_before_the_question_and_its_old_text_is_gone(
        session, backend, tmp_path):
    root = notes_folder(tmp_path)
    await with_folder(session, root)
    touch_later(root / "harbour.txt", "The harbour master counted eighty kayaks at the pier.\n")
    request = await ask(session, backend, "How many kayaks did the harbour master count?")
    assert "eighty kayaks" in request.messages[-1].content
    texts = await indexed_texts(session)
    assert "eighty kayaks" in texts and "thirty boats" not in texts
    hits = await session.db.search_passages(
        [f.attachment_id for f in await session.files.folders.documents()], '"thirty"')
    assert hits == []


async def test_a_question_during_a_first_indexing_is_answered_from_what_is_indexed(
        session, backend, view, tmp_path, monkeypatch):
    monkeypatch.setattr(folder_index, "QUESTION_WAITS_FOR", 1)
    release = threading.Event()

    def slow(path, on_progress=None, stopped=None):
        release.wait(WAIT_S)
        return read_document(path, on_progress)

    session.files.folders._read = slow
    await session.files.add_folder(str(notes_folder(tmp_path)))
    await eventually(lambda: session.files.folders.views[0].state == "indexing", "the indexing")
    await ask(session, backend, "How many boats at the pier?")
    assert view.notices[-1].startswith("notes is still being indexed")
    release.set()
    await session.files.folders.settled()
    assert session.files.folders.views[0].state == "ready"


async def test_a_file_deleted_is_forgotten_and_a_file_added_is_found(session, tmp_path):
    root = notes_folder(tmp_path)
    await with_folder(session, root)
    (root / "garden.html").unlink()
    write(root, "orchard/apples.md", ORCHARD)
    await session.files.folders.rescan()
    await session.files.folders.settled()
    paths = [f.source_path for f in await session.files.folders.documents()]
    assert paths == ["harbour.txt", "log/lighthouse.md", "orchard/apples.md"]
    assert "tomatoes" not in await indexed_texts(session)
    assert session.files.folders.views[0].files == 3


async def test_a_file_that_cannot_be_read_is_reported_and_read_again_only_once_it_changes(
        db, tmp_path):
    reads: list[str] = []

    def counting(path, on_progress=None, stopped=None):
        reads.append(path.name)
        return read_document(path, on_progress)

    root = notes_folder(tmp_path)
    (root / "empty.md").write_bytes(b"")
    folders = ChatFolders(db.store.create_conversation().id, db, read=counting)
    await folders.open()
    await folders.add(root)
    await folders.settled()
    (shown,) = folders.views
    assert shown.state == "ready" and shown.indexed == 3
    assert [(path, "empty" in why) for path, why in shown.failed] == [("empty.md", True)]
    await folders.rescan()
    await folders.settled()
    assert reads.count("empty.md") == 1
    touch_later(root / "empty.md", "# Now it has words about cider.\n")
    await folders.rescan()
    await folders.settled()
    assert reads.count("empty.md") == 2
    assert (folders.views[0].failed, folders.views[0].indexed) == ((), 4)
    folders.close()


async def test_a_folder_past_the_bounds_says_what_was_left_out(session, tmp_path, monkeypatch):
    monkeypatch.setattr(folder_scan, "MAX_FILES", 2)
    await with_folder(session, notes_folder(tmp_path))
    (shown,) = session.files.folders.views
    assert (shown.files, shown.indexed) == (2, 2)
    assert any(note.startswith("Only the first 2 files are indexed") for note in shown.notes)


async def test_a_path_that_is_no_folder_or_one_too_many_is_refused_in_the_notice(
        session, view, tmp_path, monkeypatch):
    await session.files.add_folder(str(tmp_path / "missing"))
    assert "is not a folder" in view.notices[-1]
    monkeypatch.setattr("pagoda.app.store.documents.folders.MAX_FOLDERS", 1)
    await with_folder(session, notes_folder(tmp_path))
    await session.files.add_folder(str(tmp_path))
    assert "at most 1 folders" in view.notices[-1]
    assert len(session.files.folders.views) == 1


async def test_a_folder_dropped_on_the_chat_becomes_one_of_its_folders(session, tmp_path):
    root = notes_folder(tmp_path)
    await session.files.attach([str(root), str(write(tmp_path, "orchard.md", ORCHARD))])
    await session.files.folders.settled()
    assert [v.name for v in session.files.folders.views] == ["notes"]
    assert [v.name for v in session.files.documents.views] == ["orchard.md"]


async def test_removing_a_folder_while_it_is_read_stops_and_deletes_its_index(db, tmp_path):
    release, reading = threading.Event(), threading.Event()

    def slow(path, on_progress=None, stopped=None):
        reading.set()
        release.wait(WAIT_S)
        return read_document(path, on_progress)

    cid = db.store.create_conversation().id
    folders = ChatFolders(cid, db, read=slow)
    await folders.open()
    await folders.add(notes_folder(tmp_path))
    await eventually(reading.is_set, "the first file being read")
    (shown,) = folders.views
    assert (shown.state, shown.done, shown.to_read) == ("indexing", 0, 3)
    removing = asyncio.ensure_future(folders.remove(shown.id))
    release.set()
    await asyncio.wait_for(removing, WAIT_S)
    await folders.settled()
    assert folders.views == [] and await db.folders(cid) == []
    assert await db.chat_folder_files(cid) == []


async def test_a_reopened_chat_keeps_its_folders_and_looks_at_them_again(session, db, source,
                                                                        backend, tmp_path):
    root = notes_folder(tmp_path)
    await with_folder(session, root)
    session.close()
    write(root, "orchard.md", ORCHARD)
    reopened = ChatSession(session.conversation_id, db, source)
    await reopened.open()
    assert [v.name for v in reopened.files.folders.views] == ["notes"]
    await reopened.files.folders.settled()
    assert reopened.files.folders.views[0].indexed == 4
    request = await ask(reopened, backend, "How many crates of cider apples?")
    assert "nine crates" in request.messages[-1].content
    reopened.close()


async def test_the_folders_are_looked_at_again_while_the_chat_is_open(db, tmp_path):
    root = notes_folder(tmp_path)
    folders = ChatFolders(db.store.create_conversation().id, db, rescan_s=0.02)
    await folders.open()
    await folders.add(root)
    await folders.settled()
    write(root, "orchard.md", ORCHARD)
    await eventually(lambda: folders.views[0].indexed == 4, "the new file indexed")
    folders.close()
    write(root, "later.md", ORCHARD)
    await asyncio.sleep(0.1)
    assert len(await db.chat_folder_files(folders.conversation_id)) == 4


async def test_closing_the_chat_stops_its_folders_reading(db, tmp_path):
    release, reading = threading.Event(), threading.Event()

    def slow(path, on_progress=None, stopped=None):
        reading.set()
        release.wait(WAIT_S)
        return read_document(path, on_progress)

    folders = ChatFolders(db.store.create_conversation().id, db, read=slow)
    await folders.open()
    await folders.add(notes_folder(tmp_path))
    await eventually(reading.is_set, "the first file being read")
    folders.close()
    release.set()
    await folders.settled()
    assert await db.chat_folder_files(folders.conversation_id) == []


async def test_the_meter_counts_the_passages_a_folder_gives(session, tmp_path):
    await session.count_draft("How many litres of oil did the lamp use?")
    before = session.context_usage[0]
    await with_folder(session, notes_folder(tmp_path))
    await session.count_draft("How many litres of oil did the lamp use?")
    assert session.context_usage[0] > before + 10


async def test_a_passage_whose_file_changed_since_says_so(session, backend, view, tmp_path):
    root = notes_folder(tmp_path)
    await with_folder(session, root)
    await ask(session, backend, "How many litres of oil did the lamp use?")
    touch_later(root / "log/lighthouse.md", "# Lighthouse log\n\nThe lamp is electric now.\n")
    await session.files.folders.rescan()
    await session.files.folders.settled()
    reply = session.views[-1]
    await session.files.open_source(reply.id, reply.sources[0].number)
    (passage,) = view.called("show_passage")
    assert "no longer in the chat" in passage[0].text


async def test_a_file_whose_name_is_not_utf8_is_reported_and_the_others_are_indexed(db, tmp_path):
    reads: list[str] = []

    def counting(path, on_progress=None, stopped=None):
        reads.append(path.name)
        return read_document(path, on_progress)

    root = notes_folder(tmp_path)
    (root / os.fsdecode(b"caf\xe9 menu.txt")).write_bytes(b"Cider at two crowns a jug.\n")
    folders = ChatFolders(db.store.create_conversation().id, db, read=counting)
    await folders.open()
    await folders.add(root)
    await folders.settled()
    (shown,) = folders.views
    assert (shown.state, shown.indexed) == ("ready", 3)
    (note,) = [note for note in shown.notes if "caf" in note]
    assert "caf\\xe9 menu.txt" in note and "UTF-8" in note and "Unicode" not in note
    await folders.rescan()
    await folders.settled()
    assert folders.views[0].state == "ready"
    assert not any("caf" in name for name in reads)
    folders.close()


async def test_a_folder_whose_path_is_not_utf8_is_refused_in_words(db, tmp_path):
    root = tmp_path / os.fsdecode(b"r\xe9sum\xe9s")
    root.mkdir()
    folders = ChatFolders(db.store.create_conversation().id, db)

    with pytest.raises(FolderError, match=r"r\\xe9sum\\xe9s cannot be kept: its path is not UTF-8"):
        await folders.add(root)
    assert await db.folders(folders.conversation_id) == []


def office_bomb(root: Path, tmp_path: Path, xml_mib: float) -> Path:
    """A 40 KB Word file of MiBs of paragraphs: minutes of markitdown's time a MiB."""
    base = write_docx(tmp_path / "base.docx", [("Cider", ["Nine crates."])])
    return write_huge_xml_docx(root / "a-report.docx", base, xml_mib)


async def test_an_office_bomb_in_a_folder_is_stopped_and_the_other_files_are_indexed(
        db, tmp_path):
    root = tmp_path / "notes"
    write(root, "log/lighthouse.md", LIGHTHOUSE)
    write(root, "harbour.txt", HARBOUR)
    office_bomb(root, tmp_path, xml_mib=4)  # read first, by its name
    reading = ReadingProcess(ReadingLimits(seconds=1, seconds_per_mib=0))
    folders = ChatFolders(db.store.create_conversation().id, db, read=reading.read)
    await folders.open()
    await folders.add(root)
    await folders.settled()
    (shown,) = folders.views
    assert (shown.state, shown.indexed) == ("ready", 2)
    [(path, why)] = shown.failed
    assert path == "a-report.docx" and "reading it took more than 1.0 s" in why
    folders.close()
    reading.close()


async def test_closing_the_chat_stops_an_office_bomb_and_frees_the_reading_thread(db, tmp_path):
    root = tmp_path / "reports"
    root.mkdir()
    office_bomb(root, tmp_path, xml_mib=8)
    reading = ReadingProcess(ReadingLimits(seconds=600))
    folders = ChatFolders(db.store.create_conversation().id, db, read=reading.read)
    await folders.open()
    await folders.add(root)
    await eventually(lambda: folders.views[0].state == "indexing", "the reading")
    await asyncio.sleep(1.0)  # well into the file
    folders.close()
    closed = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(reading_thread(), lambda: None)
    assert time.monotonic() - closed < 5
    await folders.settled()
    assert await db.chat_folder_files(folders.conversation_id) == []
    reading.close()
