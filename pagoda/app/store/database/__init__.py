"""The database file: its engine and pragmas, where it lives, one process per file, migrations (Alembic, in migrations/) and crash recovery."""
