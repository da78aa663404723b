"""Folders a chat answers from: `chat_folders`, and their files kept as attachments that belong
to a folder instead of a message (`folder_id`, `source_path`, and the `mtime_ns` and
`file_size` a file had when read, to tell when it changed).

SQLite cannot make a column nullable in place, so the attachments table is rebuilt (foreign keys
are off while migrating, see migrate.upgrade): every row, id and index is kept, and so is the
AUTOINCREMENT counter; the passages keep pointing at their documents' ids, so their two
search indexes need nothing.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COLUMNS = ("id, conversation_id, message_id, name, kind, size_bytes, pages, page_starts, text, "
           "created_at")

FOLDERS = """CREATE TABLE chat_folders (
    id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL,
    path TEXT NOT NULL,
    added_at DATETIME NOT NULL,
    CONSTRAINT uq_chat_folders_path UNIQUE (conversation_id, path),
    FOREIGN KEY(conversation_id) REFERENCES conversations (id) ON DELETE CASCADE
)"""

TABLE = """CREATE TABLE attachments_new (
    id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL,
    message_id INTEGER{message_null},{folder_columns}
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    pages INTEGER,
    page_starts TEXT,
    text TEXT NOT NULL,
    created_at DATETIME NOT NULL,{owner}
    FOREIGN KEY(conversation_id) REFERENCES conversations (id) ON DELETE CASCADE,
    FOREIGN KEY(message_id) REFERENCES messages (id) ON DELETE CASCADE{folder_key}
)"""
FOLDER_COLUMNS = """
    folder_id INTEGER,
    source_path TEXT,
    mtime_ns INTEGER,
    file_size INTEGER,"""
OWNER = """
    CONSTRAINT ck_attachments_owner CHECK ((message_id IS NULL) != (folder_id IS NULL)),"""
FOLDER_KEY = """,
    FOREIGN KEY(folder_id) REFERENCES chat_folders (id) ON DELETE CASCADE"""

INDEXES = [
    "CREATE INDEX ix_attachments_conversation_id ON attachments (conversation_id)",
    "CREATE INDEX ix_attachments_message_id ON attachments (message_id)",
]
FOLDER_FILE_INDEX = ("CREATE UNIQUE INDEX ix_attachments_folder_file "
                     "ON attachments (folder_id, source_path)")


def _rebuild(table_sql: str, indexes: list[str], where: str = "") -> None:
    """Copy the attachments into a table made by `table_sql` (named attachments_new) and put it
    in the old one's place, with `indexes` and its AUTOINCREMENT counter."""
    op.execute(table_sql)
    op.execute(f"INSERT INTO attachments_new ({COLUMNS}) SELECT {COLUMNS} FROM attachments "
               f"{where}")
    op.execute("INSERT INTO sqlite_sequence (name, seq) SELECT 'attachments_new', seq "
               "FROM sqlite_sequence WHERE name = 'attachments' AND NOT EXISTS "
               "(SELECT 1 FROM sqlite_sequence WHERE name = 'attachments_new')")
    op.execute("UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence "
               "WHERE name = 'attachments')) WHERE name = 'attachments_new'")
    op.execute("DROP TABLE attachments")
    op.execute("ALTER TABLE attachments_new RENAME TO attachments")
    for index in indexes:
        op.execute(index)


def upgrade() -> None:
    op.execute(FOLDERS)
    op.execute("CREATE INDEX ix_chat_folders_conversation_id ON chat_folders (conversation_id)")
    _rebuild(TABLE.format(message_null="", folder_columns=FOLDER_COLUMNS, owner=OWNER,
                          folder_key=FOLDER_KEY), [*INDEXES, FOLDER_FILE_INDEX])


def downgrade() -> None:
    """Back to 0004, where every document comes with a message: refused while a chat has a
    folder, so no chat loses one by going back."""
    held = op.get_bind().exec_driver_sql("SELECT count(*) FROM chat_folders").scalar()
    if held:
        raise RuntimeError(f"{held} folders are in chats, which schema 0004 cannot keep: "
                           "remove them from their chats first")
    _rebuild(TABLE.format(message_null=" NOT NULL", folder_columns="", owner="", folder_key=""),
             INDEXES, where="WHERE message_id IS NOT NULL")
    op.execute("DROP TABLE chat_folders")
