"""A running job's heartbeat: liveness and a progress watermark (ADR 0002 D7), authenticated by the job's token.

The token is checked before the body is read, so a caller without it learns nothing: not whether the job exists,
nor what body would have been accepted. The check is in memory for a job this boot saw running (``JobTokens``),
else one registry read. A beat that passes is *taken* (the 204) and written behind (ADR 0018): the beats taken
within ``FLUSH_INTERVAL_S`` go to the registry in one write (``Heartbeats.run``), a job's several beats merged into
one, which checks each token again in its own transaction. So a beat costs no registry write of its own -- the
write each beat waited for was most of a beat's cost. Every reader of progress goes through ``CurrentRows``, which
writes what is pending first (a 204 is seen by the next read, the next absence judgement, the next scrape), and a
crash loses at most the beats of one interval: liveness, which the job's next beat gives again with its watermark
(INV-PROGRESS-NOT-LIVENESS: the watermark is a maximum, so nothing is counted twice).

What the supervisor knows of a job's progress is more than its row while the registry cannot write (a lock held
elsewhere, a full disk): the beats taken meanwhile wait here. ``Heartbeats.known`` brings a row up to them, so
``/metrics`` never says a job stalled that beats and progresses (docs/alerting.md).
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import trio

from ..domain import (
    FIRST_PAGE,
    Doorbell,
    Job,
    JobStatus,
    PageRequest,
    Progress,
    RegistryError,
    RequestError,
    hash_token,
    utc_now,
)
from ..observe import EventName, JobEvent, get_logger
from ..registry import Beat, Registry
from ._ports import BeatWitness

log = get_logger()

# Far more than any max_concurrent: a bound in case entries for jobs ended by another process are never dropped.
MAX_TOKENS = 100_000
# How long the beats taken gather before one registry write takes them all (a beat's 204 means taken; it is written
# within this, or at the next read through the core, whichever comes first).
FLUSH_INTERVAL_S = 0.05
# After a write that failed (the registry unavailable), the next try waits this long: the beats are kept meanwhile.
WRITE_RETRY_S = 1.0


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


def merged(older: Beat | None, newer: Beat) -> Beat:
    """Two beats of one job and token as one: the higher watermark, the newer total and stage. The registry records
    them alike (the beats of one write share its clock), so a job's beats are one row change, not one each."""
    if older is None:
        return newer
    total = older.total_units if newer.total_units is None else newer.total_units
    stage = older.stage if newer.stage is None else newer.stage
    return Beat(newer.job_id, newer.token, max(older.completed_units, newer.completed_units), total, stage)


@dataclass(frozen=True)
class Seen:
    """A running job's beats as this boot took them: the highest watermark, when it was first reached (the last rise
    this boot saw), and the last beat (wall clock)."""

    completed_units: int
    rose_at: datetime
    beat_at: datetime


@dataclass(frozen=True)
class Admission:
    """A beat whose token was admitted (``Heartbeats.admit``); ``from_memory``: without asking the registry."""

    job_id: str
    token: str
    from_memory: bool


