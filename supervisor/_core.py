"""The supervisor core: drain (promotion), one monitor per running job, cancel, and reconcile.

Ownership: every monitor runs in the ``job_nursery`` handed to ``Supervisor.attach`` by the root of the nursery
tree (see ``_server.py``), and so does the reader of this boot's shepherd. Nothing is spawned outside that tree,
so no monitor can be lost or outlive the supervisor; cancelling the job nursery (shutdown) stops watching jobs but
never kills them: the shepherd keeps them, and the next boot adopts them.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio

from ._absence import AbsenceJudge
from ._config import Config
from ._errors import SpawnError, SupervisorError, ValidationError
from ._events import EventBus, EventName, JobEvent, log_event
from ._identity import Liveness, ProcessIdentity, probe
from ._kinds import KindCatalog, coalesce_key
from ._logging import get_logger
from ._metrics import Metrics, Snapshot
from ._model import Job, JobStatus
from ._registry import EnqueueResult, NewJob, ProcessRecord, hash_token
from ._spawn import (
    ExitStatus,
    JobFiles,
    Shepherd,
    ShepherdLost,
    StartedJob,
    job_environment,
    open_verified_pidfd,
    read_exit_file,
    read_start_file,
    signal_by_identity,
)
from ._store import AsyncRegistry
from ._webhook import WebhookSender

log = get_logger()

# Environment variables the supervisor itself reads that a job must never inherit.
# (systemd's notify socket too: only the supervisor speaks for itself to its service manager.)
_PRIVATE_ENV = (
    "PODCAST_JOB_API_TOKEN",
    "PODCAST_JOB_API_TOKEN_FILE",
    "PODCAST_JOB_WEBHOOK_SECRET",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
)
MAX_STAGE_LEN = 200
MAX_BATCH = 1000  # jobs in one POST /api/jobs/batch
PROMOTE_BATCH = 64  # rows promoted in one transaction, at most
# Once an adopted job's process is gone, its shepherd records the exit at reap (milliseconds); this bounds the wait
# for that record while the shepherd is alive.
EXIT_RECORD_WAIT_S = 10.0
EXIT_RECORD_POLL_S = 0.02


@dataclass(frozen=True)
class QueueState:
    paused: bool
    running: int
    queued: int
    max_concurrent: int


@dataclass(frozen=True)
class ReconcileDetail:
    job_id: str
    action: str  # "failed" | "stale" | "keep" | "untouched"
    reason: str
    liveness: str | None
    prior_boot: bool


@dataclass(frozen=True)
class ReconcileReport:
    updated: int
    details: list[ReconcileDetail]


@dataclass(frozen=True)
class Decision:
    """What reconcile does with one RUNNING row."""

    action: str  # "finalize" | "finalize_exit" (the recorded exit status decides) | "keep" | "untouched"
    status: JobStatus | None = None
    reason: str = ""
    warn: bool = False
    adopt: bool = False  # start a monitor for a live job nobody here watches (a prior boot's, usually)


def judge(
    job: Job,
    *,
    this_boot: bool,
    monitored: bool,
    liveness: Liveness | None,
    past_window: bool,
    stale_marks_live_processes: bool,
    exit_recorded: bool = False,
    shepherd_alive: bool = False,
) -> Decision:
    """The reconcile rules as one pure function (issue 3's table, issue 10's adoption; ADR-0001, ADR-0003).

    ``exit_recorded``: the job's shepherd wrote its true exit status. ``shepherd_alive``: the shepherd that started
    it still runs (so a dead job's exit is about to be recorded). A prior boot's row without a process is judged
    after the shepherd's start file was looked for (and its identity recorded in the row when found).
    """
    if this_boot and not job.spawned:
        # INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: this boot promoted it and is spawning it right now.
        return Decision("untouched", reason="spawn_window")
    if not this_boot and not job.spawned:
        # INV-IDENTITY-BEFORE-PROGRAM: no start file, so the program provably never ran.
        return Decision("finalize", JobStatus.FAILED, "orphan_reconciled_spawn_window")
    # This boot's monitor is the authority on what it watches: it finalizes with the real exit status.
    if liveness is Liveness.DEAD and not monitored:
        if exit_recorded:
            # INV-TRUE-OUTCOME: the shepherd reaped it and wrote how it ended; that, not a guess, is the outcome.
            return Decision("finalize_exit", reason="exit_recorded")
        if shepherd_alive:
            return Decision("keep", reason="exit_being_recorded", adopt=True)
        return Decision("finalize", JobStatus.FAILED, "orphan_reconciled_dead_pid")
    adopt = liveness is Liveness.ALIVE and not monitored
    if past_window:
        if stale_marks_live_processes:
            # Only an operator evicts a live job: this path is the manual reconcile route.
            return Decision("finalize", JobStatus.STALE, "wall_clock_stale")
        # INV-SWEEP-NEVER-EVICTS-LIVE: an unattended sweep only warns.
        return Decision("keep", reason="wall_clock_exceeded_kept_alive", warn=True, adopt=adopt)
    if liveness is Liveness.UNKNOWN and not monitored:
        # INV-UNKNOWN-KEEPS-SLOT: absence of evidence is not evidence of death.
        return Decision("keep", reason="liveness_unknown_kept", warn=True)
    if adopt:
        return Decision("keep", reason="adopted", adopt=True)
    return Decision("keep", reason="alive")


def identity_of(job: Job) -> ProcessIdentity | None:
    """INV-PID-NEEDS-BOOT-AND-IDENTITY: a bare pid is no identity."""
    if job.pid is None or job.pid_start_time is None or job.kernel_boot_id is None:
        return None
    return ProcessIdentity(job.pid, job.pid_start_time, job.kernel_boot_id)


def liveness_of(job: Job) -> Liveness | None:
    """Tri-state evidence for a spawned row; None for a row with no process recorded yet."""
    if not job.spawned:
        return None
    identity = identity_of(job)
    if identity is None:
        return Liveness.UNKNOWN  # a pid without its start time, or a container this mode cannot ask about
    return probe(identity)


@dataclass(frozen=True)
class Evidence:
    """What reconcile knows of one RUNNING row, gathered (blocking) before any registry lock."""

    liveness: Liveness | None
    identity: ProcessIdentity | None
    exit_status: ExitStatus | None  # the shepherd's record of how the process ended
    shepherd_alive: bool  # the shepherd that started it still runs
    from_start_file: bool  # a prior boot's row without a pid, whose process the shepherd's start file names


def gather_evidence(job: Job, log_dir: Path, *, this_boot: bool) -> Evidence:
    files = JobFiles.for_job(job, log_dir)
    start = read_start_file(files.pid)
    identity = identity_of(job)
    from_start_file = False
    if not job.spawned and not this_boot and start is not None and start.identity is not None:
        identity, from_start_file = start.identity, True
    if identity is not None:
        liveness: Liveness | None = probe(identity)
    else:
        liveness = Liveness.UNKNOWN if job.spawned else None
    exit_status = None
    if identity is not None and liveness is Liveness.DEAD:
        exit_status = read_exit_file(files.exit, identity.pid)
    shepherd_alive = bool(start and start.shepherd and probe(start.shepherd) is Liveness.ALIVE)
    return Evidence(liveness, identity, exit_status, shepherd_alive, from_start_file)


def _shepherd_alive(files: JobFiles) -> bool:
    start = read_start_file(files.pid)
    return bool(start and start.shepherd and probe(start.shepherd) is Liveness.ALIVE)


def outcome(
    status: ExitStatus,
    *,
    cancel_requested: bool,
    exit_reasons: Mapping[int, str],
    failure_reasons: Mapping[int, str] | None = None,
) -> tuple[JobStatus, str | None]:
    if cancel_requested:
        return JobStatus.CANCELLED, "cancelled"
    if status.signal is not None:
        try:
            name = signal.Signals(status.signal).name
        except ValueError:
            name = f"signal_{status.signal}"
        return JobStatus.FAILED, f"killed_by_{name}"
    code = status.code
    assert code is not None
    if code == 0:
        return JobStatus.SUCCEEDED, None
    if code in exit_reasons:
        # INV-BUDGET-IS-AN-OUTCOME: a planned stop (budget spent) is not a crash.
        return JobStatus.SUCCEEDED, exit_reasons[code]
    if failure_reasons and code in failure_reasons:
        return JobStatus.FAILED, failure_reasons[code]
    return JobStatus.FAILED, f"exit_code_{code}"


@dataclass
class _Running:
    """A job this boot watches (one it started, or one it adopted): set ``cancel`` to stop it.

    ``adopted``: watched through its identity (pidfd, then the exit file), not through this boot's shepherd: a prior
    boot's job, or one whose shepherd died.
    """

    job_id: str
    cancel: trio.Event = field(default_factory=trio.Event)
    pid: int | None = None
    identity: ProcessIdentity | None = None
    adopted: bool = False


class _Unwatchable(SupervisorError):
    """A job whose process can no longer be watched (shepherd gone, identity unknown): the sweeper judges it."""


class Supervisor:
    """The rules of job supervision. The HTTP layer and the CLI only translate into calls on this."""

    def __init__(
        self,
        config: Config,
        kinds: KindCatalog,
        registry: AsyncRegistry,
        *,
        boot_id: str | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.kinds = kinds
        self.registry = registry
        self.boot_id = boot_id or secrets.token_hex(16)
        self.heartbeat_base_url: str | None = None
        self._base_env = {k: v for k, v in (base_env if base_env is not None else os.environ).items()}
        for name in _PRIVATE_ENV:
            self._base_env.pop(name, None)
        self._running: dict[str, _Running] = {}
        self._drain_lock = trio.Lock()
        self._drain_wanted = trio.Event()
        self._job_nursery: trio.Nursery | None = None
        # Resolved once, so that jobs' cwd and log paths stay put whatever the supervisor's cwd does later.
        self.data_dir = config.data_dir.resolve()
        self.log_dir = config.jobs_log_dir.resolve()
        self.shepherd = Shepherd(stderr_path=config.viewer_dir.resolve() / "shepherd.log")
        # The event seam: every change to a job is announced here; the log is the first subscriber.
        self.events = EventBus()
        self.events.subscribe(log_event)
        # The durable copy of each event is the registry's outbox row, written in the change's own transaction
        # (see _events.py); the sender (a root-nursery task) delivers it and is woken by the bus.
        registry.sync.boot_id = self.boot_id
        registry.sync.outbox_enabled = config.webhook_url is not None
        self.webhooks = WebhookSender(config, registry)
        self.events.subscribe(self.webhooks.wake)
        self.metrics = Metrics()
        self.events.subscribe(self.metrics.on_event)
        self.absence = AbsenceJudge(config, registry, self.events, self.boot_id, self._stop_stalled)
        self._stall_stops: set[str] = set()  # jobs being stopped because they stalled (stall_action = terminate)
        self.last_sweep_done: float | None = None  # trio.current_time() when the last sweep completed

    def attach(self, job_nursery: trio.Nursery) -> None:
        """Give the supervisor the nursery that owns every monitor (and this boot's shepherd reader)."""
        self._job_nursery = job_nursery
        self.shepherd.attach(job_nursery)

    # -- logging ------------------------------------------------------------------------------------

    def _log_transition(self, job: Job, from_status: str, to_status: str, reason: str | None, **extra: Any) -> None:
        """Announce a status change on the event bus (``job`` is the row after it): the log line is a subscriber."""
        previous = None if from_status == "-" else from_status
        self.events.emit(JobEvent(EventName.TRANSITION, job, previous, reason, self.boot_id, extra))

    # -- enqueue and drain --------------------------------------------------------------------------

    def _validate(self, kind_name: object, params: object) -> NewJob:
        kind = self.kinds.get(kind_name)
        validated = kind.validate_params({} if params is None else params)
        key = coalesce_key(kind.name, validated) if kind.coalesce else None
        return NewJob(kind.name, validated, kind.render_argv(validated), key)

    async def enqueue(self, kind_name: object, params: object) -> EnqueueResult:
        """Validate and store a job, wake the drainer, and answer: the spawn never delays the caller."""
        new = self._validate(kind_name, params)
        result = await self.registry.enqueue(new.kind, new.params, new.argv, coalesce_key=new.coalesce_key)
        self._announce_enqueued([result])
        return result

    async def enqueue_many(self, items: object) -> list[EnqueueResult]:
        """Validate every item first (a ``ValidationError`` names the element, ``jobs[3].params.seconds``), then
        store them all in one transaction: all or nothing."""
        if not isinstance(items, list) or not items:
            raise ValidationError("jobs must be a non-empty list", field="jobs")
        if len(items) > MAX_BATCH:
            raise ValidationError(f"at most {MAX_BATCH} jobs in one batch, not {len(items)}", field="jobs")
        batch: list[NewJob] = []
        for index, item in enumerate(items):
            where = f"jobs[{index}]"
            if not isinstance(item, Mapping):
                raise ValidationError(f"{where} must be an object with kind and params", field=where)
            unknown = sorted(set(item) - {"kind", "params"})
            if unknown:
                raise ValidationError(f"{where}: unknown field {unknown[0]!r}", field=f"{where}.{unknown[0]}")
            if "kind" not in item:
                raise ValidationError(f"{where}: missing field 'kind'", field=f"{where}.kind")
            try:
                batch.append(self._validate(item["kind"], item.get("params")))
            except ValidationError as exc:
                raise ValidationError(f"{where}: {exc}", field=f"{where}.{exc.field}" if exc.field else where) from None
        results = await self.registry.enqueue_many(batch)
        self._announce_enqueued(results)
        return results

    def _announce_enqueued(self, results: list[EnqueueResult]) -> None:
        for result in results:
            if result.coalesced:
                log.info("job_coalesced", job_id=result.job.job_id, kind=result.job.kind)
            else:
                self._log_transition(result.job, "-", "queued", "enqueued")
        self.wake_drainer()

    def wake_drainer(self) -> None:
        """Ask the drainer for a drain soon; many wakes before it runs make one drain."""
        self._drain_wanted.set()

    async def run_drainer(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The one task that drains on demand (after an enqueue, a job's end, a cancel); owned by the root nursery."""
        task_status.started()
        while True:
            await self._drain_wanted.wait()
            self._drain_wanted = trio.Event()
            await self._drain_logged()

    async def is_paused(self) -> bool:
        return await trio.to_thread.run_sync(self.config.pause_flag_path.exists)

    async def drain(self) -> list[Job]:
        """Promote and spawn while a slot is free and promotion is not paused.

        Contract: when drain returns, every promotable job has been spawned and its identity recorded, and no
        job has been waited for (each one's monitor runs in the job nursery). Free slots are filled in one
        transaction, and their jobs started together.
        """
        if self._job_nursery is None:
            raise SupervisorError("drain needs a job nursery: call attach() first")
        started: list[Job] = []
        async with self._drain_lock:
            while not await self.is_paused():
                tokens = [secrets.token_urlsafe(32) for _ in range(min(self.config.max_concurrent, PROMOTE_BATCH))]
                jobs = await self.registry.promote_queued(
                    self.config.max_concurrent,
                    boot_id=self.boot_id,
                    token_hashes=[hash_token(token) for token in tokens],
                    log_dir=self.log_dir,
                )
                if not jobs:
                    break
                started.extend(await self._start_promoted(jobs, tokens))
        return started

    async def _start_promoted(self, jobs: list[Job], tokens: list[str]) -> list[Job]:
        """Spawn freshly promoted jobs together, record their identities in one transaction, start their monitors."""
        assert self._job_nursery is not None
        outcomes: dict[str, StartedJob | Exception] = {}

        async def spawn_one(job: Job, token: str) -> None:
            try:
                outcomes[job.job_id] = await self._spawn(job, token)
            except Exception as exc:  # judged below, job by job
                outcomes[job.job_id] = exc

        for job in jobs:
            self._log_transition(job, "queued", "running", "promoted")
            self._running[job.job_id] = _Running(job.job_id)
        async with trio.open_nursery() as spawns:
            for job, token in zip(jobs, tokens, strict=False):
                spawns.start_soon(spawn_one, job, token)

        spawned: list[Job] = []
        records: list[ProcessRecord] = []
        for job in jobs:
            got = outcomes[job.job_id]
            if isinstance(got, Exception):
                # INV-SPAWN-FAILURE-FREES-SLOT: whatever goes wrong in one spawn (a SpawnError, or a defect such as
                # an argv the OS cannot take), the promoted row is finalized, never left holding a slot.
                del self._running[job.job_id]
                if not isinstance(got, SpawnError):
                    log.error("spawn_crashed", job_id=job.job_id, error=repr(got))
                reason = str(got) if isinstance(got, SpawnError) else f"{type(got).__name__}: {got}"
                await self._finalize(job, JobStatus.FAILED, f"spawn_failed: {reason}"[:500])
                continue
            handle = self._running[job.job_id]
            handle.pid, handle.identity = got.pid, got.identity
            identity = got.identity
            records.append(
                ProcessRecord(
                    job.job_id,
                    pid=got.pid,
                    pid_start_time=identity.start_time if identity else None,
                    kernel_boot_id=identity.kernel_boot_id if identity else None,
                )
            )
            spawned.append(job)
        if records:
            try:
                spawned = await self.registry.set_job_processes(records)
            except SupervisorError:
                # The processes exist: they must still get their monitors (to be finalized, cancellable). Their
                # identities are in the shepherd's start files too, where a later boot looks for them.
                log.exception("job_identity_not_recorded", job_ids=[r.job_id for r in records])
        for job in spawned:
            handle = self._running[job.job_id]
            if job.cancel_requested:
                handle.cancel.set()  # a cancel that arrived in the spawn window is carried out now
            log.info("job_spawned", job_id=job.job_id, kind=job.kind, pid=handle.pid, boot_id=self.boot_id)
            await self._job_nursery.start(self._monitor, handle, job)
        return spawned

    async def _spawn(self, job: Job, token: str) -> StartedJob:
        assert job.log_path is not None
        extra = {
            "PODCAST_JOB_ID": job.job_id,
            "PODCAST_JOB_TOKEN": token,
            "PODCAST_JOB_DATA_DIR": str(self.data_dir),
        }
        if self.heartbeat_base_url is not None:
            extra["PODCAST_JOB_HEARTBEAT_URL"] = f"{self.heartbeat_base_url}/api/jobs/{job.job_id}/heartbeat"
        try:
            await trio.to_thread.run_sync(lambda: self.log_dir.mkdir(parents=True, exist_ok=True))
        except OSError as exc:
            raise SpawnError(f"cannot create the job log directory {self.log_dir}: {exc.strerror or exc}") from exc
        return await self.shepherd.start_job(
            job.job_id,
            job.argv,
            env=job_environment(self._base_env, extra),
            cwd=self.data_dir,
            files=JobFiles.for_log(Path(job.log_path)),
            log_max_bytes=self.config.log_max_bytes,
        )

    # -- the monitor --------------------------------------------------------------------------------

    async def _monitor(self, handle: _Running, job: Job, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Wait for one job to end, finalize its row with its true outcome, then drain. Owned by the job nursery.

        Cancelling this task (supervisor shutdown) stops the watching, never the job.
        """
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._carry_out_cancel, handle)
                status = await self._wait_exit(handle, job)
                nursery.cancel_scope.cancel()
            await self._finish(job, status, cancelled=handle.cancel.is_set())
        except _Unwatchable as exc:
            # INV-UNKNOWN-KEEPS-SLOT: the row stays RUNNING; the sweeper judges it on whatever evidence exists.
            log.warning("job_unwatchable", job_id=job.job_id, why=str(exc))
        except SupervisorError:
            # The row stays RUNNING; with no monitor left, the sweeper's rules finalize it.
            log.exception("monitor_failed", job_id=job.job_id)
        finally:
            self._running.pop(job.job_id, None)
            self.wake_drainer()

    async def _wait_exit(self, handle: _Running, job: Job) -> ExitStatus | None:
        """The job's exit status; None when its process is gone and no exit was recorded (its shepherd died)."""
        if not handle.adopted:
            try:
                return await self.shepherd.wait_exit(job.job_id)
            except ShepherdLost:
                handle.adopted = True  # from now on, watched and signalled through its identity
                log.warning("job_watched_by_identity", job_id=job.job_id, pid=handle.pid, why="shepherd lost")
        if handle.identity is None:
            raise _Unwatchable("no recorded process identity to watch")
        return await self._await_exit_by_identity(handle.identity, JobFiles.for_job(job, self.log_dir))

    async def _await_exit_by_identity(self, identity: ProcessIdentity, files: JobFiles) -> ExitStatus | None:
        """Wait for a process this boot's shepherd does not own to exit (pidfd), then for its recorded exit."""
        pidfd = await trio.to_thread.run_sync(open_verified_pidfd, identity)
        if pidfd is not None:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                trio.lowlevel.notify_closing(pidfd)
                os.close(pidfd)
        # Gone. Its shepherd (if alive) records the exit at reap, within milliseconds: there is no event to wait on
        # across processes, so look for the record, bounded, while that shepherd lives.
        with trio.move_on_after(EXIT_RECORD_WAIT_S):
            while True:
                status = await trio.to_thread.run_sync(read_exit_file, files.exit, identity.pid)
                if status is not None:
                    return status
                if not await trio.to_thread.run_sync(_shepherd_alive, files):
                    # One last look: it may have written the record just before it exited.
                    return await trio.to_thread.run_sync(read_exit_file, files.exit, identity.pid)
                await trio.sleep(EXIT_RECORD_POLL_S)
        return None

    async def _finish(
        self, job: Job, status: ExitStatus | None, *, cancelled: bool, expect_pid: int | None = None
    ) -> bool:
        """Finalize a job whose process has ended: its true outcome, or an orphan when no exit was recorded.

        True when this call changed the row (a terminal row is left alone)."""
        kind = self.kinds.get(job.kind) if job.kind in self.kinds else None

        def decide(current: Job) -> tuple[JobStatus, str | None]:
            """Called inside the finalize transaction: a cancel requested until this instant counts."""
            if job.job_id in self._stall_stops and not current.cancel_requested:
                return JobStatus.STALE, "progress_stalled"  # stopped by the sweeper (stall_action = terminate)
            cancel_requested = cancelled or current.cancel_requested
            if status is None:
                # The process is gone and nobody recorded how it ended (its shepherd was killed): never a guess.
                if cancel_requested:
                    return JobStatus.CANCELLED, "cancelled"
                return JobStatus.FAILED, "orphan_reconciled_dead_pid"
            return outcome(
                status,
                cancel_requested=cancel_requested,
                exit_reasons=kind.exit_reasons if kind else {},
                failure_reasons=kind.failure_reasons if kind else {},
            )

        result = await self.registry.finalize(
            job.job_id, decide, exit_code=status.returncode if status else None, expect_pid=expect_pid
        )
        self._stall_stops.discard(job.job_id)
        if not result.changed:
            return False
        final = result.job
        self._log_transition(
            final, str(result.previous), str(final.status), final.error_reason, exit_code=final.exit_code
        )
        if final.status is JobStatus.SUCCEEDED and kind is not None and kind.then:
            await self._enqueue_follow_up(final, kind.then)
        return True

    async def _carry_out_cancel(self, handle: _Running) -> None:
        await handle.cancel.wait()
        log.info("job_cancel_signal", job_id=handle.job_id, signal="SIGTERM", pid=handle.pid)
        await self._signal(handle, signal.SIGTERM)
        await trio.sleep(self.config.cancel_grace_s)
        log.warning("job_cancel_signal", job_id=handle.job_id, signal="SIGKILL", pid=handle.pid)
        await self._signal(handle, signal.SIGKILL)

    async def _signal(self, handle: _Running, signum: int) -> None:
        """Signal a watched job's process group: through its shepherd, else only by verified identity."""
        if not handle.adopted and await self.shepherd.signal(handle.job_id, signum):
            return
        if handle.identity is None:
            log.error("job_not_signalled", job_id=handle.job_id, pid=handle.pid, why="no verified identity")
            return
        # INV-NEVER-BLIND-SIGNAL: pidfd first, identity checked, then the signal.
        _, pidfd = await trio.to_thread.run_sync(signal_by_identity, handle.identity, signum)
        if pidfd is not None:
            os.close(pidfd)

    async def _adopt(self, job: Job, identity: ProcessIdentity, *, cancel: bool = False) -> None:
        """Watch a job this boot did not start (a prior boot's): its monitor finalizes it with its true outcome."""
        if job.job_id in self._running:
            if cancel:
                self._running[job.job_id].cancel.set()
            return
        assert self._job_nursery is not None
        handle = _Running(job.job_id, pid=identity.pid, identity=identity, adopted=True)
        if cancel:
            handle.cancel.set()
        self._running[job.job_id] = handle
        await self._announce_adopted(job)
        await self._job_nursery.start(self._monitor, handle, job)

    async def _announce_adopted(self, job: Job) -> None:
        try:
            job = await self.registry.record_event(job.job_id, str(EventName.ADOPTED), "adopted")
        except SupervisorError:
            log.exception("adoption_event_not_recorded", job_id=job.job_id)  # the adoption itself goes on
        self.events.emit(
            JobEvent(EventName.ADOPTED, job, str(job.status), "adopted", self.boot_id, {"prior_boot": job.boot_id})
        )

    async def _finalize(
        self,
        job: Job,
        status: JobStatus,
        reason: str | None,
        *,
        exit_code: int | None = None,
        expect_pid: int | None = None,
    ) -> bool:
        result = await self.registry.finalize(
            job.job_id, status, reason=reason, exit_code=exit_code, expect_pid=expect_pid
        )
        if result.changed:
            self._log_transition(result.job, str(job.status), str(status), reason, exit_code=exit_code)
        return result.changed

    async def _enqueue_follow_up(self, parent: Job, then: str) -> None:
        kind = self.kinds.get(then)
        params = {name: parent.params[name] for name in kind.params if name in parent.params}
        try:
            result = await self.enqueue(then, params)
        except ValidationError as exc:
            log.error("follow_up_not_enqueued", job_id=parent.job_id, then=then, error=str(exc))
            return
        log.info(
            "follow_up_enqueued",
            job_id=parent.job_id,
            then=then,
            follow_up=result.job.job_id,
            coalesced=result.coalesced,
        )

    async def _drain_logged(self) -> None:
        try:
            await self.drain()
        except SupervisorError:
            log.exception("drain_failed")

    # -- cancel -------------------------------------------------------------------------------------

    async def cancel(self, job_id: str) -> Job:
        """Cancel a job (idempotent). Never sends a blind signal (INV-NEVER-BLIND-SIGNAL)."""
        result = await self.registry.request_cancel(job_id)
        job = result.job
        if job.status is JobStatus.CANCELLED and result.changed:
            self._log_transition(job, "queued", "cancelled", job.error_reason)
            return job
        if job.status is not JobStatus.RUNNING:
            return job  # terminal: returned unchanged
        handle = self._running.get(job_id)
        if handle is not None:
            handle.cancel.set()  # the monitor signals the group; in the spawn window, as soon as spawn completes
            return job
        await self._cancel_unmonitored(job)
        return await self.registry.get(job_id)

    async def _cancel_unmonitored(self, job: Job) -> None:
        """A running row with no monitor here: a prior boot's job (or one whose monitor failed).

        A process whose identity is verified alive is adopted and stopped (SIGTERM, SIGKILL after the grace);
        its monitor finalizes it ``cancelled`` once it is gone. Anything else is never signalled.
        """
        identity = identity_of(job)
        if identity is not None and await trio.to_thread.run_sync(probe, identity) is Liveness.ALIVE:
            await self._adopt(job, identity, cancel=True)
            return
        liveness = await trio.to_thread.run_sync(liveness_of, job)
        if job.spawned and liveness is not Liveness.DEAD:
            log.error(
                "cancel_left_process_alone",
                job_id=job.job_id,
                pid=job.pid,
                container_id=job.container_id,
                liveness=liveness.value if liveness else None,
                why="the recorded process identity could not be verified; stop any surviving work by hand",
            )
        await self._finalize(job, JobStatus.CANCELLED, "cancelled_unverified_process_left_alone")
        self.wake_drainer()

    # -- reconcile ----------------------------------------------------------------------------------

    async def reconcile(self, *, stale_marks_live_processes: bool) -> ReconcileReport:
        """Bring RUNNING rows in line with the evidence. Probes run before any registry lock is taken."""
        rows = await self.registry.running_jobs()
        evidence = await trio.to_thread.run_sync(
            lambda: [gather_evidence(job, self.log_dir, this_boot=job.boot_id == self.boot_id) for job in rows]
        )
        now = datetime.now(UTC)
        details: list[ReconcileDetail] = []
        updated = 0
        for job, found in zip(rows, evidence, strict=True):
            this_boot = job.boot_id == self.boot_id
            liveness = found.liveness
            if found.from_start_file and found.identity is not None:
                # A prior boot died between the spawn and recording the pid: the shepherd's start file names the
                # process, so it is judged (and adopted) like any recorded one, never freed as a spawn window.
                identity = found.identity
                job = await self.registry.set_job_process(
                    job.job_id,
                    pid=identity.pid,
                    pid_start_time=identity.start_time,
                    kernel_boot_id=identity.kernel_boot_id,
                )
                if job.status is not JobStatus.RUNNING:
                    continue
            decision = judge(
                job,
                this_boot=this_boot,
                monitored=job.job_id in self._running,
                liveness=liveness,
                past_window=self._past_window(job, now),
                stale_marks_live_processes=stale_marks_live_processes,
                exit_recorded=found.exit_status is not None,
                shepherd_alive=found.shepherd_alive,
            )
            action = decision.action
            if decision.action == "finalize":
                assert decision.status is not None
                # expect_pid: the evidence was gathered before the lock; only act if the row is still that process.
                if await self._finalize(job, decision.status, decision.reason, expect_pid=job.pid):
                    updated += 1
                    action = str(decision.status)
                else:
                    action = "untouched"
            elif decision.action == "finalize_exit":
                assert found.exit_status is not None
                if await self._finish(job, found.exit_status, cancelled=False, expect_pid=job.pid):
                    updated += 1
                    action = str((await self.registry.get(job.job_id)).status)
                else:
                    action = "untouched"
            if decision.adopt and found.identity is not None and self._job_nursery is not None:
                await self._adopt(job, found.identity)
            if decision.warn:
                log.warning(
                    "reconcile_kept_slot",
                    job_id=job.job_id,
                    reason=decision.reason,
                    liveness=liveness.value if liveness else None,
                    pid=job.pid,
                    prior_boot=not this_boot,
                    started_at=job.started_at,
                )
            details.append(
                ReconcileDetail(
                    job.job_id, action, decision.reason, liveness.value if liveness else None, not this_boot
                )
            )
        return ReconcileReport(updated, details)

    def _past_window(self, job: Job, now: datetime) -> bool:
        if self.config.stale_after_s is None or job.started_at is None:
            return False
        return now - datetime.fromisoformat(job.started_at) > timedelta(seconds=self.config.stale_after_s)

    async def sweep(self) -> None:
        """One sweeper pass: reconcile, judge absence, then drain. A failing step still lets the next run.

        ``last_sweep_done`` is set only when a pass completes: a wedged sweep stops moving it (the watchdog reads it).
        """
        started = trio.current_time()
        details: list[ReconcileDetail] = []
        try:
            details = (await self.reconcile(stale_marks_live_processes=False)).details
        except Exception:
            log.exception("reconcile_failed")
        self.metrics.liveness_unknown.inc(len([d for d in details if d.liveness == Liveness.UNKNOWN.value]))
        try:
            # INV-STALE-SET-BY-SUPERVISOR: progress age is judged here, after reconcile, on this sweep's evidence.
            await self.absence.judge({d.job_id: Liveness(d.liveness) if d.liveness else None for d in details})
        except Exception:
            log.exception("absence_judgement_failed")
        await self._drain_logged()
        self.last_sweep_done = trio.current_time()
        self.metrics.sweep_duration.observe(self.last_sweep_done - started)

    async def _stop_stalled(self, job: Job) -> None:
        """stall_action = terminate: stop a stalled job whose process is verified alive, as a cancel does.

        The row stays RUNNING (and holds its slot) until the job's monitor sees the process gone; only then is it
        finalized ``stale`` / ``progress_stalled``.
        """
        if job.job_id in self._stall_stops:
            return
        handle = self._running.get(job.job_id)
        identity = identity_of(job)
        if handle is None and identity is None:
            log.warning("stalled_job_not_terminated", job_id=job.job_id, why="no verified process identity")
            return
        self._stall_stops.add(job.job_id)
        log.warning("stalled_job_terminating", job_id=job.job_id, pid=job.pid, grace_s=self.config.cancel_grace_s)
        if handle is not None:
            handle.cancel.set()  # its monitor: SIGTERM, SIGKILL after the grace, then finalize once it is gone
        elif identity is not None:
            await self._adopt(job, identity, cancel=True)

    async def operator_reconcile(self) -> ReconcileReport:
        """The manual reconcile route: an operator may evict a live job past the wall-clock window."""
        report = await self.reconcile(stale_marks_live_processes=True)
        await self._drain_logged()
        return report

    # -- queue, reads, heartbeats, logs --------------------------------------------------------------

    async def render_metrics(self) -> bytes:
        """``GET /metrics``: the counters as they stand and the registry's state as of now (see ``_metrics.py``)."""
        snapshot = Snapshot(
            counts=await self.registry.counts(),
            paused=await self.is_paused(),
            max_concurrent=self.config.max_concurrent,
            running=await self.registry.running_jobs(),
            outbox_depth=await self.registry.outbox_depth(),
            deliveries=dict(self.webhooks.outcomes),
        )
        return self.metrics.render(snapshot)

    async def queue_state(self) -> QueueState:
        counts = await self.registry.counts()
        return QueueState(await self.is_paused(), counts["running"], counts["queued"], self.config.max_concurrent)

    async def pause(self) -> QueueState:
        def touch() -> None:
            self.config.pause_flag_path.parent.mkdir(parents=True, exist_ok=True)
            self.config.pause_flag_path.touch()

        await trio.to_thread.run_sync(touch)
        log.warning("queue_paused", flag=str(self.config.pause_flag_path))
        return await self.queue_state()

    async def resume(self) -> QueueState:
        await trio.to_thread.run_sync(lambda: self.config.pause_flag_path.unlink(missing_ok=True))
        log.info("queue_resumed")
        if self._job_nursery is not None:
            await self.drain()
        return await self.queue_state()

    async def get(self, job_id: str) -> Job:
        return await self.registry.get(job_id)

    async def list_jobs(
        self, *, status: str | None = None, kind: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[Job], str | None]:
        return await self.registry.list_jobs(status=status, kind=kind, limit=limit, cursor=cursor)

    async def heartbeat(self, job_id: str, token: str, read_body: Callable[[], Awaitable[object]]) -> Job:
        """Record a child's heartbeat; see ``SqliteRegistry.record_heartbeat``.

        The token is checked before the body is even read (``read_body`` raises the HTTP layer's 400/413/415), so a
        caller without it learns nothing: not whether the job exists, nor what body would have been accepted.
        """
        await self.registry.check_job_token(job_id, token)
        body = await read_body()
        if not isinstance(body, Mapping):
            raise ValidationError("body must be a JSON object", field="body")
        unknown = sorted(set(body) - {"completed_units", "total_units", "stage"})
        if unknown:
            raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
        completed = body.get("completed_units")
        if isinstance(completed, bool) or not isinstance(completed, int) or completed < 0:
            raise ValidationError("completed_units must be a non-negative integer", field="completed_units")
        total = body.get("total_units")
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
            raise ValidationError("total_units must be a non-negative integer or null", field="total_units")
        stage = body.get("stage")
        if stage is not None and (not isinstance(stage, str) or len(stage) > MAX_STAGE_LEN):
            raise ValidationError(f"stage must be a string of at most {MAX_STAGE_LEN} characters", field="stage")
        job = await self.registry.record_heartbeat(
            job_id, token, completed_units=completed, total_units=total, stage=stage
        )
        self.absence.tracker.beat(job)  # the monotonic time of this beat (and of progress, if the watermark rose)
        return job

    async def read_log(self, job_id: str, *, tail_bytes: int | None = None, offset: int | None = None) -> bytes:
        """A job's log: whole, its last ``tail_bytes``, or from byte ``offset`` on.

        The log file is append-only (capped, never rotated), so an offset stays valid while the file grows.
        """
        job = await self.registry.get(job_id)
        if job.log_path is None:
            return b""
        path = Path(job.log_path)

        def read() -> bytes:
            try:
                with path.open("rb") as fh:
                    if tail_bytes is not None:
                        size = fh.seek(0, os.SEEK_END)
                        fh.seek(max(0, size - tail_bytes))
                    elif offset is not None:
                        fh.seek(offset)
                    return fh.read()
            except FileNotFoundError:
                return b""

        return await trio.to_thread.run_sync(read)
