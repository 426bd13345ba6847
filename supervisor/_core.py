"""The supervisor core: drain (promotion), one monitor per running job, cancel, and reconcile.

Ownership: every monitor runs in the ``job_nursery`` handed to ``Supervisor.attach`` by the root of the nursery
tree (see ``_server.py``), and so does any task its executor owns (the shepherd's reader). Nothing is spawned outside
that tree, so no monitor can be lost or outlive the supervisor; cancelling the job nursery (shutdown) stops watching
jobs but never kills them: they belong to the shepherd or the engine, and the next boot adopts them.

How a job runs is the executor's business (``execution/``): this module holds the rules and speaks only of a handle
with an identity, a wait that returns an exit status (or nothing), a stop with a grace period, evidence gathered
before the lock, and adoption.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeGuard

import trio

from ._absence import AbsenceJudge
from ._beats import BeatBatcher, JobTokens
from ._registry import Beat, EnqueueResult, NewJob, ProcessRecord, PromoteRequest, hash_token
from ._store import AsyncRegistry
from .domain._config import Config
from .domain._errors import Conflict, RequestError, SpawnError, SupervisorError, Unauthorized, ValidationError
from .domain._kinds import KindCatalog, coalesce_key
from .domain._model import Job, JobStatus
from .execution import Evidence, Executor, ExitStatus, JobHandle, Launch, Unwatchable, create_executor
from .execution._identity import Liveness
from .execution.base import ORPHAN_DEAD_PID
from .observe._events import EventBus, EventName, JobEvent, log_event
from .observe._logging import get_logger
from .observe._metrics import Metrics, Snapshot
from .observe._webhook import WebhookSender

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
REFILL_SLOTS = 2  # rows a job's end promotes in its own finalize, at most (see _refill_tokens)
# A heartbeat's unit counts are stored as SQLite INTEGERs (64-bit signed): a larger number is refused, not a 500.
MAX_UNITS = 2**63 - 1


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
    exit_pending: bool = False,
    orphan_reason: str = ORPHAN_DEAD_PID,
) -> Decision:
    """The reconcile rules as one pure function (issue 3's table, issue 10's adoption; ADR-0001, ADR-0003).

    ``exit_recorded``: how the job ended is on record (its shepherd's exit file, the engine's exit code).
    ``exit_pending``: it is gone but that record is about to be written (its shepherd still runs). ``orphan_reason``:
    what this exec mode calls a dead job with no record. A prior boot's row without a process is judged after the
    executor looked for one (a start file, a labelled container) and recorded it in the row when found.
    """
    if this_boot and not job.spawned:
        # INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: this boot promoted it and is spawning it right now.
        return Decision("untouched", reason="spawn_window")
    if not this_boot and not job.spawned:
        if liveness is Liveness.UNKNOWN:
            # INV-UNKNOWN-KEEPS-SLOT: the engine could not be asked whether a container was ever made for it.
            return Decision("keep", reason="liveness_unknown_kept", warn=True)
        # INV-IDENTITY-BEFORE-PROGRAM: no start record, so the program provably never ran.
        if job.cancel_requested:
            return Decision("finalize", JobStatus.CANCELLED, "cancelled_before_start")
        return Decision("finalize", JobStatus.FAILED, "orphan_reconciled_spawn_window")
    # This boot's monitor is the authority on what it watches: it finalizes with the real exit status.
    if liveness is Liveness.DEAD and not monitored:
        if exit_recorded:
            # INV-TRUE-OUTCOME: how it ended is on record (reaped by its shepherd, kept by the engine): that, not a
            # guess, is the outcome.
            return Decision("finalize_exit", reason="exit_recorded")
        if exit_pending:
            return Decision("keep", reason="exit_being_recorded", adopt=True)
        if job.cancel_requested:
            return Decision("finalize", JobStatus.CANCELLED, "cancelled")  # asked to stop, and it is gone
        return Decision("finalize", JobStatus.FAILED, orphan_reason)
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


def outcome(
    status: ExitStatus,
    *,
    cancel_requested: bool,
    exit_reasons: Mapping[int, str],
    failure_reasons: Mapping[int, str] | None = None,
) -> tuple[JobStatus, str | None]:
    if cancel_requested:
        return JobStatus.CANCELLED, "cancelled"
    if status.oom_killed:
        # The engine names the OOM killer; any other 128 + N is a plain exit code (see execution/docker.py).
        return JobStatus.FAILED, "killed_out_of_memory"
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


def _is_unit_count(value: object) -> TypeGuard[int]:
    """A heartbeat's unit count: a JSON integer (not a bool) from 0 to MAX_UNITS."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_UNITS


