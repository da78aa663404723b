"""Documents' passages embedded by a chosen server: the setting kept, passages embedded in the
background and stored per model, a question ranking passages by meaning, and a server that fails
leaving retrieval to words with the reason said."""

from __future__ import annotations

import asyncio

import pytest

from pagoda.app.components.documents.document_embeddings import (
    DocumentEmbeddings,
    EmbeddingsChoice,
)
from pagoda.app.components.shared.connections import ConnectionKeys, SavedConnections
from pagoda.app.store import AttachmentChunk, NewAttachment
from tests.app.components.documents.embedders import ConceptEmbedder

PASSAGES = ["The red car was parked by the harbour wall.",
            "Her salary was paid on the first of the month.",
            "At night the waves broke on the rocks below the lamp.",
            "The keeper was tired and went to sleep early."]


def document(store, passages=PASSAGES, name="log.md") -> int:
    cid = store.create_conversation().id
    message = store.append_user_message(cid, "Read this")
    chunks = tuple(AttachmentChunk(i, text) for i, text in enumerate(passages))
    return store.add_attachment(message.id, NewAttachment(name, "markdown", 10, "\n".join(
        passages), chunks)).id


@pytest.fixture
def embedders() -> list[ConceptEmbedder]:
    return []


@pytest.fixture
def make_embeddings(db, embedders):
    async def make() -> DocumentEmbeddings:
        connections = SavedConnections(db, ConnectionKeys.in_memory())
        await connections.load()
        embeddings = DocumentEmbeddings(db, connections, client=lambda source: (
            embedders.append(ConceptEmbedder(source)) or embedders[-1]))
        await embeddings.load()
        return embeddings
    return make


async def chosen(make_embeddings, model="concepts") -> DocumentEmbeddings:
    embeddings = await make_embeddings()
    server = await embeddings.connections.add("http://embedder:8080/v1", "chat-model", None)
    await embeddings.choose(EmbeddingsChoice(server.id, model))
    return embeddings


async def test_off_until_a_server_is_chosen_and_then_nothing_is_sent(make_embeddings, store,
                                                                     embedders):
    embeddings = await make_embeddings()
    attachment = document(store)
    assert embeddings.source is None and embeddings.state.text.startswith("off")
    assert await embeddings.ranking([attachment], "where is the automobile?", 5) == []
    embeddings.index_soon([attachment])
    await embeddings.wait_idle()
    assert embedders == []


async def test_the_choice_is_kept_and_read_back_by_the_next_window(make_embeddings, db):
    first = await chosen(make_embeddings, model="nomic-embed-text")
    later = await make_embeddings()
    assert later.choice == first.choice and later.source.model == "nomic-embed-text"
    assert later.source.base_url == "http://embedder:8080/v1"
    await later.choose(None)
    assert (await make_embeddings()).source is None


async def test_a_server_not_saved_or_no_model_is_refused_in_words(make_embeddings):
    embeddings = await make_embeddings()
    with pytest.raises(ValueError, match="not among the saved servers"):
        await embeddings.choose(EmbeddingsChoice("no-such-id", "m"))
    server = await embeddings.connections.add("http://embedder:8080/v1", "chat", None)
    with pytest.raises(ValueError, match="name the embedding model"):
        await embeddings.choose(EmbeddingsChoice(server.id, "  "))
    assert embeddings.source is None


async def test_passages_are_embedded_in_the_background_and_stored_per_model(make_embeddings,
                                                                            store, embedders):
    embeddings = await chosen(make_embeddings)
    attachment = document(store, PASSAGES * 20)  # 80 passages: three requests of at most 32
    embeddings.index_soon([attachment])
    await embeddings.wait_idle()
    (embedder,) = embedders
    assert [len(r) for r in embedder.requests] == [32, 32, 16]
    key = embeddings.source.key
    assert len(store.chunk_vectors(attachment, key)) == 80
    assert store.chunks_without_vectors(attachment, key, 10) == []
    assert store.chunks_without_vectors(attachment, "another model", 100)[0][1] == PASSAGES[0]
    assert embeddings.state.text == "concepts: every passage embedded"
    embeddings.index_soon([attachment])  # nothing left to embed: nothing sent
    await embeddings.wait_idle()
    assert len(embedder.requests) == 3


