"""``MemoryRegistry``: the registry's rules over a process's memory, for fast tests of the core (the fake beside the
real thing, never instead of it: it runs the very rules the SQL backends run, and passes the same contract suite).

Its store is dicts. A step never suspends (``run_now`` holds it to that), so on one Trio loop no other task sees it
half done, which is what the other backends' transactions give; a step (or a savepoint) that raises is undone by
putting back the state it began with. Nothing survives the process, and nothing here is shared with another one.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import trio

from ..domain import Job, JobStatus, RegistryError
from ..domain._model import utc_now
from ._engine import LocalStore, Page, Step, run_now
from ._health import RegistryFault
from ._protocol import (
    BACK_IN_QUEUE,
    FleetSetting,
    Host,
    NewJob,
    OutboxEvent,
    PauseState,
    PrunedJob,
    PruneResult,
    Receipt,
    WakeupFeed,
)
from ._registry import Registry, T


@dataclass
class _State:
    rows: dict[str, tuple[Job, str | None]] = field(default_factory=dict)  # job id -> (row, coalescing key)
    seq: int = 0
    events: list[OutboxEvent] = field(default_factory=list)
    event_seq: int = 0
    pause: PauseState = field(default_factory=lambda: PauseState(False))
    hosts: dict[str, Host] = field(default_factory=dict)
    leader: Host | None = None
    forgotten: set[tuple[str, str]] = field(default_factory=set)
    settings: dict[str, FleetSetting] = field(default_factory=dict)
    keys: dict[str, tuple[str, list[Receipt], datetime]] = field(default_factory=dict)  # -> fingerprint, answer, expiry

    def copy(self) -> _State:
        return _State(**{f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def restore(self, before: _State) -> None:
        """Back to ``before`` (a failed step or savepoint undone, as a rollback)."""
        self.__dict__.update(before.__dict__)


class MemoryRows(LocalStore):
    """The ``Store`` of the rules over ``_State`` (see ``_engine.Store``)."""

    def __init__(self, backend: MemoryBackend) -> None:
        self.clock = backend.clock
        self.boot_id = backend.boot_id
        self.s = backend.state

    def _copy(self, job: Job, position: int | None = None) -> Job:
        """A caller's own copy (its params and argv are mutable, as no row read from a database would share)."""
        return replace(job, params=copy.deepcopy(job.params), argv=list(job.argv), queue_position=position)

    def _jobs(self, status: JobStatus | None = None) -> list[Job]:
        return [job for job, _ in self.s.rows.values() if status is None or job.status is status]

    async def job(self, job_id: str, *, lock: bool = False, position: bool = False) -> Job | None:
        found = self.s.rows.get(job_id)
        if found is None:
            return None
        job = found[0]
        queued = position and job.status is JobStatus.QUEUED
        return self._copy(job, sum(1 for q in self._jobs(JobStatus.QUEUED) if q.seq <= job.seq) if queued else None)

    async def jobs(self, job_ids: Sequence[str]) -> list[Job]:
        return [self._copy(self.s.rows[job_id][0]) for job_id in job_ids]

    async def running(self) -> list[Job]:
        return [self._copy(job) for job in self._jobs(JobStatus.RUNNING)]

    async def running_counts(self, host_id: str | None) -> tuple[int, int]:
        running = self._jobs(JobStatus.RUNNING)
        return len(running), sum(1 for job in running if job.host_id == host_id)

    async def promotable(self, now: datetime, limit: int, *, lock: bool = False) -> list[Job]:
        ready = [j for j in self._jobs(JobStatus.QUEUED) if j.next_attempt_at is None or j.next_attempt_at <= now]
        return [self._copy(job) for job in ready[:limit]]

    async def next_backoff_end(self, now: datetime) -> datetime | None:
        waiting = [j.next_attempt_at for j in self._jobs(JobStatus.QUEUED) if j.next_attempt_at is not None]
        return min((at for at in waiting if at > now), default=None)

    async def queued_with_key(self, key: str) -> str | None:
        found = [job.job_id for job, k in self.s.rows.values() if k == key and job.status is JobStatus.QUEUED]
        return found[0] if found else None

    async def insert(self, job: NewJob, now: datetime) -> str:
        self.s.seq += 1
        row = Job(
            job_id=uuid.uuid4().hex,
            seq=self.s.seq,
            kind=job.kind,
            params=copy.deepcopy(dict(job.params)),
            argv=list(job.argv),
            status=JobStatus.QUEUED,
            created_at=now,
            attempts=0,
            token_hash=None,
            log_path=None,
            max_attempts=job.max_attempts,
            retry_of=job.retry_of,
            idempotency_key=job.idempotency_key,
            enqueued_by=job.enqueued_by,
            **BACK_IN_QUEUE,  # type: ignore[arg-type]  # every other field as a row that never ran has it
        )
        self.s.rows[row.job_id] = (row, job.coalesce_key)
        return row.job_id

    async def receipts(self, key: str, now: datetime) -> tuple[str, list[Receipt]] | None:
        found = self.s.keys.get(key)
        return (found[0], list(found[1])) if found is not None and found[2] > now else None

    async def put_receipts(
        self, key: str, fingerprint: str, receipts: Sequence[Receipt], now: datetime, expires_at: datetime
    ) -> None:
        self.s.keys[key] = (fingerprint, list(receipts), expires_at)

    async def drop_expired_keys(self, now: datetime, limit: int) -> int:
        gone = [key for key, (_, _, expires_at) in self.s.keys.items() if expires_at <= now][:limit]
        return sum(len(self.s.keys.pop(key)[1]) for key in gone)  # rows, as the SQL stores count them

    def _keyed(self, key: str | None = None) -> set[str]:
        """The jobs live keys answered (``key``: that key's alone)."""
        now = self.now()
        live = [v for k, v in self.s.keys.items() if v[2] > now and key in (None, k)]
        return {r.job_id for _, receipts, _ in live for r in receipts}

    async def update(self, job_id: str, fields: Mapping[str, object], *, status: JobStatus | None = None) -> int:
        found = self.s.rows.get(job_id)
        if found is None or (status is not None and found[0].status is not status):
            return 0
        self.s.rows[job_id] = (replace(found[0], **fields), found[1])  # type: ignore[arg-type]
        return 1

    async def add_event(
        self, job_id: str, body: Mapping[str, Any], event: str, previous: str | None, reason: str | None
    ) -> None:
        self.s.event_seq += 1
        self.s.events.append(
            OutboxEvent(self.s.event_seq, uuid.uuid4().hex, job_id, event, self.now(), previous, reason,
                        self.boot_id, copy.deepcopy(dict(body)))
        )  # fmt: skip

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        before = self.s.copy()
        try:
            yield
        except BaseException:
            self.s.restore(before)
            raise

    async def pause(self, *, lock: bool = False) -> PauseState:
        return self.s.pause

    async def set_pause(self, state: PauseState) -> None:
        self.s.pause = state

    async def hosts(self, now: datetime) -> list[Host]:
        return [replace(self.s.hosts[h], as_of=now) for h in sorted(self.s.hosts)]

    async def leader(self, now: datetime) -> Host | None:
        return None if self.s.leader is None else replace(self.s.leader, as_of=now)

    async def put_host(self, host: Host, *, new: bool) -> None:
        self.s.hosts[host.host_id] = host

    async def put_leader(self, host: Host | None, *, only: tuple[str, str] | None = None) -> None:
        held = self.s.leader
        if host is not None or only is None or (held is not None and (held.host_id, held.boot_id) == only):
            self.s.leader = host

    async def fenced(self, host_id: str, boot_id: str) -> bool:
        return (host_id, boot_id) in self.s.forgotten

    async def fence(self, host: Host, now: datetime) -> None:
        self.s.forgotten.add((host.host_id, host.boot_id))

    async def drop_host(self, host_id: str) -> None:
        self.s.hosts.pop(host_id, None)
        if self.s.leader is not None and self.s.leader.host_id == host_id:
            self.s.leader = None

    async def setting(self, name: str) -> FleetSetting | None:
        return self.s.settings.get(name)

    async def put_setting(self, setting: FleetSetting) -> None:
        self.s.settings[setting.name] = setting

    def _finished(self) -> list[Job]:
        done = [job for job in self._jobs() if job.status.is_terminal and job.ended_at is not None]
        return sorted(done, key=lambda job: (job.ended_at, job.seq))

    async def finished_edge(self, keep_latest: int) -> tuple[datetime, int] | None:
        newest = self._finished()[::-1]
        if keep_latest >= len(newest):
            return None
        edge = newest[keep_latest]
        assert edge.ended_at is not None
        return edge.ended_at, edge.seq

    async def prunable(
        self, ended_before: datetime | None, edge: tuple[datetime, int] | None, limit: int, *, lock: bool
    ) -> list[PrunedJob]:
        pending = {event.job_id for event in self.s.events} | self._keyed()

        def goes(ended_at: datetime, seq: int) -> bool:
            by_age = ended_before is not None and ended_at < ended_before
            return by_age or (edge is not None and (ended_at, seq) <= edge)

        gone = [
            PrunedJob(job.job_id, job.kind, job.status, job.ended_at, job.log_path, job.attempts)
            for job in self._finished()
            if job.ended_at is not None and job.job_id not in pending and goes(job.ended_at, job.seq)
        ]
        return gone[:limit]

    async def delete_finished(self, job_ids: Sequence[str]) -> set[str]:
        for job_id in job_ids:
            del self.s.rows[job_id]
        return set(job_ids)

    async def outbox_stats(self) -> tuple[int, datetime | None]:
        return len(self.s.events), min((e.created_at for e in self.s.events), default=None)

    async def outbox_drop(self, older_than: datetime, max_events: int) -> PruneResult:
        kept = [e for e in self.s.events if e.created_at >= older_than]
        by_age, by_count = len(self.s.events) - len(kept), max(0, len(kept) - max_events)
        self.s.events = kept[by_count:]
        return PruneResult(by_age, by_count)

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        return [replace(e, job=copy.deepcopy(dict(e.job))) for e in self.s.events[:limit]]

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        gone = set(seqs)
        self.s.events = [e for e in self.s.events if e.seq not in gone]

    async def list_page(self, page: Page) -> tuple[list[Job], str | None]:
        rows = [
            job
            for job in reversed(self._jobs())
            if (page.status is None or job.status == page.status)
            and (page.kind is None or job.kind == page.kind)
            and (page.before is None or job.seq < page.before)
            and (page.idempotency_key is None or job.job_id in self._keyed(page.idempotency_key))
        ]
        found = [await self.job(job.job_id, position=True) for job in rows[: page.limit]]
        jobs = [job for job in found if job is not None]
        return jobs, (str(jobs[-1].seq) if len(rows) > page.limit else None)

    async def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in JobStatus}
        for job in self._jobs():
            out[job.status.value] += 1
        return out

    async def retries_of(self, job_id: str) -> list[str]:
        return [job.job_id for job in self._jobs() if job.retry_of == job_id]


