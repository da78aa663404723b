"""Passages' vectors (from an embeddings server, one row per passage and model) in the database,
and the passages a vector ranking names: functions of a session, as attachments.py's."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import StoreError
from ..records import AttachmentChunk, ChunkHit
from ..schema import AttachmentChunkRow, AttachmentRow, ChunkVectorRow

MAX_MODEL_CHARS = 512
MAX_VECTOR_BYTES = 4 * 16_384  # float32, the widest vector an embeddings answer may hold
MAX_ROWS = 256  # vectors written at once


def missing(s: Session, attachment_id: int, model: str, limit: int) -> list[tuple[int, str]]:
    """Up to `limit` (id, text) of the document's passages with no vector from `model`, in
    order."""
    query = (select(AttachmentChunkRow.id, AttachmentChunkRow.text)
             .outerjoin(ChunkVectorRow, (ChunkVectorRow.chunk_id == AttachmentChunkRow.id)
                        & (ChunkVectorRow.model == model))
             .where(AttachmentChunkRow.attachment_id == attachment_id,
                    ChunkVectorRow.chunk_id.is_(None))
             .order_by(AttachmentChunkRow.ordinal).limit(max(0, min(limit, MAX_ROWS))))
    return [(chunk_id, body) for chunk_id, body in s.execute(query)]


def add(s: Session, model: str, rows: Sequence[tuple[int, bytes]]) -> None:
    """Keep each passage's vector (float32 bytes) from `model`, replacing an earlier one."""
    _check_model(model)
    if len(rows) > MAX_ROWS:
        raise StoreError(f"at most {MAX_ROWS} vectors are written at once, not {len(rows)}")
    for chunk_id, vector in rows:
        if not 0 < len(vector) <= MAX_VECTOR_BYTES or len(vector) % 4:
            raise StoreError(f"passage {chunk_id}'s vector is {len(vector)} bytes: not float32 "
                             f"numbers, at most {MAX_VECTOR_BYTES // 4:,}")
        if s.get(AttachmentChunkRow, chunk_id) is None:
            raise StoreError(f"no passage has id {chunk_id}")
        s.merge(ChunkVectorRow(chunk_id=chunk_id, model=model, vector=bytes(vector)))


def of_document(s: Session, attachment_id: int, model: str) -> list[tuple[int, bytes]]:
    """(passage id, vector) of the document's passages that `model` has embedded."""
    query = (select(ChunkVectorRow.chunk_id, ChunkVectorRow.vector)
             .join(AttachmentChunkRow, AttachmentChunkRow.id == ChunkVectorRow.chunk_id)
             .where(AttachmentChunkRow.attachment_id == attachment_id,
                    ChunkVectorRow.model == model)
             .order_by(AttachmentChunkRow.ordinal))
    return [(chunk_id, vector) for chunk_id, vector in s.execute(query)]


def hits(s: Session, chunk_ids: Sequence[int], attachment_ids: Sequence[int]) -> list[ChunkHit]:
    """The passages `chunk_ids` names (those of `attachment_ids` only), in that order: a vector
    ranking as hits to join with bm25's. Their score is their rank."""
    if not chunk_ids:
        return []
    query = (select(AttachmentChunkRow, AttachmentRow.name)
             .join(AttachmentRow, AttachmentRow.id == AttachmentChunkRow.attachment_id)
             .where(AttachmentChunkRow.id.in_(list(chunk_ids)),
                    AttachmentChunkRow.attachment_id.in_(list(attachment_ids))))
    found = {row.id: (row, name) for row, name in s.execute(query)}
    return [ChunkHit(chunk_id, row.attachment_id, name,
                     AttachmentChunk(row.ordinal, row.text, row.page, row.heading, row.start),
                     float(rank))
            for rank, chunk_id in enumerate(chunk_ids) if chunk_id in found
            for row, name in [found[chunk_id]]]


def _check_model(model: str) -> None:
    if not model or len(model) > MAX_MODEL_CHARS:
        raise StoreError(f"an embedding model's name is 1 to {MAX_MODEL_CHARS} characters")
