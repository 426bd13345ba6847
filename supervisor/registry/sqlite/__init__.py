"""The embedded default registry: one SQLite file in WAL mode (``SqliteRegistry``).

Split by concern: ``_backend`` (the transactions a ``Registry`` operation runs in: the thread hop shared by
concurrent writes, the group commit, the store port as SQLite's SQL), ``_file`` (the file's checks at open, its
connection pool), ``_schema`` (migrations as SQL files), ``_registry`` (``SqliteRegistry``: opening it).
"""

from ._backend import Coalescer, SqliteFile, SqliteStore, StandAlone
from ._file import BUSY_TIMEOUT_MS
from ._registry import SqliteRegistry
from ._schema import CONTRACT_LEVEL, SCHEMA_VERSION, migrate, migrate_file, migrations, statements

__all__ = [
    "BUSY_TIMEOUT_MS",
    "CONTRACT_LEVEL",
    "SCHEMA_VERSION",
    "Coalescer",
    "SqliteFile",
    "SqliteRegistry",
    "SqliteStore",
    "StandAlone",
    "migrate",
    "migrate_file",
    "migrations",
    "statements",
]