async def test_a_question_ranks_passages_by_meaning(make_embeddings, store):
    embeddings = await chosen(make_embeddings)
    attachment = document(store)
    embeddings.index_soon([attachment])
    await embeddings.wait_idle()
    ids = [chunk_id for chunk_id, _ in store.chunk_vectors(attachment, embeddings.source.key)]
    ranked = await embeddings.ranking([attachment], "Where was the automobile?", 2)
    assert ranked[0] == ids[0]
    assert (await embeddings.ranking([attachment], "Did he get some rest?", 1)) == [ids[3]]
    hits = store.search_passages([attachment], None, "", 4, ranked=ranked)
    assert hits[0].chunk.text == PASSAGES[0]


async def test_a_document_embedded_later_joins_the_next_questions_ranking(make_embeddings,
                                                                          store):
    embeddings = await chosen(make_embeddings)
    first = document(store, PASSAGES[1:])
    embeddings.index_soon([first])
    await embeddings.wait_idle()
    assert len(await embeddings.ranking([first], "Where was the automobile?", 5)) == 3
    second = document(store, PASSAGES[:1], name="car.md")
    assert len(await embeddings.ranking([first, second], "Where was the automobile?", 5)) == 3
    await embeddings.wait_idle()  # the question above queued the new document
    ranked = await embeddings.ranking([first, second], "Where was the automobile?", 5)
    car = store.chunk_vectors(second, embeddings.source.key)[0][0]
    assert len(ranked) == 4 and ranked[0] == car
    assert car not in await embeddings.ranking([first], "Where was the automobile?", 5)


async def test_the_first_question_starts_the_embedding_and_the_next_one_uses_it(
        make_embeddings, store):
    embeddings = await chosen(make_embeddings)
    attachment = document(store)
    assert await embeddings.ranking([attachment], "the ocean at night", 3) == []
    await embeddings.wait_idle()
    ranked = await embeddings.ranking([attachment], "the ocean at night", 3)
    assert store.search_passages([attachment], None, "", 1, ranked=ranked)[0].chunk.text == \
        PASSAGES[2]


async def test_a_server_that_fails_leaves_retrieval_to_words_and_says_why(make_embeddings,
                                                                         store, embedders):
    embeddings = await chosen(make_embeddings)
    attachment = document(store)
    embedders[0].down = True
    embeddings.index_soon([attachment])
    await embeddings.wait_idle()
    assert embeddings.state.error and "refused the connection" in embeddings.state.text
    assert "found by their words only" in embeddings.state.text
    assert store.chunk_vectors(attachment, embeddings.source.key) == []
    sent = len(embedders[0].requests)
    embeddings.index_soon([attachment])  # not retried at once: the server just failed
    await embeddings.wait_idle()
    assert len(embedders[0].requests) == sent


async def test_a_question_the_server_cannot_embed_is_found_by_words(make_embeddings, store,
                                                                   embedders):
    embeddings = await chosen(make_embeddings)
    attachment = document(store)
    embeddings.index_soon([attachment])
    await embeddings.wait_idle()
    embedders[0].down = True
    assert await embeddings.ranking([attachment], "the automobile", 3) == []
    assert embeddings.state.error and "found by its words only" in embeddings.state.text



async def test_a_chat_finds_by_meaning_the_passage_its_words_miss(open_chat, source, tmp_path,
                                                                  make_embeddings):
    from tests.app.components.fake_backend import WAIT_S, ScriptedBackend

    small = ScriptedBackend(max_model_len=2000)
    source.swap(small)
    session = await open_chat()
    session.files.documents.embeddings = await chosen(make_embeddings)
    filler = "Unrelated words about the harbour and its many boats fill this page. " * 40
    path = tmp_path / "big.md"
    path.write_text("\n\n".join([filler] * 3 + [PASSAGES[0]] + [filler] * 3), encoding="utf-8")
    await session.files.attach([str(path)])
    for _ in range(2):  # the first question starts the embedding; the second one uses it
        task = session.spawn(session.send("Where did the automobile stand?"))
        request = await small.next_request()
        await request.say("ok", "stop")
        await asyncio.wait_for(task, WAIT_S)
        await session.files.documents.embeddings.wait_idle()
    question = request.messages[-1].content
    assert "red car was parked" in question and "[1] big.md" in question
