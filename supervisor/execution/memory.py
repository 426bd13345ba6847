"""An executor whose jobs are Trio tasks: the core's rules tested in milliseconds, on a virtual clock if need be.

Not an exec mode (``create_executor`` never returns it): tests build one and hand it to ``Supervisor``. It plays the
part of the machine or engine the jobs run on, so it outlives a supervisor "boot": give the same instance to a second
``Supervisor`` and it finds the first one's jobs, running or ended, as a real engine would.

A job runs the *program* registered for its kind: ``async def program(job: MemoryJob) -> int`` (its exit code).
``stop`` delivers SIGTERM: the program's ``terminated`` event is set and, unless the program set
``ignores_sigterm``, it is killed by that signal at once. The test can ``kill`` a job (as ``kill -9`` would), ``lose``
one (it vanishes with no record, as a job whose shepherd was killed too), and make the engine ``unreachable``
(evidence UNKNOWN, waits stall until it is back). ``hold_starts`` makes the machine take start requests without acting
on them (a shepherd stopped by SIGSTOP): a start is then unanswered, and after ``start_timeout_s`` its outcome is
unknown; ``release_starts`` acts on them late (SIGCONT), ``drop_starts`` forgets them (the stopped shepherd killed).
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from ..domain import IdentityRecord, Job, SpawnError, StartOutcomeUnknown
from ._base import Evidence, Executor, ExitStatus, JobHandle, Launch, Liveness, ProofOfEnd, check_log_writable


@dataclass
class MemoryJob:
    launch: Launch
    output: bytearray = field(default_factory=bytearray)
    terminated: trio.Event = field(default_factory=trio.Event)
    ignores_sigterm: bool = False
    exit_on_sigterm: int | None = None  # it handles SIGTERM by exiting with this code (the runner's 143)
    ended: trio.Event = field(default_factory=trio.Event)
    status: ExitStatus | None = None
    lost: bool = False
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    killed_by: int | None = None

    def print(self, text: str) -> None:
        self.output += text.encode() + b"\n"


Program = Callable[[MemoryJob], Awaitable[int]]


@dataclass
class MemoryHandle(JobHandle):
    job_id: str

    @property
    def record(self) -> IdentityRecord:
        return IdentityRecord("memory", {"container_id": f"memory-{self.job_id}"})

    def log_fields(self) -> dict[str, object]:
        return {"container_id": f"memory-{self.job_id}"}


class MemoryExecutor(Executor):
    mode = "memory"

    def __init__(self, programs: Mapping[str, Program], nursery: trio.Nursery) -> None:
        self.python = "python"
        self.programs = dict(programs)
        self.jobs: dict[str, MemoryJob] = {}
        self.started: list[str] = []  # job ids, in start order (a job started twice would show)
        self._nursery = nursery  # the "machine": jobs live here, not in any supervisor's job nursery
        self._reachable = trio.Event()
        self._reachable.set()
        self._starts_open = trio.Event()  # the machine acts on start requests (not held)
        self._starts_open.set()
        self.pending_starts: dict[str, trio.Event] = {}  # job id -> set once the machine acted on its request
        self.start_timeout_s = 30.0  # as the shepherd's: a start unanswered this long has an unknown outcome

    # -- what a test does to the world ----------------------------------------------------------------

    def kill(self, job_id: str, signum: int = signal.SIGKILL) -> None:
        job = self.jobs[job_id]
        if job.status is None:
            job.killed_by = signum
            job.scope.cancel()

    def lose(self, job_id: str) -> None:
        """The job ends and nothing records how (its record is gone with it)."""
        self.kill(job_id)
        self.jobs[job_id].lost = True

    # A gate is replaced only while it is open (set): nobody waits on an open gate, so no waiter is left on an
    # Event that will never be set (a second ``unreachable()`` once stranded whoever waited on the first).

    def unreachable(self) -> None:
        if self._reachable.is_set():
            self._reachable = trio.Event()

    def hold_starts(self) -> None:
        if self._starts_open.is_set():
            self._starts_open = trio.Event()

    def release_starts(self) -> None:
        self._starts_open.set()

    def drop_starts(self) -> None:
        """The requests the machine holds are gone, never acted on (the stopped shepherd was killed)."""
        for answered in self.pending_starts.values():
            answered.set()
        self.pending_starts.clear()

    def reachable(self) -> None:
        self._reachable.set()

    # -- the executor ---------------------------------------------------------------------------------

    async def unavailable(self) -> str | None:
        return None if self._reachable.is_set() else "engine unreachable"

    async def start(self, launch: Launch) -> MemoryHandle:
        await self._reachable.wait()
        program = self.programs.get(launch.kind)
        if program is None:
            raise SpawnError(f"no program for kind {launch.kind!r}")
        # INV-NO-START-WITHOUT-LOG, as the real executors keep it.
        await trio.to_thread.run_sync(check_log_writable, launch.log)
        if self._starts_open.is_set():
            self._make(launch, program)
            return MemoryHandle(launch.job_id)
        # Held: the request waits on the machine, which acts on it when released, whoever still waits for it.
        answered = self.pending_starts[launch.job_id] = trio.Event()
        self._nursery.start_soon(self._start_when_released, launch, program, answered)
        with trio.move_on_after(self.start_timeout_s):
            await answered.wait()
        if launch.job_id not in self.jobs:
            why = "not answered in time" if not answered.is_set() else "dropped before it was acted on"
            raise StartOutcomeUnknown(f"the start was {why}")
        return MemoryHandle(launch.job_id)

    async def _start_when_released(self, launch: Launch, program: Program, answered: trio.Event) -> None:
        async with trio.open_nursery() as either:  # released, or dropped (answered without a job)

            async def until(event: trio.Event) -> None:
                await event.wait()
                either.cancel_scope.cancel()

            either.start_soon(until, self._starts_open)
            either.start_soon(until, answered)
        if self.pending_starts.get(launch.job_id) is answered:
            del self.pending_starts[launch.job_id]
            self._make(launch, program)
            answered.set()

    def _make(self, launch: Launch, program: Program) -> None:
        job = MemoryJob(launch)
        self.jobs[launch.job_id] = job
        self.started.append(launch.job_id)
        self._nursery.start_soon(self._run, job, program)

    async def _run(self, job: MemoryJob, program: Program) -> None:
        code: int | None = None
        with job.scope:
            code = await program(job)
        if code is None and job.killed_by == signal.SIGTERM and job.exit_on_sigterm is not None:
            code = job.exit_on_sigterm  # a program that catches SIGTERM and exits (the runner's "terminated")
        job.status = ExitStatus(code=code) if code is not None else ExitStatus(signal=job.killed_by or signal.SIGKILL)
        job.ended.set()

    async def wait(self, handle: JobHandle) -> ExitStatus | None:
        job = self.jobs[handle.job_id]
        await job.ended.wait()
        await self._reachable.wait()
        if job.lost:
            return None
        await self.collect(handle)
        return job.status

    async def collect(self, handle: JobHandle) -> None:
        job = self.jobs[handle.job_id]
        path: Path = job.launch.log
        data = bytes(job.output[: job.launch.log_max_bytes])

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        await trio.to_thread.run_sync(write)

    async def stop(self, handle: JobHandle, grace_s: float) -> None:
        job = self.jobs[handle.job_id]
        await self._reachable.wait()
        job.terminated.set()
        if not job.ignores_sigterm:
            self.kill(handle.job_id, signal.SIGTERM)
        await trio.sleep(grace_s)
        self.kill(handle.job_id, signal.SIGKILL)

    def gather_evidence(self, jobs: Sequence[Job], *, boot_id: str) -> list[Evidence]:
        if not self._reachable.is_set():
            return [Evidence(Liveness.UNKNOWN, detail="engine unreachable") for _ in jobs]
        out: list[Evidence] = []
        for row in jobs:
            job = self.jobs.get(row.job_id)
            if job is None and row.job_id in self.pending_starts and not row.spawned:
                out.append(Evidence(Liveness.UNKNOWN, detail="its start is not answered yet"))
                continue
            if job is None:
                out.append(Evidence(Liveness.DEAD if row.spawned else None))
                continue
            handle = MemoryHandle(row.job_id)
            found = handle.record if not row.spawned else None
            if job.status is None:
                out.append(Evidence(Liveness.ALIVE, handle=handle, found=found))
            elif job.lost:
                out.append(Evidence(Liveness.DEAD, found=found))
            else:
                out.append(Evidence(Liveness.DEAD, exit_status=job.status, handle=handle, found=found))
        return out

    def proof_of_end(self, jobs: Sequence[Job]) -> list[ProofOfEnd | None]:
        """A job of this machine (a shared engine) under the row's recorded identity that ended with its status on
        record; anything else (running, not here, lost, the engine unreachable) is no proof."""
        out: list[ProofOfEnd | None] = []
        for row in jobs:
            job = self.jobs.get(row.job_id)
            handle = MemoryHandle(row.job_id)
            if (
                not self._reachable.is_set()
                or job is None
                or job.status is None
                or job.lost
                or row.identity != handle.record
            ):
                out.append(None)
                continue
            out.append(ProofOfEnd(job.status, f"memory job {row.job_id} ended", handle))
        return out
