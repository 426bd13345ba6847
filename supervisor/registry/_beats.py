"""The rules of what a running job says and what the sweeper judges, written once over the store port: heartbeats
and progress, the job's token, the sweeper's absence flags, the events it writes about a running job (an adoption)
and the queue's watch's announcements.

A heartbeat is the registry's most frequent write: its rule reads and writes its row itself (one module to the
store). The sweeper's judgements write their events with the row helpers of ``_jobs`` (one place writes a job's
event).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..domain import Conflict, Job, JobStatus, RequestError, Unauthorized, hash_token
from . import _tables as tables
from ._jobs import add_event, found, job_event, put_setting, update_job
from ._tables import Author, Store
from ._vocabulary import QUEUE_ANNOUNCED, Beat, Change, FleetSetting

# -- what a running job says, and what the sweeper judges ------------------------------------------------------


async def record_heartbeats(store: Store, beats: Sequence[Beat]) -> list[Job | RequestError]:
    """Record beats (per beat: the row after it, or the ``Unauthorized``/``Conflict`` it earned; a refused beat
    writes nothing; a row holds a token hash only while it runs, so a beat for a row that does not run earns
    ``Unauthorized``, as one for an unknown job). ``completed_units`` is a watermark (INV-PROGRESS-NOT-LIVENESS):
    every beat moves ``last_heartbeat_at``, only a higher count moves ``last_progress_at``."""
    results: list[Job | RequestError] = []
    now = store.now()
    for beat in beats:
        try:
            row = await authenticated(store, beat.job_id, beat.token, lock=True)
            if row.status is not JobStatus.RUNNING:
                raise Conflict(f"job {beat.job_id} is {row.status}, not running", field="job_id")
        except RequestError as exc:
            results.append(exc)
            continue
        # INV-PROGRESS-NOT-LIVENESS: every beat is liveness; only a higher watermark is progress.
        fields = {
            "last_heartbeat_at": now,
            "completed_units": max(beat.completed_units, row.completed_units),
            "total_units": row.total_units if beat.total_units is None else beat.total_units,
            "stage": row.stage if beat.stage is None else beat.stage,
            "last_progress_at": now if beat.completed_units > row.completed_units else row.last_progress_at,
        }
        await store.update(tables.JOBS, (("job_id", "=", beat.job_id),), tables.stored(fields))
        results.append(replace(row, **fields))  # type: ignore[arg-type]
    return results


async def authenticated(store: Store, job_id: str, token: str, *, lock: bool = False) -> Job:
    """The row whose running job ``token`` is (``Unauthorized`` otherwise: a missing job looks the same)."""
    rows = await store.select(tables.JOBS, (("job_id", "=", job_id),), tables.Read(lock=lock))
    row = tables.job_of(rows[0]) if rows else None
    # Constant-time compare of the hashes; a missing hash (a job that does not run, or none) never matches.
    if row is None or row.token_hash is None or not hmac.compare_digest(row.token_hash, hash_token(token)):
        raise Unauthorized("the token is not this job's")
    return row


async def check_job_token(store: Store, job_id: str, token: str) -> None:
    """Raise ``Unauthorized`` unless ``token`` is the running job's own (a missing job looks the same)."""
    await authenticated(store, job_id, token)


async def set_absence(
    store: Store, author: Author, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
) -> Change:
    """Record the sweeper's absence flags on a RUNNING row with ``events`` ((name, reason) pairs);
    ``stalled_since`` is set when ``stalled`` turns on. A judgement that changes nothing writes nothing."""
    row = await found(store, job_id, lock=True)
    if row.status is not JobStatus.RUNNING or (row.stalled, row.silent) == (stalled, silent):
        return Change(row, changed=False)
    since = row.stalled_since if row.stalled and stalled else (store.now() if stalled else None)
    fields = {"stalled": stalled, "stalled_since": since, "silent": silent}
    await update_job(store, job_id, fields, status=JobStatus.RUNNING)
    for event, reason in events:
        await job_event(store, author, job_id, event, str(row.status), reason)
    return Change(replace(row, **fields), changed=True)  # type: ignore[arg-type]


async def record_event(store: Store, author: Author, job_id: str, event: str, reason: str | None) -> Job:
    """Write an event about a change the row does not show (this boot adopted the job); none for a finished row
    (its end is its last event). The row as it is."""
    row = await found(store, job_id, lock=True)
    if not row.status.is_terminal:
        # A finished row's last event is its end: nothing said about its process (an adoption) comes after it.
        await job_event(store, author, job_id, event, str(row.status), reason)
    return row


async def record_queue_event(
    store: Store,
    author: Author,
    event: str,
    *,
    host_id: str,
    job_id: str,
    details: Mapping[str, Any],
    reason: str,
    announced: str,
    setting: str | None = None,
) -> None:
    """The queue's watch (docs/operations.md § The queue's watch): ``event`` (``queue.stuck``, ``queue.moving``)
    about this host's queue, its ``details`` the body receivers get, into the outbox (when events are written), and
    ``announced`` recorded as this host's announced state (``queue_stuck/<host>``: the stuck queue announced, empty
    once it moved), in one step: a boot after a restart does not say a condition that still holds twice.
    ``setting``: where else the announcement is recorded (a missed schedule's ``schedule_missed/<name>``)."""
    if author.outbox:
        await add_event(store, author, job_id, details, event, None, reason)
    where = setting if setting is not None else f"{QUEUE_ANNOUNCED}{host_id}"
    await put_setting(store, FleetSetting(where, announced, host_id, store.now()))
