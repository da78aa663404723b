"""Documents in a chat, against issue 30's targets (not a test; results go to docs/BENCHMARKS.md):

  attach   a generated 200-page text PDF read, cut into passages and indexed in the store, as
           a chat does it (target <= 10 s), while a 5 ms timer on the event loop records its
           longest stall (target < 50 ms)
  search   the passages for a question among 10,000 (target <= 50 ms), English and Chinese
  hybrid   the same with a ranking by meaning joined (768-wide vectors stored for every
           passage): the first question (the vectors read from the store), the next ones
           (kept in memory), the question's own vector not counted (a server's time; with
           --embeddings-url it is measured apart, on that server)
  prefix   a document that fits the context, asked twice through the chat with the default
           model: the second question's time to first token against the first (target
           <= 0.25x: the prefix cache keeps the document)

    .venv/bin/python bench/documents.py [--only attach,search,hybrid,prefix] [--json out.json]
        [--embeddings-url http://host:port/v1 --embeddings-model NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cpu_info import cpu_name

PAGES = 200
SEARCH_PASSAGES = 10_000
TICK_S = 0.005
QUESTIONS = ["How much oil did the lamp burn in winter?", "When was the lens cleaned?",
             "What did the keeper see on stormy nights?", "长城有多长？", "北京的人口是多少？"]
TOPICS = ["The keeper logged the weather, the ships and the oil each evening.",
          "Storms came from the north-west; the lamp burned all night.",
          "The lens was cleaned on Tuesdays and the brass polished on Fridays.",
          "长城是中国古代的军事防御工程，全长两万多公里。", "北京是中国的首都，人口超过两千万。",
          "Oil use rose to forty litres a week in winter, twenty in summer."]


def make_pdf(path: Path, pages: int) -> None:
    """A text PDF of `pages` pages, a heading and a few paragraphs each (reportlab)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen.canvas import Canvas

    canvas = Canvas(str(path), pagesize=A4)
    for page in range(1, pages + 1):
        text = canvas.beginText(50, 800)
        text.setFont("Helvetica", 11)
        text.textLine(f"Chapter {page}: the lighthouse log")
        for line in range(40):
            text.textLine(f"Day {page}.{line}: {TOPICS[(page + line) % 4]}")
        canvas.drawText(text)
        canvas.showPage()
    canvas.save()


