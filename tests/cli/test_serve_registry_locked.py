"""A start that meets the SQLite registry locked by another process (a backup, an operator's ``sqlite3`` shell) waits
out the busy timeout, then exits 75 (EX_TEMPFAIL) in one line: a temporary condition, not the configuration's exit 3,
so a unit restarts it and an operator starts it again (docs/operations.md, "Running")."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from test_cli_serve import cli_env, run_cli

from supervisor import SqliteRegistry
from supervisor.cli import EXIT_TEMPFAIL


async def test_a_registry_locked_by_another_process_at_start_is_exit_75_in_one_line(tmp_path: Path) -> None:
    registry = tmp_path / "data" / ".viewer" / "jobs.sqlite3"
    registry.parent.mkdir(parents=True)
    SqliteRegistry(registry).close()
    before = registry.read_bytes()
    with contextlib.closing(sqlite3.connect(registry, isolation_level=None)) as other:
        other.execute("BEGIN EXCLUSIVE")  # as a backup or a shell holds it, in another process than serve's
        done = await run_cli(["serve"], cli_env(tmp_path, PODCAST_JOB_BIND="127.0.0.1:0"), tmp_path)
        other.execute("ROLLBACK")
    lines = done.stderr.decode().splitlines()
    assert done.returncode == EXIT_TEMPFAIL, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "database is locked" in lines[0], lines
    assert registry.read_bytes() == before
