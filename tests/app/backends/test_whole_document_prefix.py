"""A document that fits the context goes whole into the prompt, once: the engine in this process
finds it in its prefix cache on the next question (the chat through a real ChatSession, the
default model)."""

from pathlib import Path

import pytest
from conftest import run

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.store import ConversationStore, SamplingSettings

LOG = "\n\n".join(f"## Day {day}\n\nThe keeper burned {20 + day} litres of oil and saw "
                  f"{day % 7} ships pass the point." for day in range(1, 40))


class _Source:
    def __init__(self, backend) -> None:
        self.backend = backend

    def backend_for_new_request(self):
        return self.backend


@pytest.mark.slow
def test_the_second_question_reads_the_document_from_the_prefix_cache(local_backend,
                                                                     tmp_path: Path):
    (tmp_path / "log.md").write_text(LOG, encoding="utf-8")
    db = AsyncStore(ConversationStore.open(tmp_path / "chats.db"))

    async def two_questions():
        cid = (await db.create_conversation(
            sampling=SamplingSettings(temperature=0.0, max_tokens=4))).id
        session = ChatSession(cid, db, _Source(local_backend))
        await session.open()
        await session.files.attach([str(tmp_path / "log.md")])
        replies = []
        for question in ("How much oil on day 12?", "And on day 30?"):
            await session.send(question)
            replies.append(session.path[-1])
        return replies

    try:
        first, second = run(two_questions(), timeout=300)
    finally:
        db.close()
    assert first.prompt_tokens > 500  # the document is in the prompt
    assert second.stats.cached_tokens >= first.prompt_tokens - 16  # all but the last block
    assert [s.name for s in second.sources] == ["log.md"]
