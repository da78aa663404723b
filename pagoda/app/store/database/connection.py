"""SQLAlchemy engines over SQLite with the pragmas and transaction mode the store relies on."""

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import NullPool

BUSY_TIMEOUT_S = 30.0
# Read sessions use a deferred BEGIN so the GUI never queues behind a writer (WAL readers
# see the last commit); write sessions take the write lock up front so they wait on the busy
# timeout instead of failing with "database is locked" when upgrading a read lock.
BEGIN_OPTION = "pagoda_begin"


def create_store_engine(path: Path, *, foreign_keys: bool = True, pooled: bool = True) -> Engine:
    pool = {} if pooled else {"poolclass": NullPool}
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
        **pool,
    )
    event.listen(engine, "connect", _configure_connection(foreign_keys))
    event.listen(engine, "begin", _begin)
    return engine


def read_only(engine: Engine) -> Engine:
    return engine.execution_options(**{BEGIN_OPTION: "DEFERRED"})


def _configure_connection(foreign_keys: bool):
    def configure(dbapi_connection, _record) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN instead of pysqlite's implicit one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        cursor.close()

    return configure


def _begin(connection) -> None:
    mode = connection.get_execution_options().get(BEGIN_OPTION, "IMMEDIATE")
    connection.exec_driver_sql(f"BEGIN {mode}")
