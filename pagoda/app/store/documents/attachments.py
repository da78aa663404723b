"""Attached documents in the database: adding one with its passages, reading them back, and
finding the passages that answer a question (FTS5's bm25 over a trigram index). Functions of
a session: ConversationStore opens the sessions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from ..errors import StoreError
from ..records import (
    AttachedDocument,
    Attachment,
    AttachmentChunk,
    ChunkHit,
    Citation,
    NewAttachment,
)
from ..schema import AttachmentChunkRow, AttachmentRow, MessageRow
from ..search import cjk_grams, vectors

MAX_HITS = 200
# A chunk's FTS query is built by the app (documents.retrieval_query); bound what reaches SQLite.
MAX_QUERY_CHARS = 4096


def add(s: Session, message: MessageRow, document: NewAttachment, now: datetime,
        attachment_id: int | None = None) -> Attachment:
    """Attach `document` to the user's `message`, under `attachment_id` (None: a new id)."""
    if message.role != "user":
        raise StoreError(f"message {message.id} is a {message.role} message: documents come "
                         "with the user's messages")
    row = document_row(document, now, id=attachment_id,
                       conversation_id=message.conversation_id, message_id=message.id)
    insert(s, row, document)
    return _attachment(row, len(document.chunks))


def document_row(document: NewAttachment, now: datetime, **owner: object) -> AttachmentRow:
    """The row of `document`, owned by what `owner` names (a message, or a folder's file; and
    the id it is kept under, where it has one)."""
    return AttachmentRow(name=document.name, kind=document.kind, size_bytes=document.size_bytes,
                         pages=document.pages, text=document.text, created_at=now,
                         page_starts=json.dumps(document.page_starts) if document.page_starts
                         else None, **owner)


def insert(s: Session, row: AttachmentRow, document: NewAttachment) -> None:
    """Add the document's row and its passages, indexed by both search indexes."""
    s.add(row)
    s.flush()
    rows = [AttachmentChunkRow(attachment_id=row.id, ordinal=c.ordinal, page=c.page,
                               heading=c.heading, start=c.start, text=c.text)
            for c in document.chunks]
    s.add_all(rows)
    s.flush()
    pairs = [{"id": r.id, "grams": g} for r in rows if (g := cjk_grams.indexed_text(r.text))]
    if pairs:
        s.execute(text("INSERT INTO attachment_chunks_cjk(rowid, grams) VALUES (:id, :grams)"),
                  pairs)


def of_conversation(s: Session, cid: int) -> list[Attachment]:
    """Every document attached to the conversation's messages, on any branch, oldest first
    (its folders' files are not: they come with no message)."""
    counts = (select(AttachmentChunkRow.attachment_id, func.count().label("n"))
              .group_by(AttachmentChunkRow.attachment_id).subquery())
    query = (select(AttachmentRow, func.coalesce(counts.c.n, 0))
             .outerjoin(counts, counts.c.attachment_id == AttachmentRow.id)
             .where(AttachmentRow.conversation_id == cid, AttachmentRow.message_id.is_not(None))
             .order_by(AttachmentRow.id))
    return [_attachment(row, n) for row, n in s.execute(query)]


def document_of(s: Session, attachment_id: int, *, with_chunks: bool) -> NewAttachment:
    """The document whole: its text and page starts, and its passages where asked."""
    row = s.get(AttachmentRow, attachment_id)
    if row is None:
        raise StoreError(f"no document has id {attachment_id}")
    return _document(s, row, with_chunks)


def chunks_of(s: Session, attachment_id: int) -> list[AttachmentChunk]:
    query = (select(AttachmentChunkRow).where(AttachmentChunkRow.attachment_id == attachment_id)
             .order_by(AttachmentChunkRow.ordinal))
    return [_chunk(row) for row in s.scalars(query)]