class Heartbeats:
    """Takes heartbeats and writes them behind (``run``, a task of the root nursery); ``witness`` is told of each row
    after its beat is written (``AbsenceTracker.beat``). Built on the registry and the clock alone, not a ``Boot``:
    the interleaving tests drive it over a registry of their own."""

    def __init__(self, registry: Registry, witness: BeatWitness, wall_clock: Callable[[], datetime] = utc_now) -> None:
        """``wall_clock``: the clock the registry stamps beats by (the boot's)."""
        self._registry = registry
        self._witness = witness
        self._wall_clock = wall_clock
        self.tokens = JobTokens()
        self._seen: dict[str, Seen] = {}  # each running job's beats taken by this boot (``known``)
        self._pending: dict[tuple[str, str], Beat] = {}  # (job id, token) -> its beats taken since the last write
        self._oldest_at: float | None = None  # when the oldest pending beat was taken (None: nothing pending)
        # Rung when beats are taken; the writer waits on it while nothing is pending. Never replaced: a replaced
        # ``Event`` once left the writer waiting on one that nobody would set again (ADR 0019).
        self._arrived = Doorbell()
        self._writing = trio.Lock()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def admit(self, job_id: str, token: str) -> Admission:
        """The first of a beat's two calls, before its body is read: ``token`` must be ``job_id``'s (401 otherwise),
        checked in memory for a job this boot saw running, else by one registry read."""
        if self.tokens.admits(job_id, token):
            return Admission(job_id, token, from_memory=True)
        generation = self.tokens.generation
        await self._registry.check_job_token(job_id, token)
        self.tokens.remember(job_id, token, generation)
        return Admission(job_id, token, from_memory=False)

    def take(self, admission: Admission, progress: Progress) -> None:
        """The second: the beat is taken (the 204), to be written behind."""
        beat = Beat(admission.job_id, admission.token, progress.completed_units, progress.total_units, progress.stage)
        self._take({(admission.job_id, admission.token): beat}, trio.current_time(), newest=True)
        self._saw(admission.job_id, progress.completed_units)

    def _saw(self, job_id: str, units: int) -> None:
        now, seen = self._wall_clock(), self._seen.get(job_id)
        if seen is not None and units <= seen.completed_units:
            self._seen[job_id] = dataclasses.replace(seen, beat_at=now)
            return
        if seen is None and len(self._seen) >= MAX_TOKENS:
            self._seen.clear()  # a bound, as for the tokens: entries of jobs ended by another process
        self._seen[job_id] = Seen(units, now, now)

    def known(self, job: Job) -> Job:
        """``job``'s row brought up to the beats this boot took for it, written or not: a higher watermark than the
        row's and when it rose, a later beat. The row as it is when this boot took none newer."""
        seen = self._seen.get(job.job_id)
        if seen is None or job.status is not JobStatus.RUNNING:
            return job
        # INV-PROGRESS-NOT-LIVENESS: a beat moves the heartbeat; only a higher watermark moves the progress time.
        beat_at = seen.beat_at if job.last_heartbeat_at is None else max(seen.beat_at, job.last_heartbeat_at)
        if seen.completed_units <= job.completed_units:
            return dataclasses.replace(job, last_heartbeat_at=beat_at)
        return dataclasses.replace(
            job, completed_units=seen.completed_units, last_progress_at=seen.rose_at, last_heartbeat_at=beat_at
        )

    def on_event(self, event: JobEvent) -> None:
        """The event bus's subscriber: the tokens' (``JobTokens.on_event``), and a job that stops running is no
        longer known here."""
        self.tokens.on_event(event)
        if event.event is EventName.TRANSITION and event.job.status is not JobStatus.RUNNING:
            self._seen.pop(event.job.job_id, None)

    async def refuse(self, admission: Admission, error: RequestError) -> NoReturn:
        """Or the second, when the edge could not read the body: its own ``error``, unless the token no longer
        works. Admitted from memory, the job may have ended a moment ago: a token that no longer works is a 401
        whatever its body, as if the registry had been asked first."""
        if admission.from_memory:
            await self._registry.check_job_token(admission.job_id, admission.token)
        raise error

    def _take(self, beats: Mapping[tuple[str, str], Beat], taken_at: float, *, newest: bool = False) -> None:
        """Add ``beats`` (taken at ``taken_at``) to what is pending and wake the writer: ``newest``, a beat just taken,
        newer than what is pending (its total and stage win); else a failed write's, older than what came since."""
        for key, beat in beats.items():
            pending = self._pending.get(key)
            # Whichever came first, the watermark is the maximum: nothing is counted twice, nothing goes back.
            if pending is None:
                self._pending[key] = beat
            else:
                self._pending[key] = merged(pending, beat) if newest else merged(beat, pending)
        if beats:
            self._oldest_at = taken_at if self._oldest_at is None else min(self._oldest_at, taken_at)
            self._arrived.ring()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Write the beats taken: each within ``FLUSH_INTERVAL_S`` of the oldest pending one (the interval is counted
        from when that beat was taken, not from when the writer woke), plus one write. Error boundary: a write that
        fails (``RegistryError``) keeps its beats for the next one, tried after ``WRITE_RETRY_S``, and is said once
        until one succeeds. Cancelled (the shutdown), it writes what is pending first, shielded (every registry call
        is bounded)."""
        task_status.started()
        failing = False
        try:
            while True:
                while self._oldest_at is None:
                    await self._arrived.wait()
                if failing:
                    await trio.sleep(WRITE_RETRY_S)
                else:
                    await trio.sleep_until(self._oldest_at + FLUSH_INTERVAL_S)
                try:
                    await self.flush()
                except RegistryError as exc:
                    if not failing:
                        log.warning("heartbeats_write_failed", error=str(exc), pending=self.pending)
                    failing = True
                    continue
                if failing:
                    log.info("heartbeats_write_recovered")
                failing = False
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.flush()
                except RegistryError as exc:
                    log.warning("heartbeats_write_failed", error=str(exc), pending=self.pending, at="shutdown")

    async def before_read(self) -> None:
        """Write the beats taken so far, so that the read that follows sees them. A registry that cannot write does not
        fail the read (reads keep answering during a write fault): the beats wait for the writer, which says so."""
        try:
            await self.flush()
        except RegistryError:
            pass

    async def flush(self) -> None:
        """Write every beat taken so far, now (a read that must see them calls this first). A write that fails, or
        is cancelled, keeps its beats (merged under the newer ones) and raises."""
        async with self._writing:  # one write at a time: a flush that waited for one writes what came since
            beats, taken_at = self._pending, self._oldest_at
            self._pending, self._oldest_at = {}, None
            if not beats or taken_at is None:
                return
            try:
                results = await self._registry.record_heartbeats(list(beats.values()))
            except BaseException:
                self._take(beats, taken_at)
                raise
        for beat, result in zip(beats.values(), results, strict=True):
            if isinstance(result, RequestError):
                self.tokens.forget(beat.job_id)  # ended (perhaps by another process): the next beat asks the registry
            else:
                self._witness.beat(result)


class CurrentRows:
    """The one place that answers "this job's row as of now": every read that judges or shows progress (a read through
    the core, the absence judgement at each sweep, ``/metrics``) writes the beats taken before it first, so it never
    sees an older watermark than a 204 acknowledged (ADR 0018)."""

    def __init__(self, registry: Registry, heartbeats: Heartbeats) -> None:
        self._registry = registry
        self._heartbeats = heartbeats

    async def get(self, job_id: str) -> Job:
        await self._heartbeats.before_read()
        return await self._registry.get(job_id)

    async def running_jobs(self) -> list[Job]:
        await self._heartbeats.before_read()
        return await self._registry.running_jobs()

    async def list_jobs(self, page: PageRequest = FIRST_PAGE) -> tuple[list[Job], str | None]:
        await self._heartbeats.before_read()
        return await self._registry.list_jobs(page)