def _is_utf8(text: str) -> bool:
    """False for a lone surrogate: valid JSON ("\\ud800"), but no UTF-8 to store (sqlite3 raised: a 500)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_beat(job_id: str, token: str, body: object) -> Beat:
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


@dataclass(frozen=True)
class _Finished:
    """A job's finalize: whether it changed the row, and the jobs promoted into its slot in the same transaction
    (None: no promotion was tried, or it failed; [] : nothing to promote, or paused)."""

    changed: bool
    promoted: list[Job] | None


@dataclass
class _Running:
    """A job this boot watches (one it started, or one it adopted): ``request_cancel`` stops it.

    ``handle`` is None only while the job is being started (the spawn window). ``on_cancel`` is set by the job's
    monitor while it waits for the job's end: it starts the stop then (a cancel in the spawn window is carried out
    as soon as the monitor starts).
    """

    job_id: str
    handle: JobHandle | None = None
    cancel_requested: bool = False
    on_cancel: Callable[[], None] | None = None

    def request_cancel(self) -> None:
        if self.cancel_requested:
            return
        self.cancel_requested = True
        if self.on_cancel is not None:
            self.on_cancel()


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
        executor: Executor | None = None,
    ) -> None:
        self.config = config
        self.kinds = kinds
        self.registry = registry
        self.boot_id = boot_id or secrets.token_hex(16)
        self.heartbeat_base_url: str | None = None
        env = {k: v for k, v in (base_env if base_env is not None else os.environ).items()}
        for name in _PRIVATE_ENV:
            env.pop(name, None)
        self._running: dict[str, _Running] = {}
        self._drain_lock = trio.Lock()
        self._drain_wanted = trio.Event()
        self._full_drain_wanted = False  # a wake that needs a promote round, not only the start of handed-off jobs
        self._handed_off: list[tuple[Job, str]] = []  # promoted by a job's finalize, for the drainer to start
        self._drain_held = False
        self._log_dir_made = False
        self._job_nursery: trio.Nursery | None = None
        # Resolved once, so that jobs' cwd and log paths stay put whatever the supervisor's cwd does later.
        self.data_dir = config.data_dir.resolve()
        self.log_dir = config.jobs_log_dir.resolve()
        # The exec mode is chosen here, once per boot: nothing else branches on it.
        self.executor = executor if executor is not None else create_executor(config, base_env=env)
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
        # The heartbeat path (see _beats.py): running jobs' token hashes in memory, and beats written in batches.
        self._tokens = JobTokens()
        self.events.subscribe(self._tokens.on_event)
        self._beats = BeatBatcher(registry.record_heartbeats, self.absence.tracker.beat)

    @property
    def exec_mode(self) -> str:
        return self.executor.mode

    def attach(self, job_nursery: trio.Nursery) -> None:
        """Give the supervisor the nursery that owns every monitor (and any task its executor runs)."""
        self._job_nursery = job_nursery
        self.executor.attach(job_nursery)

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
        # {python} is the interpreter the job finds where it runs (this one, or the image's).
        return NewJob(kind.name, validated, kind.render_argv(validated, python=self.executor.python), key)

    async def enqueue(self, kind_name: object, params: object) -> EnqueueResult:
        """Validate and store a job, have it started if a slot is free, and answer: the spawn never delays the
        caller."""
        new = self._validate(kind_name, params)
        # Promoted jobs are started by the drainer in the job nursery: none to hand them to before attach().
        refill = self._refill_tokens() if self._job_nursery is not None else None
        if refill is None:
            result = await self.registry.enqueue(new.kind, new.params, new.argv, coalesce_key=new.coalesce_key)
            self._announce_enqueued([result])
            return result
        # One transaction (one thread hop) for the row and, while a slot is free, its promotion, instead of an
        # enqueue, a drainer wake-up, a pause check and a promote (issue 10: one POST per job).
        # INV-PROMOTION-NEVER-OVERSHOOTS: the free slots are counted inside that transaction.
        result, promoted = await self.registry.enqueue_then_promote(
            new, promote=self._promote_request(refill), unless_exists=self.config.pause_flag_path
        )
        self._hand_off(promoted, refill)
        # A full drain only if this promotion failed or its tokens ran out (more slots may be free than it filled).
        self._announce_enqueued([result], drain=promoted is None or self._tokens_ran_out(promoted, refill))
        return result

    def _tokens_ran_out(self, promoted: list[Job], tokens: list[str]) -> bool:
        """A promotion with these tokens filled as many slots as it had tokens, fewer than there are slots: more may
        be free. (With a token per slot, it filled every free one.)"""
        return len(promoted) == len(tokens) < self.config.max_concurrent

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

    def _announce_enqueued(self, results: list[EnqueueResult], *, drain: bool = True) -> None:
        for result in results:
            if result.coalesced:
                log.info("job_coalesced", job_id=result.job.job_id, kind=result.job.kind)
            else:
                self._log_transition(result.job, "-", "queued", "enqueued")
        if drain:
            self.wake_drainer()

    def _promote_request(self, tokens: list[str]) -> PromoteRequest:
        return PromoteRequest(
            self.config.max_concurrent, self.boot_id, [hash_token(token) for token in tokens], self.log_dir
        )

    def _hand_off(self, promoted: list[Job] | None, tokens: list[str]) -> None:
        """Hand jobs promoted in another change's transaction to the drainer, before any other await: from now on a
        cancel finds the job's entry (as in the drain's own spawn window), and the drainer starts every job handed
        to it since its last pass together (one identity transaction for all), skipping its own promote round."""
        for promoted_job, token in zip(promoted or [], tokens, strict=False):
            self._running.setdefault(promoted_job.job_id, _Running(promoted_job.job_id))
            self._handed_off.append((promoted_job, token))
        if promoted:
            self._drain_wanted.set()

    def wake_drainer(self) -> None:
        """Ask the drainer for a drain soon; many wakes before it runs make one drain."""
        self._full_drain_wanted = True
        self._drain_wanted.set()

    async def run_drainer(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The one task that drains on demand (after an enqueue, a job's end, a cancel); owned by the root nursery."""
        task_status.started()
        while True:
            await self._drain_wanted.wait()
            self._drain_wanted = trio.Event()
            full, self._full_drain_wanted = self._full_drain_wanted, False
            if not full and self._handed_off and self._job_nursery is not None:
                # Only jobs a job's end promoted (in its finalize): they are RUNNING rows already, so starting them
                # decides nothing. Started in a task of their own, so that the next job's end is not kept waiting
                # behind this start's round trip to the executor (issue 10: promotion latency).
                handed, self._handed_off = self._handed_off, []
                self._job_nursery.start_soon(self._start_handed_off, handed)
                continue
            await self._drain_logged(full=full)

    async def _start_handed_off(self, handed: list[tuple[Job, str]]) -> None:
        jobs = [job for job, _ in handed]
        try:
            spawned = await self._start_promoted(jobs, [token for _, token in handed])
        except SupervisorError:
            log.exception("drain_failed")  # as a drain's: the rows stay RUNNING, and the sweeper judges them
            return
        if len(spawned) < len(jobs):
            self.wake_drainer()  # a failed start freed its slot: a promote round fills it

    async def is_paused(self) -> bool:
        return await trio.to_thread.run_sync(self.config.pause_flag_path.exists)

    async def drain(self, *, full: bool = True) -> list[Job]:
        """Promote and spawn while a slot is free and promotion is not paused.

        Contract: when drain returns, every promotable job has been spawned and its identity recorded, and no
        job has been waited for (each one's monitor runs in the job nursery). Free slots are filled in one
        transaction, and their jobs started together. While the executor cannot start jobs at all (its engine is
        unreachable), nothing is promoted: the queue waits instead of failing every job it would have started.
        Jobs that a job's end promoted in its own finalize (handed off by its monitor) are started first, together;
        ``full=False`` (the drainer woken only for those) skips the promote round unless a start failed.
        """
        if self._job_nursery is None:
            raise SupervisorError("drain needs a job nursery: call attach() first")
        started: list[Job] = []
        async with self._drain_lock:
            if self._handed_off:
                handed, self._handed_off = self._handed_off, []
                jobs = [job for job, _ in handed]
                spawned = await self._start_promoted(jobs, [token for _, token in handed])
                started.extend(spawned)
                full = full or len(spawned) < len(jobs)  # a failed start freed its slot
            while full and not await self.is_paused():
                if not await self._executor_ready():
                    break
                tokens = [secrets.token_urlsafe(32) for _ in range(min(self.config.max_concurrent, PROMOTE_BATCH))]
                jobs = await self.registry.promote_queued(
                    self.config.max_concurrent,
                    boot_id=self.boot_id,
                    token_hashes=[hash_token(token) for token in tokens],
                    log_dir=self.log_dir,
                )
                if not jobs:
                    break
                spawned = await self._start_promoted(jobs, tokens)
                started.extend(spawned)
                # Every free slot is now taken, or the queue is empty: another round would only read that again
                # (three more thread hops and a transaction). Unless a start failed (its slot is free again) or the
                # batch cap stopped this round short. A job ending meanwhile wakes the drainer itself.
                capped = len(jobs) == PROMOTE_BATCH < self.config.max_concurrent
                if not capped and len(spawned) == len(jobs):
                    break
        return started

    async def _executor_ready(self) -> bool:
        why = await self.executor.unavailable()
        if why is not None and not self._drain_held:
            log.warning("drain_held", why=why, exec_mode=self.exec_mode)
        elif why is None and self._drain_held:
            log.info("drain_resumed", exec_mode=self.exec_mode)
        self._drain_held = why is not None
        return why is None

    async def _start_promoted(self, jobs: list[Job], tokens: list[str]) -> list[Job]:
        """Start freshly promoted jobs together, record their identities in one transaction, start their monitors."""
        assert self._job_nursery is not None
        outcomes: dict[str, JobHandle | Exception] = {}

        async def start_one(job: Job, token: str) -> None:
            try:
                outcomes[job.job_id] = await self._start(job, token)
            except Exception as exc:  # judged below, job by job
                outcomes[job.job_id] = exc

        for job in jobs:
            self._log_transition(job, "queued", "running", "promoted")
            self._running.setdefault(job.job_id, _Running(job.job_id))  # a handed-off job's entry may hold a cancel
        watched: set[str] = set()
        try:
            if len(jobs) == 1:
                await start_one(jobs[0], tokens[0])  # a lone start (the common case) needs no nursery of its own
            else:
                async with trio.open_nursery() as starts:
                    for job, token in zip(jobs, tokens, strict=False):
                        starts.start_soon(start_one, job, token)

            spawned: list[Job] = []
            records: list[ProcessRecord] = []
            for job in jobs:
                got = outcomes[job.job_id]
                if isinstance(got, Exception):
                    # INV-SPAWN-FAILURE-FREES-SLOT: whatever goes wrong in one start (a SpawnError, or a defect such as
                    # an argv the OS cannot take), the promoted row is finalized, never left holding a slot.
                    del self._running[job.job_id]
                    if not isinstance(got, SpawnError):
                        log.error("spawn_crashed", job_id=job.job_id, error=repr(got))
                    reason = str(got) if isinstance(got, SpawnError) else f"{type(got).__name__}: {got}"
                    await self._finalize(job, JobStatus.FAILED, f"spawn_failed: {reason}"[:500])
                    continue
                self._running[job.job_id].handle = got
                records.append(got.record)
                spawned.append(job)
            if records:
                try:
                    spawned = await self.registry.set_job_processes(records)
                except SupervisorError:
                    # The jobs exist: they must still get their monitors (to be finalized, cancellable). What the
                    # executor wrote before each program ran (a start file, a labelled container) lets a later boot find
                    # them too.
                    log.exception("job_identity_not_recorded", job_ids=[r.job_id for r in records])
            for job in spawned:
                running = self._running[job.job_id]
                assert running.handle is not None
                if job.cancel_requested:
                    running.request_cancel()  # a cancel that arrived in the spawn window is carried out now
                fields = running.handle.log_fields()
                log.info("job_spawned", job_id=job.job_id, kind=job.kind, boot_id=self.boot_id, **fields)
                await self._job_nursery.start(self._monitor, running, job)
                watched.add(job.job_id)
            return spawned
        finally:
            # Cancelled part way (a shutdown): an entry without a monitor must not look watched. Its job, if it
            # started, is found again by the next boot (INV-IDENTITY-BEFORE-PROGRAM).
            for job in jobs:
                if job.job_id not in watched:
                    self._running.pop(job.job_id, None)

    async def _start(self, job: Job, token: str) -> JobHandle:
        assert job.log_path is not None
        env = {
            "PODCAST_JOB_ID": job.job_id,
            "PODCAST_JOB_TOKEN": token,
            "PODCAST_JOB_DATA_DIR": str(self.data_dir),
        }
        if self.heartbeat_base_url is not None:
            env["PODCAST_JOB_HEARTBEAT_URL"] = f"{self.heartbeat_base_url}/api/jobs/{job.job_id}/heartbeat"
        if not self._log_dir_made:  # once, not a thread hop per start; again after any failed start
            try:
                await trio.to_thread.run_sync(lambda: self.log_dir.mkdir(parents=True, exist_ok=True))
            except OSError as exc:
                raise SpawnError(f"cannot create the job log directory {self.log_dir}: {exc.strerror or exc}") from exc
            self._log_dir_made = True
        launch = Launch(
            job_id=job.job_id,
            kind=job.kind,
            boot_id=self.boot_id,
            argv=job.argv,
            env=env,
            data_dir=self.data_dir,
            log=Path(job.log_path),
            log_max_bytes=self.config.log_max_bytes,
        )
        try:
            return await self.executor.start(launch)
        except BaseException:
            self._log_dir_made = False  # the directory may be what is missing (removed under a running supervisor)
            raise

    # -- the monitor --------------------------------------------------------------------------------

    async def _monitor(self, running: _Running, job: Job, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Wait for one job to end, finalize its row with its true outcome, then drain. Owned by the job nursery.

        Cancelling this task (supervisor shutdown) stops the watching, never the job.
        """
        task_status.started()
        handle = running.handle
        assert handle is not None
        drain_after = True  # unless this job's end promoted the next jobs itself
        # The stop (SIGTERM, SIGKILL after the grace) runs only once a cancel is asked for, in a task of its own
        # that ends with the job: no waiting task per job for a cancel that almost never comes (issue 10).
        stopping = trio.CancelScope()
        job_nursery = self._job_nursery
        assert job_nursery is not None

        def start_stop() -> None:
            job_nursery.start_soon(self._carry_out_cancel, running, stopping)

        try:
            running.on_cancel = start_stop
            if running.cancel_requested:
                start_stop()
            try:
                status = await self.executor.wait(handle)
            finally:
                running.on_cancel = None
                stopping.cancel()
            refill = self._refill_tokens()
            finished = await self._finish(job, status, cancelled=running.cancel_requested, refill=refill)
            if finished.promoted:  # handed to the drainer by _finish; a full drain only if its tokens ran out
                drain_after = refill is not None and self._tokens_ran_out(finished.promoted, refill)
            else:
                drain_after = finished.promoted is None  # no refill was tried (or it failed): the drainer's turn
            await self.executor.release(handle)
        except Unwatchable as exc:
            # INV-UNKNOWN-KEEPS-SLOT: the row stays RUNNING; the sweeper judges it on whatever evidence exists.
            log.warning("job_unwatchable", job_id=job.job_id, why=str(exc))
        except SupervisorError:
            # The row stays RUNNING; with no monitor left, the sweeper's rules finalize it.
            log.exception("monitor_failed", job_id=job.job_id)
        finally:
            self._running.pop(job.job_id, None)
            if drain_after:
                self.wake_drainer()

    def _refill_tokens(self) -> list[str] | None:
        """Tokens for promoting into the slot a job's end frees, in its finalize transaction; None when that step
        must stay the drainer's: an executor whose engine can be unreachable is asked first (``unavailable``)."""
        if not self.executor.always_available:
            return None
        # A job's end frees one slot: the tokens (each a random token and its hash, on the event loop, at every job's
        # end) are for that slot and one more; a job's end that finds more free slots than that (a resume, a raised
        # limit) leaves the rest to the drainer's full round.
        return [secrets.token_urlsafe(32) for _ in range(min(self.config.max_concurrent, REFILL_SLOTS))]

    async def _finish(
        self,
        job: Job,
        status: ExitStatus | None,
        *,
        cancelled: bool,
        expect: Job | None = None,
        refill: list[str] | None = None,
    ) -> _Finished:
        """Finalize a job whose process has ended: its true outcome, or an orphan when no exit was recorded.

        ``expect``: only if the row still records the process of this (earlier) read of it. ``refill``: tokens
        to promote queued jobs into the freed slot in the same transaction (unless paused); the promoted jobs are
        handed to the drainer to start, and returned. ``changed`` is True when this call changed the row (a
        terminal row is left alone)."""
        kind = self.kinds.get(job.kind) if job.kind in self.kinds else None

        def decide(current: Job) -> tuple[JobStatus, str | None]:
            """Called inside the finalize transaction: a cancel requested until this instant counts."""
            if job.job_id in self._stall_stops and not current.cancel_requested:
                return JobStatus.STALE, "progress_stalled"  # stopped by the sweeper (stall_action = terminate)
            cancel_requested = cancelled or current.cancel_requested
            if status is None:
                # The process is gone and nobody recorded how it ended (its shepherd was killed, its container
                # removed): never a guess.
                if cancel_requested:
                    return JobStatus.CANCELLED, "cancelled"
                return JobStatus.FAILED, self.executor.orphan_reason
            return outcome(
                status,
                cancel_requested=cancel_requested,
                exit_reasons=kind.exit_reasons if kind else {},
                failure_reasons=kind.failure_reasons if kind else {},
            )

        exit_code = status.returncode if status else None
        promoted: list[Job] | None = None
        if refill is not None and expect is None:
            # One transaction (and thread hop) for this job's end and the next job's promotion, instead of a
            # finalize, a drainer wake-up, a pause check and a promote (INV-PROMOTION-NEVER-OVERSHOOTS: the promote
            # counts the running rows after this finalize, in the same transaction).
            result, promoted = await self.registry.finalize_then_promote(
                job.job_id,
                decide,
                exit_code=exit_code,
                promote=self._promote_request(refill),
                unless_exists=self.config.pause_flag_path,
            )
            self._hand_off(promoted, refill)
        else:
            result = await self.registry.finalize(job.job_id, decide, exit_code=exit_code, **_expecting(expect))
        self._stall_stops.discard(job.job_id)
        if not result.changed:
            return _Finished(False, promoted)
        final = result.job
        self._log_transition(
            final, str(result.previous), str(final.status), final.error_reason, exit_code=final.exit_code
        )
        if final.status is JobStatus.SUCCEEDED and kind is not None and kind.then:
            await self._enqueue_follow_up(final, kind.then)
        return _Finished(True, promoted)

    async def _carry_out_cancel(self, running: _Running, scope: trio.CancelScope) -> None:
        """Stop a job whose cancel was requested; ``scope`` is cancelled by its monitor once the job has ended."""
        assert running.handle is not None
        if scope.cancel_called:
            return  # the job ended before this task first ran: nothing to stop, and nothing to log
        with scope:
            try:
                await self.executor.stop(running.handle, self.config.cancel_grace_s)
            except SupervisorError:
                # The monitor goes on waiting for the job's end; the cancel stays requested on the row.
                log.exception("job_stop_failed", job_id=running.job_id)

    async def _adopt(self, job: Job, handle: JobHandle, *, cancel: bool = False) -> None:
        """Watch a job this boot did not start (a prior boot's): its monitor finalizes it with its true outcome."""
        if job.job_id in self._running:
            if cancel:
                self._running[job.job_id].request_cancel()
            return
        assert self._job_nursery is not None
        running = _Running(job.job_id, handle=handle)
        if cancel:
            running.request_cancel()
        self._running[job.job_id] = running
        await self._announce_adopted(job, handle)
        await self._job_nursery.start(self._monitor, running, job)

    async def _announce_adopted(self, job: Job, handle: JobHandle) -> None:
        try:
            job = await self.registry.record_event(job.job_id, str(EventName.ADOPTED), "adopted")
        except SupervisorError:
            log.exception("adoption_event_not_recorded", job_id=job.job_id)  # the adoption itself goes on
        extra = {"prior_boot": job.boot_id, **handle.log_fields()}
        self.events.emit(JobEvent(EventName.ADOPTED, job, str(job.status), "adopted", self.boot_id, extra))

    async def _finalize(self, job: Job, status: JobStatus, reason: str | None, *, expect: Job | None = None) -> bool:
        result = await self.registry.finalize(job.job_id, status, reason=reason, **_expecting(expect))
        if result.changed:
            self._log_transition(result.job, str(job.status), str(status), reason)
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

    async def _drain_logged(self, *, full: bool = True) -> None:
        try:
            await (self.drain() if full else self.drain(full=False))
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
            handle.request_cancel()  # the monitor signals the group; in the spawn window, as soon as spawn completes
            return job
        await self._cancel_unmonitored(job)
        return await self.registry.get(job_id)

    async def _cancel_unmonitored(self, job: Job) -> None:
        """A running row with no monitor here: a prior boot's job (or one whose monitor failed).

        A job the executor verified (alive, or ended with its exit on record) is adopted and stopped (SIGTERM, then
        SIGKILL after the grace; ``docker stop`` in docker mode); its monitor finalizes it ``cancelled`` once it is
        gone. Anything else is never signalled.
        """
        [found] = await self._gather_evidence([job])
        if found.liveness is Liveness.UNKNOWN and (why := await self.executor.unavailable()) is not None:
            # INV-UNKNOWN-KEEPS-SLOT: the engine cannot be asked, so the job may well run on. The cancel stays
            # requested on the row (and the slot held); the first sweep that reaches the engine adopts and stops it.
            log.warning("cancel_pending_engine_unreachable", job_id=job.job_id, container_id=job.container_id, why=why)
            return
        if found.liveness is Liveness.UNKNOWN and not job.spawned and found.handle is None:
            # INV-UNKNOWN-KEEPS-SLOT: a prior boot's start may still be under way (its record not written yet). The
            # cancel stays requested on the row: a sweep adopts and stops the job once its record is there, or ends
            # the row cancelled_before_start once it provably never started.
            log.warning("cancel_pending_start_unconfirmed", job_id=job.job_id, detail=found.detail)
            return
        if found.found is not None:
            job = await self.registry.set_job_process(**_record_fields(found.found))
        verified = found.liveness is Liveness.ALIVE or found.exit_status is not None or found.exit_pending
        if found.handle is not None and verified and self._job_nursery is not None:
            await self._adopt(job, found.handle, cancel=True)
            return
        if job.spawned and found.liveness is not Liveness.DEAD:
            log.error(
                "cancel_left_process_alone",
                job_id=job.job_id,
                pid=job.pid,
                container_id=job.container_id,
                liveness=found.liveness.value if found.liveness else None,
                detail=found.detail,
                why="the recorded process identity could not be verified; stop any surviving work by hand",
            )
        await self._finalize(job, JobStatus.CANCELLED, "cancelled_unverified_process_left_alone", expect=job)
        self.wake_drainer()

    # -- reconcile ----------------------------------------------------------------------------------

    async def _gather_evidence(self, rows: list[Job]) -> list[Evidence]:
        """The executor's evidence for ``rows`` (blocking probes: a worker thread, never under a registry lock)."""
        return await trio.to_thread.run_sync(lambda: self.executor.gather_evidence(rows, boot_id=self.boot_id))

    async def reconcile(self, *, stale_marks_live_processes: bool) -> ReconcileReport:
        """Bring RUNNING rows in line with the evidence. Probes run before any registry lock is taken."""
        rows = await self.registry.running_jobs()
        evidence = await self._gather_evidence(rows)
        now = datetime.now(UTC)
        details: list[ReconcileDetail] = []
        updated = 0
        for job, found in zip(rows, evidence, strict=True):
            this_boot = job.boot_id == self.boot_id
            liveness = found.liveness
            if found.found is not None:
                # A prior boot died between the start and recording the identity: what the executor wrote before the
                # program ran (a start file, a labelled container) names it, so it is judged (and adopted) like any
                # recorded one, never freed as a spawn window.
                job = await self.registry.set_job_process(**_record_fields(found.found))
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
                exit_pending=found.exit_pending,
                orphan_reason=self.executor.orphan_reason,
            )
            action = decision.action
            if decision.action == "finalize":
                assert decision.status is not None
                # expect: the evidence was gathered before the lock; only act if the row is still that process.
                if await self._finalize(job, decision.status, decision.reason, expect=job):
                    updated += 1
                    action = str(decision.status)
                    if found.handle is not None and liveness is not Liveness.ALIVE:
                        await self.executor.release(found.handle)  # a never-started container, say
                else:
                    action = "untouched"
            elif decision.action == "finalize_exit":
                assert found.exit_status is not None and found.handle is not None
                await self.executor.collect(found.handle)
                if (await self._finish(job, found.exit_status, cancelled=False, expect=job)).changed:
                    updated += 1
                    action = str((await self.registry.get(job.job_id)).status)
                    await self.executor.release(found.handle)
                else:
                    action = "untouched"
            if decision.adopt and found.handle is not None and self._job_nursery is not None:
                await self._adopt(job, found.handle, cancel=job.cancel_requested)  # a cancel left pending
            if decision.warn:
                log.warning(
                    "reconcile_kept_slot",
                    job_id=job.job_id,
                    reason=decision.reason,
                    liveness=liveness.value if liveness else None,
                    pid=job.pid,
                    container_id=job.container_id,
                    detail=found.detail,
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
        running = self._running.get(job.job_id)
        adopt: JobHandle | None = None
        if running is None:
            # Not watched by this boot (a prior boot's job): stopped only once the executor verifies it alive now.
            [found] = await self._gather_evidence([job])
            if found.handle is None or found.liveness is not Liveness.ALIVE or self._job_nursery is None:
                log.warning("stalled_job_not_terminated", job_id=job.job_id, why="no verified live process")
                return
            adopt = found.handle
        self._stall_stops.add(job.job_id)
        log.warning("stalled_job_terminating", job_id=job.job_id, pid=job.pid, grace_s=self.config.cancel_grace_s)
        if running is not None:
            running.request_cancel()  # its monitor: SIGTERM, SIGKILL after the grace, then finalize once it is gone
        elif adopt is not None:
            await self._adopt(job, adopt, cancel=True)

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
        """Record a child's heartbeat; see ``SqliteRegistry.record_heartbeats``.

        The token is checked before the body is even read (``read_body`` raises the HTTP layer's 400/413/415), so a
        caller without it learns nothing: not whether the job exists, nor what body would have been accepted. The
        check is in memory for a job this boot saw running (``JobTokens``), else one registry read; the write checks
        the token again, in the transaction that records the beat (batched with the beats that arrive meanwhile).
        """
        admitted = self._tokens.admits(job_id, token)
        if not admitted:
            generation = self._tokens.generation
            await self.registry.check_job_token(job_id, token)
            self._tokens.remember(job_id, token, generation)
        try:
            beat = _parse_beat(job_id, token, await read_body())
        except RequestError:
            if admitted:
                # Admitted from memory, the job may have ended a moment ago: a token that no longer works is a 401
                # whatever its body, as if the registry had been asked first.
                await self.registry.check_job_token(job_id, token)
            raise
        try:
            return await self._beats.record(beat)
        except (Unauthorized, Conflict):
            self._tokens.forget(job_id)  # ended (perhaps by another process): the next beat asks the registry
            raise

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


def _expecting(job: Job | None) -> dict[str, Any]:
    """The registry's guard for a finalize decided on an earlier read: the row must still record that process."""
    if job is None:
        return {}
    return {"expect_pid": job.pid, "expect_container_id": job.container_id}


def _record_fields(record: ProcessRecord) -> dict[str, Any]:
    return {
        "job_id": record.job_id,
        "pid": record.pid,
        "pid_start_time": record.pid_start_time,
        "kernel_boot_id": record.kernel_boot_id,
        "container_id": record.container_id,
    }
