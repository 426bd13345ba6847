"""The embedded default registry: one SQLite file in WAL mode (``SqliteRegistry``).

Split by concern: ``_schema`` (migrations as SQL files), ``_store`` (connections, transactions, group commit),
``_operations`` (each domain operation in SQL), ``_registry`` (the ``Registry`` interface over them, in threads).
"""

from ._registry import SqliteRegistry
from ._schema import SCHEMA_VERSION
from ._store import BUSY_TIMEOUT_MS, SqliteStore

__all__ = ["BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "SqliteRegistry", "SqliteStore"]
