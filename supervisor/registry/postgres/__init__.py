"""The registry in a PostgreSQL database (``PostgresRegistry``), chosen by ``PODCAST_JOB_DATABASE_URL``.

Split as the SQLite registry is: ``_schema`` (migrations as SQL files), ``_rows`` (a row's stored forms and the
primitives of every change), ``_operations`` (each write in SQL), ``_reads`` (the reads and the outbox),
``_registry`` (the ``Registry`` interface: the pool, the transactions, the boundary between Trio and asyncpg).
"""

from ._registry import DEFAULT_CONNECTIONS, DEFAULT_TIMEOUT_S, PostgresRegistry, redacted
from ._schema import SCHEMA_VERSION, migrations

__all__ = [
    "DEFAULT_CONNECTIONS",
    "DEFAULT_TIMEOUT_S",
    "SCHEMA_VERSION",
    "PostgresRegistry",
    "migrations",
    "redacted",
]
