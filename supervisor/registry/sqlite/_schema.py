"""The registry's schema: migrations as SQL files (``migrations/NNNN_name.sql``), applied in order at open.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction together with the new ``schema_version``, so a
crash or an error leaves the file at the version before it, never half-migrated; two processes opening the same
file at once take turns (the version is read again under the write lock). A script is cut into statements by
SQLite's own tokenizer (``sqlite3.complete_statement``), never by splitting its text on ``;``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from ...domain import RegistryError
from .._sql import Migration, load_migrations


def migrations() -> list[Migration]:
    """Every migration shipped with this package, in order."""
    return load_migrations(__package__ or "")


SCHEMA_VERSION = len(migrations())


def statements(script: str) -> Iterator[str]:
    """The statements of ``script``, each ending at a ``;`` that SQLite says completes one (not one inside a
    string, a comment or a trigger's body). Comments and empty statements between them are no statements."""
    start = 0
    for end in (i + 1 for i, ch in enumerate(script) if ch == ";"):
        piece = script[start:end]
        if sqlite3.complete_statement(piece):
            if not _blank(piece[:-1]):
                yield piece
            start = end
    if not _blank(script[start:]):
        raise RegistryError(f"a migration ends with an incomplete statement: {script[start:].strip()[:80]!r}")


# Whitespace, ``;`` and comments (``--`` to the end of the line, ``/* */``, which an unterminated one ends at the end
# of the text, as SQLite reads it): what may stand between statements.
_BLANK = re.compile(r"(?:\s|;|--[^\n]*(?:\n|\Z)|/\*.*?(?:\*/|\Z))*", re.DOTALL)


def _blank(text: str) -> bool:
    """``text`` holds no statement. Read from its start, so a ``--`` or ``/*`` inside a string never counts: the
    string itself is not blank."""
    return _BLANK.fullmatch(text) is not None


def migrate(conn: sqlite3.Connection, path: Path) -> int:
    """Bring the file to ``SCHEMA_VERSION``; its version after. Refuses a file newer than this code."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    for migration in migrations():
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _version(conn)
            if version > SCHEMA_VERSION:
                raise RegistryError(
                    f"registry {path} has schema version {version}, newer than this supervisor ({SCHEMA_VERSION})"
                )
            if version < migration.version:
                for statement in statements(migration.script):
                    conn.execute(statement)
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (migration.version,))
            conn.execute("COMMIT")
        except BaseException as exc:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if isinstance(exc, sqlite3.Error):
                raise RegistryError(f"registry {path}: migration {migration.name} failed: {exc}") from exc
            raise
    return _version(conn)


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return 0 if row is None else int(row[0])