def search(s: Session, attachment_ids: Sequence[int], match: str | None, question: str,
           limit: int, ranked: Sequence[int] = ()) -> list[ChunkHit]:
    """The passages of those documents that match `match` (an FTS5 expression for the trigram
    index) or share character pairs with the Chinese or Japanese of `question`, and those named
    by `ranked` (passage ids, best first: a ranking by meaning), best first: the rankings
    joined by reciprocal rank."""
    if not attachment_ids:
        return []
    if len(match or "") > MAX_QUERY_CHARS:
        raise StoreError(f"a passage search is at most {MAX_QUERY_CHARS} characters")
    limit = min(limit, MAX_HITS)
    rankings = []
    if match:
        rankings.append(_ranked(s, "attachment_chunks_fts", attachment_ids, match, limit))
    pairs = cjk_grams.match_expression(question[:MAX_QUERY_CHARS])
    if pairs:
        rankings.append(_ranked(s, "attachment_chunks_cjk", attachment_ids, pairs, limit))
    if ranked:
        rankings.append(vectors.hits(s, list(ranked)[:MAX_HITS], attachment_ids))
    return _fused(rankings, limit)


def _ranked(s: Session, index: str, attachment_ids: Sequence[int], match: str,
            limit: int) -> list[ChunkHit]:
    ids = ",".join(str(int(i)) for i in attachment_ids)
    rows = s.execute(text(
        "SELECT c.id, c.attachment_id, a.name, c.ordinal, c.page, c.heading, c.start, c.text, "
        f"bm25({index}) AS score FROM {index} "
        f"JOIN attachment_chunks c ON c.id = {index}.rowid "
        "JOIN attachments a ON a.id = c.attachment_id "
        f"WHERE {index} MATCH :match AND c.attachment_id IN ({ids}) "
        "ORDER BY score LIMIT :limit"), {"match": match, "limit": limit})
    return [ChunkHit(cid, aid, name, AttachmentChunk(ordinal, body, page, heading, start), score)
            for cid, aid, name, ordinal, page, heading, start, body, score in rows]


def _fused(rankings: list[list[ChunkHit]], limit: int) -> list[ChunkHit]:
    """One ranking from several: each passage scores the sum of 1 / (60 + its rank) in each
    (reciprocal rank fusion); a single ranking stays as it is."""
    if not rankings:
        return []
    if len(rankings) == 1:
        return rankings[0]
    scores: dict[int, float] = {}
    hits: dict[int, ChunkHit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking):
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + 1 / (60 + rank)
            hits.setdefault(hit.chunk_id, hit)
    best = sorted(scores, key=lambda chunk_id: -scores[chunk_id])[:limit]
    return [hits[chunk_id] for chunk_id in best]


def exported(s: Session, cid: int) -> list[AttachedDocument]:
    """The documents attached to the conversation's messages, whole, as an export holds them
    (its folders' files stay out: they are read from the folders)."""
    rows = s.scalars(select(AttachmentRow).where(AttachmentRow.conversation_id == cid,
                                                 AttachmentRow.message_id.is_not(None))
                     .order_by(AttachmentRow.id))
    return [AttachedDocument(row.message_id, _document(s, row, with_chunks=True), row.id)
            for row in rows]


def _document(s: Session, row: AttachmentRow, with_chunks: bool) -> NewAttachment:
    chunks = tuple(chunks_of(s, row.id)) if with_chunks else ()
    starts = tuple(json.loads(row.page_starts)) if row.page_starts else ()
    return NewAttachment(row.name, row.kind, row.size_bytes, row.text, chunks, row.pages, starts)


def sources_json(citations: Sequence[Citation]) -> str | None:
    return json.dumps([asdict(c) for c in citations], ensure_ascii=False) if citations else None


def sources_of(value: str | None) -> tuple[Citation, ...]:
    return tuple(Citation(**c) for c in json.loads(value)) if value else ()


def _attachment(row: AttachmentRow, num_chunks: int) -> Attachment:
    return Attachment(row.id, row.conversation_id, row.message_id, row.name, row.kind,
                      row.size_bytes, row.pages, num_chunks, row.created_at)


def _chunk(row: AttachmentChunkRow) -> AttachmentChunk:
    return AttachmentChunk(row.ordinal, row.text, row.page, row.heading, row.start)
