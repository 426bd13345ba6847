"""A registry file as schema version 3 left it (the last version before the registry's interface): built from
its own migrations with rows and undelivered events in the old format, for the migration tests."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from supervisor.registry import IdentityRecord, hash_token

MIGRATIONS = resources.files("supervisor.registry.sqlite").joinpath("migrations")


def sql(name: str) -> str:
    return MIGRATIONS.joinpath(name).read_text(encoding="utf-8")


def ts(minute: int) -> str:
    """A timestamp as version 3 wrote it (ISO 8601, microseconds, +00:00)."""
    return datetime(2026, 5, 1, 12, minute, 0, 250_000, tzinfo=UTC).isoformat(timespec="microseconds")


def at(minute: int) -> datetime:
    return datetime(2026, 5, 1, 12, minute, 0, 250_000, tzinfo=UTC)


# The rows a version-3 registry held: every status, and each way it recorded a process.
V3_ROWS: list[dict[str, Any]] = [
    {
        "job_id": "done", "kind": "feeds", "params": '{"feed": "a"}', "argv": '["fetch", "a"]', "status": "succeeded",
        "exit_code": 0, "created_at": ts(0), "started_at": ts(1), "ended_at": ts(2), "attempts": 1,
        "boot_id": "boot-old", "pid": 100, "pid_start_time": 5000, "kernel_boot_id": "kb-1", "completed_units": 4,
        "total_units": 4, "last_heartbeat_at": ts(2), "last_progress_at": ts(2), "log_path": "/logs/done.log",
    },
    {
        "job_id": "proc", "kind": "episodes", "params": '{"n": 3}', "argv": '["run"]', "status": "running",
        "created_at": ts(3), "started_at": ts(4), "attempts": 2, "cancel_requested": 1, "boot_id": "boot-old",
        "pid": 4242, "pid_start_time": 123456, "kernel_boot_id": "kb-1", "token_hash": hash_token("proc-token"),
        "completed_units": 3, "total_units": 10, "stage": "episodes", "last_heartbeat_at": ts(9),
        "last_progress_at": ts(8), "log_path": "/logs/proc.log", "stalled": 1, "stalled_since": ts(8), "silent": 1,
    },
    {
        "job_id": "box", "kind": "enrichment", "params": "{}", "argv": '["enrich"]', "status": "running",
        "created_at": ts(5), "started_at": ts(6), "attempts": 1, "boot_id": "boot-old", "container_id": "c0ffee",
        "token_hash": hash_token("box-token"),
    },
    {
        "job_id": "spawning", "kind": "feeds", "params": "{}", "argv": '["fetch"]', "status": "running",
        "created_at": ts(7), "started_at": ts(8), "attempts": 1, "boot_id": "boot-old",
        "token_hash": hash_token("spawning-token"),
    },
    {
        "job_id": "waiting", "kind": "enrichment", "params": '{"x": 1}', "argv": '["enrich", "x"]',
        "status": "queued", "created_at": ts(10), "coalesce_key": "K",
    },
    {
        "job_id": "later", "kind": "feeds", "params": "{}", "argv": '["fetch"]', "status": "queued",
        "created_at": ts(11),
    },
]  # fmt: skip

PROCESS = IdentityRecord("process", {"pid": 4242, "pid_start_time": 123456, "kernel_boot_id": "kb-1"})
CONTAINER = IdentityRecord("container", {"container_id": "c0ffee"})


def old_public(row: dict[str, Any]) -> dict[str, Any]:
    """The public row as version 3 put it in an event's body (the identity columns at the top level)."""
    out = {
        "job_id": row["job_id"], "kind": row["kind"], "params": json.loads(row["params"]),
        "argv": json.loads(row["argv"]), "status": row["status"], "error_reason": row.get("error_reason"),
        "exit_code": row.get("exit_code"), "created_at": row["created_at"], "started_at": row.get("started_at"),
        "ended_at": row.get("ended_at"), "attempts": row.get("attempts", 0),
        "cancel_requested": bool(row.get("cancel_requested")), "boot_id": row.get("boot_id"),
        "completed_units": row.get("completed_units", 0), "total_units": row.get("total_units"),
        "stage": row.get("stage"), "last_heartbeat_at": row.get("last_heartbeat_at"),
        "last_progress_at": row.get("last_progress_at"), "log_path": row.get("log_path"),
        "stalled": bool(row.get("stalled")), "stalled_since": row.get("stalled_since"),
        "silent": bool(row.get("silent")),
    }  # fmt: skip
    for key in ("pid", "pid_start_time", "kernel_boot_id", "container_id"):
        out[key] = row.get(key)
    if row["status"] == "queued":
        out["queue_position"] = None
    return out


def body(event_id: str, event: str, row: dict[str, Any], previous: str | None, reason: str | None, ts: str) -> str:
    body = {
        "event_id": event_id, "event": event, "job": old_public(row), "previous_status": previous,
        "reason": reason, "boot_id": "boot-old", "ts": ts,
    }  # fmt: skip
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


ROW = {r["job_id"]: r for r in V3_ROWS}
# Undelivered events, as version 3 wrote them: the whole body a receiver gets, as one text.
V3_EVENTS = [
    (event_id, job_id, event, ts(minute), body(event_id, event, ROW[job_id], previous, reason, ts(minute)))
    for event_id, job_id, event, minute, previous, reason in [
        ("e-proc-promoted", "proc", "job.transition", 4, "queued", "promoted"),
        ("e-proc-stalled", "proc", "job.stalled", 8, "running", "progress_stalled"),
        ("e-later-enqueued", "later", "job.transition", 11, None, "enqueued"),
    ]
]


def build_v3(path: Path, *, events: list[tuple[str, str, str, str, str]] = V3_EVENTS) -> None:
    """A registry file as version 3 left it: its own migrations (SQLite's own script runner, not the code under
    test), its rows and its undelivered events."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")  # as every registry file has been
        for name in ("0001_jobs.sql", "0002_absence.sql", "0003_outbox.sql"):
            conn.executescript(sql(name))
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (3);"
        )
        for row in V3_ROWS:
            conn.execute(
                f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
            )
        conn.executemany(
            "INSERT INTO outbox (event_id, job_id, event, created_at, body) VALUES (?, ?, ?, ?, ?)", events
        )
        conn.commit()
    finally:
        conn.close()
