"""A running job's heartbeat: liveness and a progress watermark (ADR 0002 D7), authenticated by the job's token.

The token is checked before the body is read, so a caller without it learns nothing: not whether the job exists,
nor what body would have been accepted. The check is in memory for a job this boot saw running (``JobTokens``),
else one registry read; the write checks the token again, in the transaction that records the beat. Beats that
arrive together share a registry write (the registry's own group commit); each is answered after the write that
holds it: a 204 means the beat is durable.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeGuard

from ..domain import Conflict, Job, JobStatus, RequestError, Unauthorized, ValidationError
from ..domain._model import hash_token
from ..observe import EventName, JobEvent
from ..registry import Beat, Registry

MAX_STAGE_LEN = 200
# A heartbeat's unit counts are stored as 64-bit signed integers: a larger number is refused, not a 500.
MAX_UNITS = 2**63 - 1
# Far more than any max_concurrent: a bound in case entries for jobs ended by another process are never dropped.
MAX_TOKENS = 100_000


class JobTokens:
    """The token hashes of the jobs running now, in memory, so that the check that must come before a heartbeat's
    body is read costs no registry call. Filled from the event bus when this boot promotes a job and, for a job it
    did not promote (an adopted one), after one registry check; dropped when the job ends. It only ever *admits* a
    token early: a miss or a mismatch asks the registry, and the write that records the beat checks the token again
    in its own transaction, so a stale entry can cost a body read, never a beat recorded for a job that ended."""

    def __init__(self) -> None:
        self._hashes: dict[str, str] = {}
        self._ends = 0  # bumped at every job end: a lookup that raced with one must not re-admit its token

    def admits(self, job_id: str, token: str) -> bool:
        """True when ``token`` is the token of ``job_id`` as this boot last saw it running (constant-time compare)."""
        known = self._hashes.get(job_id)
        return known is not None and hmac.compare_digest(known, hash_token(token))

    @property
    def generation(self) -> int:
        return self._ends

    def remember(self, job_id: str, token: str, generation: int) -> None:
        """After the registry admitted ``token``: keep it, unless a job ended since ``generation`` was read."""
        if generation != self._ends:
            return
        if len(self._hashes) >= MAX_TOKENS:
            self._hashes.clear()
        self._hashes[job_id] = hash_token(token)

    def forget(self, job_id: str) -> None:
        self._hashes.pop(job_id, None)
        self._ends += 1

    def on_event(self, event: JobEvent) -> None:
        """The event bus's subscriber: learn a token when this boot promotes its job, forget it when the job ends or
        goes back to the queue (a resubmitted attempt's token dies with it: the next attempt gets a new one)."""
        if event.event is not EventName.TRANSITION:
            return
        job = event.job
        if job.status is JobStatus.RUNNING and job.token_hash is not None:
            self._hashes[job.job_id] = job.token_hash
        elif job.status is not JobStatus.RUNNING:
            self.forget(job.job_id)

    def __len__(self) -> int:
        return len(self._hashes)


def _is_unit_count(value: object) -> TypeGuard[int]:
    """A heartbeat's unit count: a JSON integer (not a bool) from 0 to MAX_UNITS."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_UNITS


def _is_utf8(text: str) -> bool:
    """False for a lone surrogate: valid JSON ("\\ud800"), but no UTF-8 to store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_beat(job_id: str, token: str, body: object) -> Beat:
    """A heartbeat's body, validated: unknown fields and out-of-range values are a 422 naming the field."""
    if not isinstance(body, Mapping):
        raise ValidationError("body must be a JSON object", field="body")
    unknown = sorted(set(body) - {"completed_units", "total_units", "stage"})
    if unknown:
        raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
    completed = body.get("completed_units")
    if not _is_unit_count(completed):
        raise ValidationError(f"completed_units must be an integer from 0 to {MAX_UNITS}", field="completed_units")
    total = body.get("total_units")
    if total is not None and not _is_unit_count(total):
        raise ValidationError(f"total_units must be an integer from 0 to {MAX_UNITS}, or null", field="total_units")
    stage = body.get("stage")
    if stage is not None and (not isinstance(stage, str) or len(stage) > MAX_STAGE_LEN or not _is_utf8(stage)):
        raise ValidationError(f"stage must be a text of at most {MAX_STAGE_LEN} characters", field="stage")
    return Beat(job_id, token, completed, total, stage)


class Heartbeats:
    """Records heartbeats; ``recorded`` sees each row after its beat (the absence tracker's ``beat``)."""

    def __init__(self, registry: Registry, recorded: Callable[[Job], None]) -> None:
        self._registry = registry
        self._recorded = recorded
        self.tokens = JobTokens()

    async def record(self, job_id: str, token: str, read_body: Callable[[], Awaitable[object]]) -> Job:
        """``read_body`` reads the request's body (raising the HTTP layer's 400/413/415), after the token check."""
        admitted = self.tokens.admits(job_id, token)
        if not admitted:
            generation = self.tokens.generation
            await self._registry.check_job_token(job_id, token)
            self.tokens.remember(job_id, token, generation)
        try:
            beat = parse_beat(job_id, token, await read_body())
        except RequestError:
            if admitted:
                # Admitted from memory, the job may have ended a moment ago: a token that no longer works is a 401
                # whatever its body, as if the registry had been asked first.
                await self._registry.check_job_token(job_id, token)
            raise
        [result] = await self._registry.record_heartbeats([beat])
        if isinstance(result, (Unauthorized, Conflict)):
            self.tokens.forget(job_id)  # ended (perhaps by another process): the next beat asks the registry
        if isinstance(result, RequestError):
            raise result
        self._recorded(result)
        return result
