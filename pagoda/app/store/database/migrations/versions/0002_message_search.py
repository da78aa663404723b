"""Full-text search over message text: an FTS5 trigram index kept in sync by triggers.

Trigrams match any substring of 3+ characters, so Chinese and Japanese text (no spaces between
words) is searchable. Shorter queries are answered with LIKE by the store.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

STATEMENTS = [
    """CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, content='messages', content_rowid='id', tokenize='trigram'
    )""",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    # Index the messages written before this revision.
    "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    for trigger in ("messages_fts_update", "messages_fts_delete", "messages_fts_insert"):
        op.execute(f"DROP TRIGGER {trigger}")
    op.execute("DROP TABLE messages_fts")
