"""Images that come with a user's message (issue 57): their bytes as given, their size, their
order; deleted with their message.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "message_images",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("message_id", sa.Integer, sa.ForeignKey("messages.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("mime_type", sa.Text, nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_message_images_message_id", "message_images", ["message_id"])


def downgrade() -> None:
    """Back to 0006, which has no images: refused while a message holds one, so no chat loses
    its images by going back."""
    held = op.get_bind().exec_driver_sql("SELECT count(*) FROM message_images").scalar()
    if held:
        raise RuntimeError(f"{held} images are kept with messages, which schema 0006 cannot "
                           "keep: delete their chats first")
    op.drop_index("ix_message_images_message_id", "message_images")
    op.drop_table("message_images")
