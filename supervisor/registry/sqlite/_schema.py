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

from ...domain import RELEASE, RegistryError, from_iso, to_iso, utc_now
from .._sql import (
    CONTRACT,
    EXPAND,
    HostRecord,
    Migration,
    contract_level,
    contract_refused,
    held_back_by,
    level_of,
    load_migrations,
    plan,
    refuse_contracted,
    require_expanded,
)


def migrations() -> list[Migration]:
    """Every migration shipped with this package, in order."""
    return load_migrations(__package__ or "")


SCHEMA_VERSION = max(m.version for m in migrations())
CONTRACT_LEVEL = contract_level(migrations())  # what this release honours (recorded with each host's lease)


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


def migrate(conn: sqlite3.Connection, path: Path, *, contracts: bool = False) -> int:
    """Bring the file up to this release's schema; its version (the highest number applied) after. Each migration not
    yet applied, in order (``schema_migrations`` records each one, its phase too); a new file takes them all. An
    existing one takes the expands up to the first contract migration, which waits for ``contracts`` (``supervisor
    migrate``) and for every host to honour it (INV-CONTRACT-AFTER-FLEET). A file a newer release contracted is
    refused (``SchemaNotHonoured``); one it only expanded is used as it is."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "phase TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        # A file of a release before 1.0.0 recorded only its version: every migration up to it was applied (expands).
        if not conn.execute("SELECT 1 FROM schema_migrations LIMIT 1").fetchone():
            conn.executemany(
                "INSERT INTO schema_migrations (version, name, phase, applied_at) VALUES (?, ?, ?, ?)",
                [(v, f"{v:04d}", EXPAND, to_iso(utc_now())) for v in range(1, _version(conn) + 1)],
            )
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    known = migrations()
    schema = plan(known, _applied(conn))
    refuse_contracted(schema, str(path), RELEASE)
    for migration in schema.next_batch(contracts=contracts):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another process may have applied it meanwhile.
            if migration.version not in _applied(conn):
                if migration.phase == CONTRACT:
                    level = level_of(known, migration)
                    holders = held_back_by(_hosts(conn), level)
                    if holders:
                        raise contract_refused(migration, level, holders, str(path))
                for statement in statements(migration.script):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, phase, applied_at) VALUES (?, ?, ?, ?)",
                    (migration.version, migration.name, migration.phase, to_iso(utc_now())),
                )
                # What a release before 1.0.0 reads (it refuses any version above its own).
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version (version) SELECT MAX(version) FROM schema_migrations")
            conn.execute("COMMIT")
        except BaseException as exc:
            _rollback(conn)
            if isinstance(exc, sqlite3.Error):
                raise RegistryError(f"registry {path}: migration {migration.name} failed: {exc}") from exc
            raise
    require_expanded(plan(known, _applied(conn)), str(path))
    return _version(conn)


def pending_contracts(conn: sqlite3.Connection) -> list[str]:
    """This release's contract migrations not applied to the file yet (what ``supervisor migrate`` would apply)."""
    return [m.name for m in plan(migrations(), _applied(conn)).pending if m.phase == CONTRACT]


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _applied(conn: sqlite3.Connection) -> dict[int, str]:
    return {int(v): str(p) for v, p in conn.execute("SELECT version, phase FROM schema_migrations")}


def _hosts(conn: sqlite3.Connection) -> list[HostRecord]:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(hosts)")}
    if not columns:
        return []
    recorded = "release_version, contract_level" if "release_version" in columns else "NULL, NULL"
    now = utc_now()
    rows = conn.execute(
        f"SELECT host_id, {recorded}, lease_expires_at, (SELECT COUNT(*) FROM jobs WHERE jobs.host_id = hosts.host_id "
        "AND jobs.status = 'running') FROM hosts"
    ).fetchall()
    return [HostRecord(h, release, level, from_iso(expires) > now, n) for h, release, level, expires, n in rows]


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return 0 if row is None else int(row[0])


def migrate_file(path: Path, *, busy_timeout_ms: int) -> int:
    """``supervisor migrate`` on a file (opened and checked by a ``SqliteRegistry`` first): its contract migrations
    too, each once no host holds it back. Blocking: a worker thread's."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000)
    try:
        return migrate(conn, path, contracts=True)
    except sqlite3.Error as exc:
        raise RegistryError(f"registry {path}: {exc}") from exc
    finally:
        conn.close()
