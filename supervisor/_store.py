"""The registry as the Trio side sees it: every call runs in a worker thread, never on the event loop."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import trio

from ._registry import (
    Beat,
    EnqueueResult,
    FinalizeResult,
    NewJob,
    OutboxEvent,
    ProcessRecord,
    PromoteRequest,
    PruneResult,
    SqliteRegistry,
)
from .domain._errors import RequestError
from .domain._model import Job, JobStatus
from .registry._coalesce import Coalescer

P = ParamSpec("P")
T = TypeVar("T")


class AsyncRegistry:
    """Awaitable wrappers over ``SqliteRegistry``; each call runs in a thread.

    Calls cannot hang forever: SQLite's busy timeout bounds every wait for the cross-process lock, and the call
    raises ``RegistryError`` when it runs out.

    At most as many calls run at once as the registry has connections: a further caller waits here, on the event
    loop, instead of parking a worker thread on the connection pool.
    """

    def __init__(self, registry: SqliteRegistry) -> None:
        self.sync = registry
        self._limiter = trio.CapacityLimiter(registry.max_connections)
        self._writes: Coalescer[Callable[[Any], Any], Any] = Coalescer(self._write_group)  # see _write

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)

    async def _write(self, change: Callable[[Any], T]) -> T:
        """One of the per-job writes (a job's end, the identities of started jobs, an enqueue), in a thread hop
        shared with the others queued meanwhile.

        A thread hop (trio's worker thread woken, the result handed back) was the largest single cost per job under
        load (issue 10's batch profile). The changes are coalesced (``Coalescer``): the first with no hop in flight
        takes one with every change queued so far, handed to the registry's group commit together
        (``SqliteRegistry.write_group``: the same transaction rules, each change in its own savepoint); each caller
        gets its own result or error once the transaction holding its change has committed.
        """
        result: T = await self._writes.submit(change)
        return result

    async def _write_group(self, changes: Sequence[Callable[[Any], Any]]) -> list[Any]:
        outcomes = await trio.to_thread.run_sync(self.sync.write_group, changes, limiter=self._limiter)
        return [error if error is not None else result for result, error in outcomes]

    async def enqueue(
        self, kind: str, params: Mapping[str, Any], argv: Sequence[str], *, coalesce_key: str | None
    ) -> EnqueueResult:
        return await self._write(self.sync.enqueue_change(NewJob(kind, params, argv, coalesce_key)))

    async def enqueue_then_promote(
        self, job: NewJob, *, promote: PromoteRequest, unless_exists: Path
    ) -> tuple[EnqueueResult, list[Job] | None]:
        """Enqueue, then promote into free slots in the same transaction unless ``unless_exists`` (the pause flag)
        exists (see ``finalize_then_promote``)."""
        change = self.sync.enqueue_then_promote_change(job, promote=promote, unless_exists=unless_exists)
        return await self._write(change)

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        return await self._write(self.sync.enqueue_many_change(jobs))

    async def promote_queued(
        self, max_concurrent: int, *, boot_id: str, token_hashes: Sequence[str], log_dir: Path | None
    ) -> list[Job]:
        return await self._run(
            self.sync.promote_queued, max_concurrent, boot_id=boot_id, token_hashes=token_hashes, log_dir=log_dir
        )

    async def set_job_process(self, job_id: str, **identity: Any) -> Job:
        return await self._run(self.sync.set_job_process, job_id, **identity)

    async def set_job_processes(self, records: Sequence[ProcessRecord]) -> list[Job]:
        return await self._write(self.sync.set_job_processes_change(records))

    async def finalize(
        self,
        job_id: str,
        status: JobStatus | Callable[[Job], tuple[JobStatus, str | None]],
        *,
        reason: str | None = None,
        exit_code: int | None = None,
        expect_pid: int | None = None,
        expect_container_id: str | None = None,
    ) -> FinalizeResult:
        return await self._run(
            self.sync.finalize,
            job_id,
            status,
            reason=reason,
            exit_code=exit_code,
            expect_pid=expect_pid,
            expect_container_id=expect_container_id,
        )

    async def finalize_then_promote(
        self,
        job_id: str,
        status: JobStatus | Callable[[Job], tuple[JobStatus, str | None]],
        *,
        exit_code: int | None,
        promote: PromoteRequest,
        unless_exists: Path,
    ) -> tuple[FinalizeResult, list[Job] | None]:
        """Finalize, then promote into the freed slot in the same transaction, unless ``unless_exists`` (the pause
        flag) exists: that file is looked at inside the transaction, so the whole step is one change (in a hop shared
        with the others queued meanwhile, see ``_write``)."""

        return await self._write(
            self.sync.finalize_then_promote_change(
                job_id, status, exit_code=exit_code, promote=promote, unless_exists=unless_exists
            )
        )

    async def request_cancel(self, job_id: str) -> FinalizeResult:
        return await self._run(self.sync.request_cancel, job_id)

    async def record_heartbeats(self, beats: Sequence[Beat]) -> list[Job | RequestError]:
        return await self._run(self.sync.record_heartbeats, beats)

    async def set_absence(
        self, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
    ) -> FinalizeResult:
        return await self._run(self.sync.set_absence, job_id, stalled=stalled, silent=silent, events=events)

    async def record_event(self, job_id: str, event: str, reason: str | None) -> Job:
        return await self._run(self.sync.record_event, job_id, event, reason)

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        return await self._run(self.sync.outbox_pending, limit)

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        await self._run(self.sync.outbox_delete, seqs)

    async def outbox_depth(self) -> int:
        return await self._run(self.sync.outbox_depth)

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> PruneResult:
        return await self._run(self.sync.outbox_prune, max_events=max_events, max_age_s=max_age_s)

    async def check_job_token(self, job_id: str, token: str) -> None:
        await self._run(self.sync.check_job_token, job_id, token)

    async def get(self, job_id: str) -> Job:
        return await self._run(self.sync.get, job_id)

    async def running_jobs(self) -> list[Job]:
        return await self._run(self.sync.running_jobs)

    async def list_jobs(
        self, *, status: str | None = None, kind: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[Job], str | None]:
        return await self._run(self.sync.list_jobs, status=status, kind=kind, limit=limit, cursor=cursor)

    async def counts(self) -> dict[str, int]:
        return await self._run(self.sync.counts)
