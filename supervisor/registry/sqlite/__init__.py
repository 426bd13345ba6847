"""The embedded default registry: one SQLite file in WAL mode (``SqliteRegistry``).

Split by concern: ``_schema`` (migrations as SQL files), ``_store`` (connections, transactions, group commit),
``_rows`` (a row's text forms and the primitives of every change), ``_operations`` (each write in SQL), ``_reads``
(the reads and the outbox), ``_registry`` (the ``Registry`` interface over them, in worker threads), ``_coalesce``
(concurrent writes share a thread hop).
"""

from ._coalesce import Coalescer
from ._registry import SqliteRegistry
from ._schema import SCHEMA_VERSION, migrations, statements
from ._store import BUSY_TIMEOUT_MS, SqliteStore

__all__ = [
    "BUSY_TIMEOUT_MS",
    "SCHEMA_VERSION",
    "Coalescer",
    "SqliteRegistry",
    "SqliteStore",
    "migrations",
    "statements",
]
