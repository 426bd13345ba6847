"""The SQLite registry's rows: the rules' ``Store`` (``_engine.Store``) as SQL on one connection, inside the transaction
that ``_store.SqliteStore`` runs it in. Blocking code, in worker threads only: its coroutines never suspend
(``_engine.run_now`` runs them there).

The rows' text forms live here and nowhere else: timestamps as ISO 8601 text (``to_iso``), booleans as 0/1, params,
argv, the identity record and the history as JSON.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from ...domain import Job, JobStatus
from ...domain._model import from_iso, to_iso
from .._engine import LocalStore, Page
from .._protocol import FleetSetting, Host, NewJob, OutboxEvent, PauseState, PrunedJob, PruneResult, Receipt
from .._sql import COLUMNS, FINISHED, HOST_COLUMNS, KEY_COLUMNS, OUTBOX_COLUMNS, column, json_value
from .._sql import receipts as read_receipts
from .._sql import row_to_job as job_from_row


def _ts(text: str | None) -> datetime | None:
    return from_iso(text) if text is not None else None


def stored(value: object) -> object:
    """A domain value in the form a column keeps it."""
    if isinstance(value, datetime):
        return to_iso(value)
    if isinstance(value, bool):
        return int(value)
    return json_value(value)


def row_to_job(row: sqlite3.Row, queue_position: int | None = None) -> Job:
    return job_from_row(row, _ts, queue_position)


def _host(row: sqlite3.Row, now: datetime) -> Host:
    return Host(row[0], row[1], from_iso(row[2]), from_iso(row[3]), from_iso(row[4]), as_of=now)


class SqliteRows(LocalStore):
    """The rules' store on ``conn`` (see ``_engine.Store``). ``boot_id``: written into each event."""

    def __init__(self, conn: sqlite3.Connection, *, clock: Callable[[], datetime], boot_id: str | None) -> None:
        self.conn = conn
        self.clock = clock
        self.boot_id = boot_id

    def _one(self, sql: str, *args: Any) -> Any:
        return self.conn.execute(sql, args).fetchone()

    # -- jobs ---------------------------------------------------------------------------------------------

    async def job(self, job_id: str, *, lock: bool = False, position: bool = False) -> Job | None:
        row = self._one(f"SELECT {COLUMNS} FROM jobs WHERE job_id = ?", job_id)
        if row is None:
            return None
        queued = position and row["status"] == JobStatus.QUEUED
        at = (
            self._one("SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND seq <= ?", row["seq"])[0]
            if queued
            else None
        )
        return row_to_job(row, at)

    async def jobs(self, job_ids: Sequence[str]) -> list[Job]:
        marks = ",".join("?" * len(job_ids))
        rows = {
            r["job_id"]: r for r in self.conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE job_id IN ({marks})", job_ids)
        }
        return [row_to_job(rows[job_id]) for job_id in job_ids]

    async def running(self) -> list[Job]:
        """Every RUNNING row (the status index: O(running rows))."""
        return [
            row_to_job(r)
            for r in self.conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE status = 'running' ORDER BY seq")
        ]

    async def running_counts(self, host_id: str | None) -> tuple[int, int]:
        sql = "SELECT COUNT(*), COUNT(*) FILTER (WHERE host_id IS ?) FROM jobs WHERE status = 'running'"
        running, here = self._one(sql, host_id)
        return running, here

    async def promotable(self, now: datetime, limit: int, *, lock: bool = False) -> list[Job]:
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE status = 'queued' AND (not_before IS NULL OR not_before <= ?) "
            "ORDER BY seq LIMIT ?",
            (to_iso(now), limit),
        )
        return [row_to_job(r) for r in rows]

    async def next_backoff_end(self, now: datetime) -> datetime | None:
        return _ts(
            self._one("SELECT MIN(not_before) FROM jobs WHERE status = 'queued' AND not_before > ?", to_iso(now))[0]
        )

    async def queued_with_key(self, key: str) -> str | None:
        row = self._one(
            "SELECT job_id FROM jobs WHERE status = 'queued' AND coalesce_key = ? ORDER BY seq LIMIT 1", key
        )
        return None if row is None else str(row[0])

    async def insert(self, job: NewJob, now: datetime) -> str:
        job_id = uuid.uuid4().hex
        self.conn.execute(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, coalesce_key, max_attempts, retry_of, "
            "idempotency_key, enqueued_by) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?)",
            (job_id, job.kind, json.dumps(dict(job.params), sort_keys=True), json.dumps(list(job.argv)), to_iso(now),
             job.coalesce_key, job.max_attempts, job.retry_of, job.idempotency_key, job.enqueued_by),
        )  # fmt: skip
        return job_id

    async def receipts(self, key: str, now: datetime) -> tuple[str, list[Receipt]] | None:
        sql = (
            f"SELECT {KEY_COLUMNS} FROM idempotency_keys WHERE idempotency_key = ? AND expires_at > ? "
            "ORDER BY answer_index"
        )
        return read_receipts(self.conn.execute(sql, (key, to_iso(now))).fetchall())

    async def put_receipts(
        self, key: str, fingerprint: str, receipts: Sequence[Receipt], now: datetime, expires_at: datetime
    ) -> None:
        self.conn.execute("DELETE FROM idempotency_keys WHERE idempotency_key = ?", (key,))  # only expired rows remain
        self.conn.executemany(
            f"INSERT INTO idempotency_keys (idempotency_key, answer_index, {KEY_COLUMNS}, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(key, i, fingerprint, r.job_id, str(r.status), r.queue_position, int(r.coalesced), to_iso(now),
              to_iso(expires_at)) for i, r in enumerate(receipts)],
        )  # fmt: skip

    async def drop_expired_keys(self, now: datetime, limit: int) -> int:
        sql = (
            "DELETE FROM idempotency_keys WHERE idempotency_key IN (SELECT idempotency_key FROM idempotency_keys "
            "WHERE expires_at <= ? LIMIT ?)"
        )
        return self.conn.execute(sql, (to_iso(now), limit)).rowcount

    async def update(self, job_id: str, fields: Mapping[str, object], *, status: JobStatus | None = None) -> int:
        columns = ", ".join(f"{column(name)} = ?" for name in fields)
        guard = " AND status = ?" if status is not None else ""
        args = [stored(value) for value in fields.values()] + [job_id] + ([str(status)] if status is not None else [])
        return self.conn.execute(f"UPDATE jobs SET {columns} WHERE job_id = ?{guard}", args).rowcount

    async def add_event(
        self, job_id: str, body: Mapping[str, Any], event: str, previous: str | None, reason: str | None
    ) -> None:
        self.conn.execute(
            "INSERT INTO outbox (event_id, job_id, event, created_at, previous_status, reason, boot_id, job) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (uuid.uuid4().hex, job_id, event, to_iso(self.now()), previous, reason, self.boot_id,
             json.dumps(body, sort_keys=True, separators=(",", ":"))),
        )  # fmt: skip

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        self.conn.execute("SAVEPOINT step")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK TO step")
            raise
        finally:
            self.conn.execute("RELEASE step")

    # -- the pause ----------------------------------------------------------------------------------------

    async def pause(self, *, lock: bool = False) -> PauseState:
        row = self._one("SELECT paused, paused_by, paused_at FROM queue_state")
        return PauseState(True, row["paused_by"], _ts(row["paused_at"])) if row["paused"] else PauseState(False)

    async def set_pause(self, state: PauseState) -> None:
        at = to_iso(state.since) if state.since is not None else None
        self.conn.execute(
            "UPDATE queue_state SET paused = ?, paused_by = ?, paused_at = ?", (int(state.paused), state.by, at)
        )

    # -- the fleet ----------------------------------------------------------------------------------------

    async def hosts(self, now: datetime) -> list[Host]:
        return [_host(r, now) for r in self.conn.execute(f"SELECT {HOST_COLUMNS} FROM hosts ORDER BY host_id")]

    async def leader(self, now: datetime) -> Host | None:
        """The lead's holder (its ``started_at``: since when it leads)."""
        row = self._one("SELECT host_id, boot_id, since, last_seen_at, lease_expires_at FROM leader")
        return None if row is None else _host(row, now)

    async def put_host(self, host: Host, *, new: bool) -> None:
        args = [
            stored(v) for v in (host.host_id, host.boot_id, host.started_at, host.last_seen_at, host.lease_expires_at)
        ]
        if new:
            self.conn.execute(f"INSERT OR REPLACE INTO hosts ({HOST_COLUMNS}) VALUES (?, ?, ?, ?, ?)", args)
        else:
            self.conn.execute(
                "UPDATE hosts SET last_seen_at = ?, lease_expires_at = ? WHERE host_id = ?", (*args[3:], host.host_id)
            )

    async def put_leader(self, host: Host | None, *, only: tuple[str, str] | None = None) -> None:
        if host is None:
            where = " WHERE host_id = ? AND boot_id = ?" if only is not None else ""
            self.conn.execute(f"DELETE FROM leader{where}", only or ())
            return
        self.conn.execute(
            "INSERT OR REPLACE INTO leader (one, host_id, boot_id, since, last_seen_at, lease_expires_at) "
            "VALUES (1, ?, ?, ?, ?, ?)",
            [
                stored(v)
                for v in (host.host_id, host.boot_id, host.started_at, host.last_seen_at, host.lease_expires_at)
            ],
        )

    async def fenced(self, host_id: str, boot_id: str) -> bool:
        return (
            self._one("SELECT 1 FROM forgotten_hosts WHERE host_id = ? AND boot_id = ?", host_id, boot_id) is not None
        )

    async def fence(self, host: Host, now: datetime) -> None:
        self.conn.execute(
            "INSERT INTO forgotten_hosts (host_id, boot_id, forgotten_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (host.host_id, host.boot_id, to_iso(now)),
        )

    async def drop_host(self, host_id: str) -> None:
        self.conn.execute("DELETE FROM hosts WHERE host_id = ?", (host_id,))
        self.conn.execute("DELETE FROM leader WHERE host_id = ?", (host_id,))

    async def setting(self, name: str) -> FleetSetting | None:
        row = self._one("SELECT name, value, host_id, recorded_at FROM fleet_settings WHERE name = ?", name)
        return None if row is None else FleetSetting(row[0], row[1], row[2], from_iso(row[3]))

    async def put_setting(self, setting: FleetSetting) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO fleet_settings (name, value, host_id, recorded_at) VALUES (?, ?, ?, ?)",
            (setting.name, setting.value, setting.host_id, to_iso(setting.recorded_at)),
        )

    # -- retention and the outbox -------------------------------------------------------------------------

    async def finished_edge(self, keep_latest: int) -> tuple[datetime, int] | None:
        sql = f"SELECT ended_at, seq FROM jobs WHERE {FINISHED} ORDER BY ended_at DESC, seq DESC LIMIT 1 OFFSET ?"
        row = self._one(sql, keep_latest)
        return None if row is None else (from_iso(row[0]), row[1])

    async def prunable(
        self, ended_before: datetime | None, edge: tuple[datetime, int] | None, limit: int, *, lock: bool
    ) -> list[PrunedJob]:
        rules: list[str] = []
        args: list[object] = []
        if ended_before is not None:
            rules.append("ended_at < ?")
            args.append(to_iso(ended_before))
        if edge is not None:
            rules.append("(ended_at, seq) <= (?, ?)")
            args += [to_iso(edge[0]), edge[1]]
        rows = self.conn.execute(
            f"SELECT job_id, kind, status, ended_at, log_path, attempts FROM jobs AS j WHERE {FINISHED} "
            f"AND ({' OR '.join(rules)}) AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id) "
            "AND NOT EXISTS (SELECT 1 FROM idempotency_keys AS k WHERE k.job_id = j.job_id AND k.expires_at > ?) "
            "ORDER BY ended_at, seq LIMIT ?",
            (*args, to_iso(self.now()), limit),
        )
        return [PrunedJob(r[0], r[1], JobStatus(r[2]), from_iso(r[3]), r[4], r[5]) for r in rows]

    async def delete_finished(self, job_ids: Sequence[str]) -> set[str]:
        """(The write transaction holds the outbox too: no event is written between the choice and this.)"""
        self.conn.execute(f"DELETE FROM jobs WHERE job_id IN ({','.join('?' * len(job_ids))})", job_ids)
        return set(job_ids)

    async def outbox_stats(self) -> tuple[int, datetime | None]:
        count, oldest = self._one("SELECT COUNT(*), MIN(created_at) FROM outbox")
        return count, _ts(oldest)

    async def outbox_drop(self, older_than: datetime, max_events: int) -> PruneResult:
        by_age = self.conn.execute("DELETE FROM outbox WHERE created_at < ?", (to_iso(older_than),)).rowcount
        excess = self._one("SELECT COUNT(*) FROM outbox")[0] - max_events
        by_count = 0
        if excess > 0:
            sql = "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?)"
            by_count = self.conn.execute(sql, (excess,)).rowcount
        return PruneResult(by_age, by_count)

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        rows = self.conn.execute(f"SELECT {OUTBOX_COLUMNS} FROM outbox ORDER BY seq LIMIT ?", (limit,))
        return [OutboxEvent(r[0], r[1], r[2], r[3], from_iso(r[4]), r[5], r[6], r[7], json.loads(r[8])) for r in rows]

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        self.conn.execute(f"DELETE FROM outbox WHERE seq IN ({','.join('?' * len(seqs))})", list(seqs))

    # -- reads --------------------------------------------------------------------------------------------

    async def list_page(self, page: Page) -> tuple[list[Job], str | None]:
        clauses: list[str] = []
        args: list[object] = []
        for clause, value in (("seq < ?", page.before), ("status = ?", page.status), ("kind = ?", page.kind)):
            if value is not None:
                clauses.append(clause)
                args.append(value)
        if page.idempotency_key is not None:
            clauses.append(
                "job_id IN (SELECT job_id FROM idempotency_keys WHERE idempotency_key = ? AND expires_at > ?)"
            )
            args += [page.idempotency_key, to_iso(self.now())]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT ?", (*args, page.limit + 1)
        ).fetchall()
        found = rows[: page.limit]
        positions: dict[int, int] = {}
        queued = [r["seq"] for r in found if r["status"] == JobStatus.QUEUED]
        if queued:
            sql = "SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) FROM jobs WHERE status = 'queued' AND seq <= ?"
            positions = dict(self.conn.execute(sql, (max(queued),)).fetchall())
        jobs = [row_to_job(r, positions.get(r["seq"])) for r in found]
        return jobs, (str(found[-1]["seq"]) if len(rows) > page.limit else None)

    async def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in JobStatus}
        out.update(dict(self.conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall()))
        return out

    async def retries_of(self, job_id: str) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT job_id FROM jobs WHERE retry_of = ? ORDER BY seq", (job_id,))]
