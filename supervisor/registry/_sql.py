"""What the two SQL backends share beside the rules: the tables' columns, a row's reading into a ``Job``, and the
migrations' loader. Each backend keeps its own SQL text and its own stored forms (how a timestamp comes back)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

from ..domain import TERMINAL, Job, JobStatus, RegistryError
from ..domain._model import Attempt, IdentityRecord
from ._protocol import Receipt

COLUMNS = (
    "job_id, seq, kind, params, argv, status, error_reason, exit_code, created_at, started_at, ended_at, "
    "attempts, cancel_requested, boot_id, identity, token_hash, completed_units, total_units, stage, "
    "last_heartbeat_at, last_progress_at, log_path, stalled, stalled_since, silent, max_attempts, not_before, history, "
    "host_id, retry_of, idempotency_key, enqueued_by, cancelled_by"
)
KEY_COLUMNS = "fingerprint, job_id, status, queue_position, coalesced"
OUTBOX_COLUMNS = "seq, event_id, job_id, event, created_at, previous_status, reason, boot_id, job"
HOST_COLUMNS = "host_id, boot_id, started_at, last_seen_at, lease_expires_at"
FINISHED = f"ended_at IS NOT NULL AND status IN ({', '.join(repr(str(s)) for s in sorted(TERMINAL))})"


def column(field: str) -> str:
    """The column that keeps a ``Job`` field (a resubmitted row's ``next_attempt_at`` is ``not_before``)."""
    return "not_before" if field == "next_attempt_at" else field


def row_to_job(row: Any, ts: Callable[[Any], datetime | None], queue_position: int | None = None) -> Job:
    """A row of ``COLUMNS`` (read by name) as a ``Job``; ``ts``: a stored timestamp (or NULL) as an aware ``datetime``
    (or None)."""
    identity = row["identity"]
    created_at = ts(row["created_at"])
    assert created_at is not None
    return Job(
        job_id=row["job_id"],
        seq=row["seq"],
        kind=row["kind"],
        params=json.loads(row["params"]),
        argv=json.loads(row["argv"]),
        status=JobStatus(row["status"]),
        error_reason=row["error_reason"],
        exit_code=row["exit_code"],
        created_at=created_at,
        started_at=ts(row["started_at"]),
        ended_at=ts(row["ended_at"]),
        attempts=row["attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        boot_id=row["boot_id"],
        identity=IdentityRecord.from_json(json.loads(identity)) if identity is not None else None,
        token_hash=row["token_hash"],
        completed_units=row["completed_units"],
        total_units=row["total_units"],
        stage=row["stage"],
        last_heartbeat_at=ts(row["last_heartbeat_at"]),
        last_progress_at=ts(row["last_progress_at"]),
        log_path=row["log_path"],
        queue_position=queue_position,
        stalled=bool(row["stalled"]),
        stalled_since=ts(row["stalled_since"]),
        silent=bool(row["silent"]),
        max_attempts=row["max_attempts"],
        next_attempt_at=ts(row["not_before"]),
        history=tuple(Attempt.from_json(a) for a in json.loads(row["history"])),
        host_id=row["host_id"],
        retry_of=row["retry_of"],
        idempotency_key=row["idempotency_key"],
        enqueued_by=row["enqueued_by"],
        cancelled_by=row["cancelled_by"],
    )


def receipts(rows: Sequence[Any]) -> tuple[str, list[Receipt]] | None:
    """A key's rows of ``KEY_COLUMNS``, in answer order, as its fingerprint and receipts (None: no row)."""
    if not rows:
        return None
    out = [Receipt(r["job_id"], JobStatus(r["status"]), r["queue_position"], bool(r["coalesced"])) for r in rows]
    return rows[0]["fingerprint"], out


def json_value(value: object) -> object:
    """The JSON text a column keeps for an identity record or a history (other values as they are)."""
    if isinstance(value, IdentityRecord):
        return json.dumps(value.to_json(), sort_keys=True)
    if isinstance(value, tuple):  # the history
        return json.dumps([a.to_json() for a in value])
    if isinstance(value, JobStatus):
        return str(value)
    return value


_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")


@dataclass(frozen=True)
class Migration:
    version: int  # the schema version after it
    name: str
    script: str


def load_migrations(package: str) -> list[Migration]:
    """Every migration ``package`` ships (``migrations/NNNN_name.sql``), in order (versions 1, 2, 3... with no gap)."""
    found: list[Migration] = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = _NAME.fullmatch(entry.name)
        if match is not None:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RegistryError(f"the registry's migrations are not numbered 1..n: {[m.name for m in found]}")
    return found
