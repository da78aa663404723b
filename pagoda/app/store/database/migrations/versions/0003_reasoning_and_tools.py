"""Reasoning and tool calls: an assistant's thinking kept apart from its answer, the calls its
reply made, and "tool" messages holding what a call returned.

SQLite cannot change a CHECK constraint in place, so the messages table is rebuilt (foreign keys
are off while migrating, see migrate.upgrade): every row, id, index and search trigger is kept,
and so is the AUTOINCREMENT counter, so a deleted message's id is never handed out again.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

COLUMNS = ("id, conversation_id, parent_id, role, content, created_at, status, finish_reason, "
           "error, prompt_tokens, completion_tokens, gen_model, ttft_s, tokens_per_s, "
           "cached_tokens")

TABLE = """CREATE TABLE {name} (
    id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL,
    parent_id INTEGER,
    role VARCHAR(16) NOT NULL,
    content TEXT DEFAULT '' NOT NULL,
    created_at DATETIME NOT NULL,
    status VARCHAR(16) DEFAULT 'complete' NOT NULL,
    finish_reason TEXT,
    error TEXT,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    gen_model TEXT,
    ttft_s FLOAT,
    tokens_per_s FLOAT,
    cached_tokens INTEGER,{extra}
    CONSTRAINT ck_messages_role CHECK (role IN ({roles})),
    CONSTRAINT ck_messages_status CHECK (status IN ('complete', 'streaming', 'interrupted', 'error')),
    FOREIGN KEY(conversation_id) REFERENCES conversations (id) ON DELETE CASCADE,
    FOREIGN KEY(parent_id) REFERENCES messages (id) ON DELETE CASCADE
)"""
NEW_COLUMNS = """
    reasoning TEXT,
    reasoning_s FLOAT,
    tool_calls TEXT,
    tool_call_id TEXT,
    tool_name TEXT,"""

TRIGGERS = [
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
]


def _rebuild(table_sql: str, where: str = "") -> None:
    """Copy the messages into a table made by `table_sql` (named messages_new) and put it in the
    old one's place, with its indexes, triggers and AUTOINCREMENT counter."""
    for trigger in ("messages_fts_update", "messages_fts_delete", "messages_fts_insert"):
        op.execute(f"DROP TRIGGER {trigger}")
    op.execute(table_sql)
    op.execute(f"INSERT INTO messages_new ({COLUMNS}) SELECT {COLUMNS} FROM messages {where}")
    op.execute("INSERT INTO sqlite_sequence (name, seq) SELECT 'messages_new', seq "
               "FROM sqlite_sequence WHERE name = 'messages' AND NOT EXISTS "
               "(SELECT 1 FROM sqlite_sequence WHERE name = 'messages_new')")
    op.execute("UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence "
               "WHERE name = 'messages')) WHERE name = 'messages_new'")
    op.execute("DROP TABLE messages")
    op.execute("ALTER TABLE messages_new RENAME TO messages")
    op.execute("CREATE INDEX ix_messages_conversation_id ON messages (conversation_id)")
    op.execute("CREATE INDEX ix_messages_parent_id ON messages (parent_id)")
    for trigger in TRIGGERS:
        op.execute(trigger)


def upgrade() -> None:
    _rebuild(TABLE.format(name="messages_new", extra=NEW_COLUMNS,
                          roles="'system', 'user', 'assistant', 'tool'"))


def downgrade() -> None:
    """Back to 0002, which has no room for reasoning, calls or tool messages: refused while any
    message holds one, so nothing is lost by going back."""
    query = ("SELECT count(*) FROM messages WHERE role = 'tool' OR reasoning IS NOT NULL "
             "OR tool_calls IS NOT NULL")
    held = op.get_bind().exec_driver_sql(query).scalar()
    if held:
        raise RuntimeError(f"{held} messages hold reasoning or tool calls, which schema 0002 "
                           "cannot keep: export the chats first")
    _rebuild(TABLE.format(name="messages_new", extra="", roles="'system', 'user', 'assistant'"))
