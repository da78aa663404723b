"""Documents in a chat, without a window: files read off the loop and kept with the user's
message, given to the model whole where they fit (the same prefix turn after turn) or as the
passages retrieved for the question, the reply's sources, and a restart keeping it all."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from pagoda.app.backends import PromptProgress
from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.chat.reply_stream import reading_text
from tests.app.components.fake_backend import WAIT_S, ScriptedBackend, eventually

NOTES = """# Lighthouse log

The keeper lit the lamp at dusk. Oil use was forty litres a week in winter.

## Repairs

The lens was cleaned on Tuesdays; the brass was polished on Fridays.
"""
FILLER = "Unrelated words about the harbour and its many boats fill this page. " * 40


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


async def ask(session: ChatSession, backend: ScriptedBackend, text: str, reply: str = "ok"):
    task = session.spawn(session.send(text))
    request = await backend.next_request()
    await request.say(reply, "stop")
    await asyncio.wait_for(task, WAIT_S)
    return request


async def test_an_attached_file_is_read_kept_with_the_message_and_shown_on_it(session, backend,
                                                                             view, tmp_path):
    await session.files.attach([write(tmp_path, "log.md", NOTES)])
    (pending,) = session.files.documents.views
    assert (pending.name, pending.state, pending.kind) == ("log.md", "ready", "markdown")
    first_shown = view.called("show_pending_attachments")[0][0]
    assert [v.state for v in first_shown] == ["reading"]
    await ask(session, backend, "How much oil did the lamp use?")
    assert session.files.documents.views == []
    user = session.views[0]
    assert [(a.name, a.kind) for a in user.attachments] == [("log.md", "markdown")]


async def test_a_document_that_fits_goes_whole_and_stays_the_same_prefix(session, backend,
                                                                        tmp_path):
    await session.files.attach([write(tmp_path, "log.md", NOTES)])
    first = await ask(session, backend, "How much oil did the lamp use?")
    system = first.messages[0]
    assert system.role == "system" and "forty litres a week" in system.content
    assert '<file name="log.md">' in system.content
    second = await ask(session, backend, "And the lens?")
    assert second.messages[0] == system  # the prefix cache keeps serving it
    reply = session.views[-1]
    assert [(s.number, s.name) for s in reply.sources] == [(1, "log.md")]


async def ask_about_a_long_document(open_chat, source, tmp_path, question: str):
    """A chat whose model's context is too small for its document, asked `question`: the
    session and the request its backend got."""
    small = ScriptedBackend(max_model_len=700)
    source.swap(small)
    session = await open_chat()
    text = "\n\n".join([FILLER] * 3 + [NOTES] + [FILLER] * 3)
    await session.files.attach([write(tmp_path, "big.md", text)])
    return session, await ask(session, small, question)


async def test_a_document_too_long_for_the_context_gives_the_passages_for_the_question(
        open_chat, source, tmp_path, view):
    session, request = await ask_about_a_long_document(
        open_chat, source, tmp_path, "How many litres of oil did the lamp use?")
    question = request.messages[-1]
    assert question.role == "user" and question.content.endswith(
        "How many litres of oil did the lamp use?")
    assert "[1] big.md" in question.content and "forty litres" in question.content
    assert all("<file" not in m.content for m in request.messages)
    reply = session.views[-1]
    assert reply.sources and reply.sources[0].name == "big.md"
    await session.files.open_source(reply.id, reply.sources[0].number)
    (passage,) = view.called("show_passage")
    assert "forty litres" in passage[0].text and passage[0].name == "big.md"


async def test_a_cited_passage_names_the_heading_it_is_under_after_a_reopen_too(
        open_chat, source, db, tmp_path):
    session, _request = await ask_about_a_long_document(
        open_chat, source, tmp_path, "How many litres of oil did the lamp use?")
    cited = [(s.name, s.heading) for s in session.views[-1].sources]
    assert ("big.md", "Lighthouse log") in cited
    session.close()
    reopened = ChatSession(session.conversation_id, db, source)
    await reopened.open()
    assert [(s.name, s.heading) for s in reopened.views[-1].sources] == cited


async def test_a_file_that_cannot_be_read_says_why_and_does_not_stop_the_message(
        session, backend, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    await session.files.attach([str(tmp_path / "empty.txt"), str(tmp_path / "missing.pdf")])
    failed = session.files.documents.views
    assert [v.state for v in failed] == ["failed", "failed"]
    assert "empty.txt" in failed[0].error and "missing.pdf" in failed[1].error
    request = await ask(session, backend, "hello")
    assert [m.role for m in request.messages] == ["user"]
    assert session.views[0].attachments == ()


async def test_a_message_waits_while_a_file_is_being_read(db, source, view, tmp_path, backend):
    release = threading.Event()

    def slow_read(path, on_progress, stopped=None):
        from pagoda.app.components.documents import read_document

        on_progress(1, 2)
        release.wait(WAIT_S)
        return read_document(path)

    cid = db.store.create_conversation().id
    session = ChatSession(cid, db, source, view)
    session.files.documents._read = slow_read
    await session.open()
    attaching = session.spawn(session.files.attach([write(tmp_path, "log.md", NOTES)]))
    await eventually(lambda: session.files.documents.views
                     and session.files.documents.views[0].progress == "page 1 / 2", "progress")
    await session.send("What does it say?")
    assert view.drafts == ["What does it say?"] and "still being read" in view.notices[-1]
    release.set()
    await asyncio.wait_for(attaching, WAIT_S)
    await ask(session, backend, "What does it say?")


async def test_a_reopened_chat_still_has_its_documents_and_sources(session, backend, db, source,
                                                                  tmp_path):
    await session.files.attach([write(tmp_path, "log.md", NOTES)])
    await ask(session, backend, "Oil?")
    session.close()
    reopened = ChatSession(session.conversation_id, db, source)
    await reopened.open()
    assert [a.name for a in reopened.views[0].attachments] == ["log.md"]
    assert [s.name for s in reopened.views[1].sources] == ["log.md"]
    task = reopened.spawn(reopened.send("And the lens?"))
    request = await backend.next_request()
    assert "Repairs" in request.messages[0].content
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)


async def test_the_meter_counts_the_documents_waiting_to_be_sent(session, backend, tmp_path):
    await session.refresh_context_meter()
    before = session.context_usage[0] if session.context_usage else 0
    await session.files.attach([write(tmp_path, "log.md", NOTES)])
    assert session.context_usage[0] > before + 30


async def test_the_meter_counts_the_passages_a_waiting_document_too_long_to_go_whole_gives(
        open_chat, source, view, tmp_path):
    small = ScriptedBackend(max_model_len=2000)
    source.swap(small)
    session = await open_chat()
    await session.files.attach([write(tmp_path, "big.md", "\n\n".join([FILLER] * 6 + [NOTES]))])
    assert session.context_usage[0] > 200  # before a word is typed: passages it may give
    await session.count_draft("How many litres of oil did the lamp use?")
    meter, _context, _max_tokens = session.context_usage
    assert view.called("show_context_usage")[-1][-1] is False  # an estimate: "≈"

    request = await ask(session, small, "How many litres of oil did the lamp use?")
    sent = sum(len(m.content.split()) for m in request.messages)  # the fake's tokens: words
    assert "forty litres" in request.messages[-1].content  # the passage went with it
    assert sent * 0.8 <= meter <= sent * 1.25


@pytest.mark.parametrize(("documents", "continuing", "said"), [
    (True, False, "reading your documents: 1,000 / 3,000 tokens"),
    (False, False, "reading your message: 1,000 / 3,000 tokens"),
    (False, True, "reading the chat: 1,000 / 3,000 tokens")])
def test_the_reading_note_says_what_is_being_read(documents, continuing, said):
    assert reading_text(PromptProgress(1000, 3000), continuing, documents) == said


async def _reading_a_long_file(session, tmp_path):
    """The session reading a Word file that takes minutes, well into it: (its attach, the
    reading process)."""
    from pagoda.app.components.documents import ReadingLimits, ReadingProcess
    from tests.app.components.documents.document_files import write_docx
    from tests.app.components.documents.hostile_files import write_huge_xml_docx

    base = write_docx(tmp_path / "base.docx", [("Cider", ["Nine crates."])])
    bomb = write_huge_xml_docx(tmp_path / "report.docx", base, xml_mib=8)  # minutes to read
    reading = ReadingProcess(ReadingLimits(seconds=600))
    session.files.documents._read = reading.read
    attaching = session.spawn(session.files.attach([str(bomb)]))
    await eventually(lambda: session.files.documents.reading == "report.docx", "the reading")
    await asyncio.sleep(1.0)  # well into the file
    return attaching, reading


async def test_removing_a_file_while_it_is_read_stops_its_reading_at_once(session, tmp_path):
    attaching, reading = await _reading_a_long_file(session, tmp_path)
    session.files.remove_pending(0)
    await asyncio.wait_for(attaching, 5.0)
    assert session.files.documents.views == []
    await session.files.attach([write(tmp_path, "log.md", NOTES)])
    assert [v.state for v in session.files.documents.views] == ["ready"]
    reading.close()


async def test_closing_the_chat_stops_the_reading_of_its_waiting_file(session, tmp_path):
    attaching, reading = await _reading_a_long_file(session, tmp_path)
    session.close()
    await asyncio.wait_for(attaching, 5.0)
    assert session.files.documents.views == []
    reading.close()
