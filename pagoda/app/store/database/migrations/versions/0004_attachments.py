"""Documents attached to a chat: each file's converted text, its chunks (with their page and
heading) under a trigram FTS5 index for retrieval, and the sources a reply was given.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

FTS_STATEMENTS = [
    """CREATE VIRTUAL TABLE attachment_chunks_fts USING fts5(
        text, content='attachment_chunks', content_rowid='id', tokenize='trigram'
    )""",
    """CREATE TRIGGER attachment_chunks_fts_insert AFTER INSERT ON attachment_chunks BEGIN
        INSERT INTO attachment_chunks_fts(rowid, text) VALUES (new.id, new.text);
    END""",
    """CREATE TRIGGER attachment_chunks_fts_delete AFTER DELETE ON attachment_chunks BEGIN
        INSERT INTO attachment_chunks_fts(attachment_chunks_fts, rowid, text)
            VALUES ('delete', old.id, old.text);
        DELETE FROM attachment_chunks_cjk WHERE rowid = old.id;
    END""",
    # Chinese and Japanese passages as their character pairs (pagoda/app/store/search/cjk_grams.py), written
    # by the store beside each passage; rowid is the passage's id.
    "CREATE VIRTUAL TABLE attachment_chunks_cjk USING fts5(grams, tokenize='unicode61')",
]


def upgrade() -> None:
    op.create_table(
        "attachments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("conversation_id", sa.Integer,
                  sa.ForeignKey("conversations.id", ondelete="CASCADE"), nullable=False),
        sa.Column("message_id", sa.Integer, sa.ForeignKey("messages.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.Integer, nullable=False),
        sa.Column("pages", sa.Integer),
        sa.Column("page_starts", sa.Text),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_attachments_conversation_id", "attachments", ["conversation_id"])
    op.create_index("ix_attachments_message_id", "attachments", ["message_id"])
    op.create_table(
        "attachment_chunks",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("attachment_id", sa.Integer,
                  sa.ForeignKey("attachments.id", ondelete="CASCADE"), nullable=False),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("page", sa.Integer),
        sa.Column("heading", sa.Text),
        sa.Column("start", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_attachment_chunks_attachment_id", "attachment_chunks", ["attachment_id"])
    op.add_column("messages", sa.Column("sources", sa.Text))
    op.execute(FTS_STATEMENTS[-1])
    for statement in FTS_STATEMENTS[:-1]:
        op.execute(statement)


def downgrade() -> None:
    for trigger in ("attachment_chunks_fts_delete", "attachment_chunks_fts_insert"):
        op.execute(f"DROP TRIGGER {trigger}")
    op.execute("DROP TABLE attachment_chunks_fts")
    op.execute("DROP TABLE attachment_chunks_cjk")
    op.drop_column("messages", "sources")
    op.drop_table("attachment_chunks")
    op.drop_table("attachments")
