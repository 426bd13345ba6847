"""The rules of what a running job says, written once over the store port: heartbeats and progress, and the job's
token.

A heartbeat is the registry's most frequent write: its rule reads and writes its row itself, with no event (one
module to the store). What the sweeper judges about a running job writes events, so it lives in ``_jobs``, beside
the one place a job's event is written.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import replace

from ..domain import Conflict, Job, JobStatus, RequestError, Unauthorized, hash_token
from . import _tables as tables
from ._tables import Store
from ._vocabulary import Beat

# -- what a running job says -------------------------------------------------------------------------------------------


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