class Ticker:
    """The longest gap between ticks of a 5 ms timer on the running loop."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            self.longest_s = max(self.longest_s, now - last - TICK_S)
            last = now

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        self._task.cancel()


async def bench_attach(folder: Path) -> dict:
    from pagoda.app.components.documents.chat_documents import ChatDocuments
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.store import ConversationStore

    pdf = folder / "log.pdf"
    make_pdf(pdf, PAGES)
    db = AsyncStore(ConversationStore.open(folder / "attach.db"))
    try:
        cid = (await db.create_conversation()).id
        message = await db.append_user_message(cid, "Read this")
        documents = ChatDocuments(db)
        ticker = Ticker()
        ticker.start()
        began = time.perf_counter()
        await documents.attach([pdf])
        read_s = time.perf_counter() - began
        (attached,) = await documents.keep_with(message.id)
        total_s = time.perf_counter() - began
        ticker.stop()
        return {"pdf_bytes": pdf.stat().st_size, "pages": attached.pages,
                "passages": attached.num_chunks, "read_and_cut_s": round(read_s, 3),
                "with_index_s": round(total_s, 3),
                "longest_loop_stall_ms": round(ticker.longest_s * 1000, 1)}
    finally:
        db.close()


def _passages(store) -> list[int]:
    """SEARCH_PASSAGES passages in 25 documents of one chat; their attachment ids."""
    from pagoda.app.store import AttachmentChunk, NewAttachment

    message = store.append_user_message(store.create_conversation().id, "Read these")
    ids = []
    per_document = 400
    for d in range(SEARCH_PASSAGES // per_document):
        chunks = tuple(AttachmentChunk(i, " ".join(TOPICS[(d + i + k) % len(TOPICS)]
                                                   for k in range(8)) + f" Entry {d}-{i}.",
                                       page=i // 2 + 1) for i in range(per_document))
        ids.append(store.add_attachment(message.id, NewAttachment(
            f"log-{d}.pdf", "pdf", 1, "", chunks, per_document // 2)).id)
    return ids


def bench_search(folder: Path) -> dict:
    from pagoda.app.components.documents import fts_query
    from pagoda.app.store import ConversationStore

    with ConversationStore.open(folder / "search.db") as store:
        ids = _passages(store)
        times = {}
        for question in QUESTIONS:
            runs = []
            for _ in range(5):
                began = time.perf_counter()
                hits = store.search_passages(ids, fts_query(question), question, 12)
                runs.append(time.perf_counter() - began)
            times[question] = {"median_ms": round(statistics.median(runs) * 1000, 1),
                               "max_ms": round(max(runs) * 1000, 1), "hits": len(hits)}
        return {"passages": SEARCH_PASSAGES, "questions": times}


class _StoredVectors:
    """Stands in for the server in the hybrid stage: every question's vector is a fixed random
    one, so what is timed is ours (reading the vectors, the ranking, the joined search)."""

    def __init__(self, source, width: int) -> None:
        import numpy as np

        self.source = source
        self._vector = np.random.default_rng(1).standard_normal(width).astype(np.float32)
        self._vector /= np.linalg.norm(self._vector)

    async def embed(self, texts):
        import numpy as np

        return np.stack([self._vector] * len(texts))


async def bench_hybrid(folder: Path, url: str | None, model: str | None) -> dict:
    import numpy as np

    from pagoda.app.components.documents import fts_query
    from pagoda.app.components.documents.document_embeddings import (
        DocumentEmbeddings,
        EmbeddingsChoice,
    )
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.components.shared.connections import ConnectionKeys, SavedConnections
    from pagoda.app.store import ConversationStore

    width = 768
    db = AsyncStore(ConversationStore.open(folder / "hybrid.db"))
    try:
        ids = await db.run(_passages)
        embeddings = DocumentEmbeddings(db, SavedConnections(db, ConnectionKeys.in_memory()),
                                        client=lambda source: _StoredVectors(source, width))
        server = await embeddings.connections.add("http://127.0.0.1:9/v1", "chat", None)
        await embeddings.choose(EmbeddingsChoice(server.id, "bench-768"))
        rng = np.random.default_rng(0)
        key = embeddings.source.key
        for attachment in ids:
            missing = await db.chunks_without_vectors(attachment, key, 400)
            for at in range(0, len(missing), 200):
                rows = missing[at:at + 200]
                vectors = rng.standard_normal((len(rows), width)).astype("<f4")
                await db.add_chunk_vectors(key, [(c, v.tobytes()) for (c, _), v
                                                 in zip(rows, vectors, strict=True)])
        runs = []
        for question in QUESTIONS * 3:
            began = time.perf_counter()
            ranked = await embeddings.ranking(ids, question, 50)
            await db.search_passages(ids, fts_query(question), question, 12, ranked=ranked)
            runs.append(time.perf_counter() - began)
        report = {"passages": SEARCH_PASSAGES, "width": width,
                  "first_question_ms": round(runs[0] * 1000, 1),
                  "next_questions_median_ms": round(statistics.median(runs[1:]) * 1000, 1),
                  "next_questions_max_ms": round(max(runs[1:]) * 1000, 1)}
        if url and model:
            report["server"] = await _server_question_ms(url, model)
        return report
    finally:
        db.close()


async def _server_question_ms(url: str, model: str) -> dict:
    from pagoda.app.backends.services.embeddings import EmbeddingModel, EmbeddingsClient

    client = EmbeddingsClient(EmbeddingModel(url, model))
    await client.embed(["warm-up"])
    runs = []
    for question in QUESTIONS:
        began = time.perf_counter()
        await client.embed([question])
        runs.append(time.perf_counter() - began)
    return {"url": url, "model": model,
            "question_vector_median_ms": round(statistics.median(runs) * 1000, 1)}


async def bench_prefix(folder: Path) -> dict:
    from pagoda.app.backends.chat.local import LocalBackend
    from pagoda.app.backends.services.local_engine import make_local_engine
    from pagoda.app.components.chat.chat_session import ChatSession
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.store import ConversationStore, SamplingSettings
    from pagoda.engine import EngineConfig

    notes = folder / "notes.md"
    notes.write_text("\n\n".join(f"## Day {day}\n\n{TOPICS[day % len(TOPICS)]} " * 3
                                 for day in range(60)), encoding="utf-8")
    backend = LocalBackend(make_local_engine(None, EngineConfig(), lambda *_: None))
    db = AsyncStore(ConversationStore.open(folder / "prefix.db"))

    class Source:
        def __init__(self) -> None:
            self.backend = backend

        def backend_for_new_request(self):
            return backend

    try:
        cid = (await db.create_conversation(
            sampling=SamplingSettings(temperature=0.0, max_tokens=16))).id
        session = ChatSession(cid, db, Source())
        await session.open()
        await session.attach([notes])
        ttfts, prompts = [], []
        for question in ("How much oil in winter?", "When was the lens cleaned?"):
            await session.send(question)
            reply = session.path[-1]
            ttfts.append(reply.stats.ttft_s)
            prompts.append((reply.prompt_tokens, reply.stats.cached_tokens))
        return {"document_chars": len(notes.read_text()), "prompt_and_cached_tokens": prompts,
                "ttft_s": [round(t, 3) for t in ttfts], "second_over_first":
                    round(ttfts[1] / ttfts[0], 3)}
    finally:
        db.close()
        backend.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="attach,search,hybrid,prefix")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--embeddings-url", help="a server's /v1 whose question vectors to time")
    parser.add_argument("--embeddings-model")
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    report: dict = {"cpu": cpu_name(), "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="pagoda-documents-bench-") as tmp:
        folder = Path(tmp)
        if "attach" in wanted:
            report["attach"] = asyncio.run(bench_attach(folder))
        if "search" in wanted:
            report["search"] = bench_search(folder)
        if "hybrid" in wanted:
            report["hybrid"] = asyncio.run(bench_hybrid(folder, args.embeddings_url,
                                                        args.embeddings_model))
        if "prefix" in wanted:
            report["prefix"] = asyncio.run(bench_prefix(folder))
    print(json.dumps(report, indent=2, ensure_ascii=False))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
