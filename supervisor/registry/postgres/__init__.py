"""The registry in a PostgreSQL database (``PostgresRegistry``), chosen by ``PODCAST_JOB_DATABASE_URL``.

Split as the SQLite registry is: ``_backend`` (the transactions a ``Registry`` operation runs in: the pool, the
boundary between Trio and asyncpg; the store port as PostgreSQL's SQL: a row's stored forms, the locks),
``_listen`` (the wake-ups, and the session that hears other hosts'), ``_schema`` (migrations as SQL files),
``_registry`` (``PostgresRegistry``: opening it, migrating it).
"""

from ._backend import DEFAULT_CONNECTIONS, DEFAULT_TIMEOUT_S, redacted
from ._registry import PostgresRegistry
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
