"""The registry in a PostgreSQL database (``PostgresRegistry``), chosen by ``PODCAST_JOB_DATABASE_URL``.

Split as the SQLite registry is: ``_schema`` (migrations as SQL files), ``_rows`` (the rules' store as SQL: a row's
stored forms, the locks, the wake-ups), ``_registry`` (the rules over them: the pool, the transactions, the boundary
between Trio and asyncpg), ``_listen`` (the session that hears other hosts' wake-ups).
"""

from ._registry import DEFAULT_CONNECTIONS, DEFAULT_TIMEOUT_S, PostgresRegistry, redacted
from ._schema import CONTRACT_LEVEL, SCHEMA_VERSION, migrations

__all__ = [
    "CONTRACT_LEVEL",
    "DEFAULT_CONNECTIONS",
    "DEFAULT_TIMEOUT_S",
    "SCHEMA_VERSION",
    "PostgresRegistry",
    "migrations",
    "redacted",
]
