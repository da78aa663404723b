"""Alembic environment: runs on the connection the store hands over in `config.attributes`."""

from alembic import context

from pagoda.app.store.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through pagoda.app.store.database.migrate, which supplies a connection")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
