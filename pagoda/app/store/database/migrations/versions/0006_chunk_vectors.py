"""Passages' vectors from an embeddings server (one row per passage and embedding model), for
retrieval that joins their cosine ranking with bm25's.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chunk_vectors",
        sa.Column("chunk_id", sa.Integer,
                  sa.ForeignKey("attachment_chunks.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("model", sa.Text, primary_key=True),
        sa.Column("vector", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("chunk_vectors")