class MemoryBackend:
    """Steps run at once on the caller's loop, after one checkpoint; a write that raises leaves the state as it was."""

    where = "memory"

    def __init__(self, *, boot_id: str | None, clock: Callable[[], datetime]) -> None:
        self.boot_id = boot_id
        self.clock = clock
        self.state = _State()
        self.closed = False

    async def write(self, step: Step[T]) -> T:
        await self._enter()
        before = self.state.copy()
        try:
            return run_now(step(MemoryRows(self)))
        except BaseException:
            self.state.restore(before)
            raise

    async def read(self, step: Step[T]) -> T:
        await self._enter()
        return run_now(step(MemoryRows(self)))

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise RegistryError("the registry is closed")

    def fault(self) -> RegistryFault | None:
        return None  # memory does not fail to write

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """Nothing to hear: one process owns this registry, and its own wakes (an enqueue, a job's end) suffice."""
        return nullcontext(None)

    async def aclose(self) -> None:
        self.closed = True


class MemoryRegistry(Registry):
    """The rules over a process's memory; the constructor takes what ``SqliteRegistry``'s does, but the path."""

    def __init__(
        self, *, boot_id: str | None = None, outbox: bool = True, clock: Callable[[], datetime] = utc_now
    ) -> None:
        super().__init__(MemoryBackend(boot_id=boot_id, clock=clock), boot_id=boot_id, outbox=outbox)
