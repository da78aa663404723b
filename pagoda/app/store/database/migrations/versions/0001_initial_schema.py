"""Initial schema: conversations, the message tree, current leaves, settings, open tabs.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("title", sa.Text),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("model", sa.Text),
        sa.Column("system_prompt", sa.Text),
        sa.Column("sampling", sa.Text, nullable=False),
        sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("archived", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("deleted_at", sa.DateTime),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_conversations_updated_at", "conversations", ["updated_at"])
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "conversation_id",
            sa.Integer,
            sa.ForeignKey("conversations.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("parent_id", sa.Integer, sa.ForeignKey("messages.id", ondelete="CASCADE")),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="complete"),
        sa.Column("finish_reason", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("prompt_tokens", sa.Integer),
        sa.Column("completion_tokens", sa.Integer),
        sa.Column("gen_model", sa.Text),
        sa.Column("ttft_s", sa.Float),
        sa.Column("tokens_per_s", sa.Float),
        sa.Column("cached_tokens", sa.Integer),
        sa.CheckConstraint("role IN ('system', 'user', 'assistant')", name="ck_messages_role"),
        sa.CheckConstraint(
            "status IN ('complete', 'streaming', 'interrupted', 'error')", name="ck_messages_status"
        ),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_messages_conversation_id", "messages", ["conversation_id"])
    op.create_index("ix_messages_parent_id", "messages", ["parent_id"])
    op.create_table(
        "conversation_leaves",
        sa.Column(
            "conversation_id",
            sa.Integer,
            sa.ForeignKey("conversations.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "message_id",
            sa.Integer,
            sa.ForeignKey("messages.id", ondelete="CASCADE"),
            nullable=False,
        ),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "open_tabs",
        sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column(
            "conversation_id",
            sa.Integer,
            sa.ForeignKey("conversations.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("active", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    for table in ("open_tabs", "settings", "conversation_leaves", "messages", "conversations"):
        op.drop_table(table)
