"""The embedded default registry: one SQLite file in WAL mode (``SqliteRegistry``).

Split by concern: ``_schema`` (migrations as SQL files), ``_store`` (connections, transactions, group commit),
``_rows`` (the rules' store as SQL: a row's text forms), ``_registry`` (the rules over them, in worker threads),
``_coalesce`` (concurrent writes share a thread hop).
"""

from ._coalesce import Coalescer
from ._file import BUSY_TIMEOUT_MS, SqliteFile, StandAlone
from ._registry import SqliteRegistry
from ._schema import CONTRACT_LEVEL, SCHEMA_VERSION, migrate, migrate_file, migrations, statements
from ._store import SqliteStore

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
