"""``Supervisor``: the core's one front door. The HTTP layer and the CLI only translate into calls on it.

It holds no rule itself (``_rules`` does) and runs no task itself: it wires one boot's parts and hands the root of
the nursery tree the tasks to start:

    Supervisor              its tasks in the order ``_tree.start_tree`` starts them in the root nursery:
    ├── fleet               this host's lease, the lead, the leader's silent-host rounds       _fleet.Fleet
    ├── drainer             promotes and starts jobs when woken                                _drain.Drainer
    ├── wake-ups            acts on other hosts' changes at once (LISTEN/NOTIFY)               _wakeups.WakeupListener
    ├── webhook sender      delivers the registry's outbox                                     observe.WebhookSender
    ├── check-in            this process's presence: its own absence ages no job               _absence.AbsenceTracker
    ├── sweeper             reconcile -> absence -> drain -> the queue's watch, on a timer     _sweeper.Sweeper
    ├── heartbeat writer    the beats the API took, written behind (ADR 0018)                  _heartbeats.Heartbeats
    └── job nursery         (handed in by ``attach``)
        ├── one monitor per running job, and each cancel's stop task                           _monitor.Monitors
        └── whatever the executor runs there (the shepherd's reader)                           execution/
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio

from ..domain import (
    FIRST_PAGE,
    BulkRequest,
    Config,
    Conflict,
    Doorbell,
    Job,
    JobNotFound,
    JobRequest,
    JobStatus,
    KindCatalog,
    PageRequest,
    RegistryError,
    RequestKey,
    Schedule,
    to_iso,
    utc_now,
)
from ..execution import Executor, create_executor
from ..observe import EventBus, EventLog, Metrics, Snapshot, Subscription, WebhookSender, get_logger, log_event
from ..registry import PAUSED_BY_OPERATOR, EnqueueResult, PrunedJob, Registry, log_name
from ._absence import AbsenceJudge, AbsenceTracker
from ._boot import Boot
from ._bulk import Bulk, BulkAnswer
from ._drain import Drainer
from ._enqueue import Enqueuer
from ._fleet import Fleet
from ._heartbeats import CurrentRows, Heartbeats
from ._hosts import HostAdmin
from ._monitor import Monitors
from ._pause import PauseFile
from ._prune import Pruner
from ._queue_watch import QueueWatch
from ._reconcile import Reconciler, ReconcileReport
from ._scrape import RegistryReads, brought_up, read_registry
from ._silent import SilentHostJobs
from ._standing import Standing
from ._sweeper import Sweeper, run_sweeper
from ._wakeups import WakeupListener

log = get_logger()

# The request-facing methods' types: an Idempotency-Key, who asks (an API token's name), what an enqueue answers.
Key = RequestKey | None
By = str | None
Sched = Schedule | None
Params = Mapping[str, object] | None  # a JSON object's names and values (parsed at the edge: api.parse_job)
Enqueued = EnqueueResult
T = TypeVar("T")

# Environment variables the supervisor itself reads that a job must never inherit.
# (systemd's notify socket too: only the supervisor speaks for itself to its service manager.)
_PRIVATE_ENV = (
    "PODCAST_JOB_API_TOKEN",
    "PODCAST_JOB_API_TOKEN_FILE",
    "PODCAST_JOB_API_TOKENS_FILE",
    "PODCAST_JOB_WEBHOOK_SECRET",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
)


LOG_CHUNK_BYTES = 64 * 1024  # a log is read and sent this much at a time, however large


@dataclass(frozen=True)
class LogSlice:
    """Bytes ``start`` to ``end`` of a job's log (``path`` None: it has none yet)."""

    path: Path | None
    start: int
    end: int

    async def chunks(self, chunk_bytes: int = LOG_CHUNK_BYTES) -> AsyncIterator[bytes]:
        """The slice, ``chunk_bytes`` at a time. INV-LOG-READ-BOUNDED: a read holds one chunk in memory, never the
        log; the file is opened for each chunk, so a reader that stops half way leaves nothing open."""
        position = self.start
        while self.path is not None and position < self.end:
            data = await trio.to_thread.run_sync(_read_at, self.path, position, min(chunk_bytes, self.end - position))
            if not data:
                return  # shorter than it was (replaced by hand): what is there has been read
            position += len(data)
            yield data


async def log_slice_of(
    job: Job, tail_bytes: int | None, offset: int | None, attempt: int | None, executor: Executor | None = None
) -> LogSlice:
    """Which bytes of ``job``'s log a read gets: whole, its last ``tail_bytes``, or from byte ``offset`` on, up to its
    size now; ``attempt``: that attempt's log (each attempt has its own; default the latest). A log file is
    append-only (capped, never rotated), so an offset stays valid while it grows. An attempt the job never had is not
    there (``JobNotFound`` naming it, a 404), before any byte is read."""
    if attempt is not None and not 1 <= attempt <= max(job.attempts, 1):
        raise JobNotFound(job.job_id, attempt=attempt, attempts=job.attempts)
    if executor is not None and job.status is JobStatus.RUNNING and attempt in (None, job.attempts):
        await executor.refresh_log(job)  # ``executor``: the job's own host's, which can read its process
    if job.log_path is None:
        return LogSlice(None, 0, 0)
    path = Path(job.log_path)
    if attempt is not None:
        path = path.parent / log_name(job.job_id, attempt)

    def size() -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    end = await trio.to_thread.run_sync(size)
    start = max(0, end - tail_bytes) if tail_bytes is not None else min(offset or 0, end)
    return LogSlice(path, start, end)


def _read_at(path: Path, position: int, size: int) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(position)
            return fh.read(size)
    except FileNotFoundError:
        return b""


@dataclass(frozen=True)
class QueueState:
    paused: bool
    running: int
    queued: int
    max_concurrent: int
    # The queue's watch as of the last sweep (docs/operations.md § The queue's watch; None/empty before the first): how
    # long the oldest job ready to run has waited, this host's last promotion, each reason promotion is held and since
    # when, and a stuck queue.
    oldest_queued_age_s: float | None = None
    last_promotion_at: str | None = None
    held: dict[str, str] = field(default_factory=dict)
    stuck: dict[str, str] | None = None
    # Each kind's running and queued jobs (fleet-wide) and its max_running (None: no limit of its own).
    kinds: dict[str, dict[str, int | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Health:
    """What the health route says: ``degraded`` names each part that does not work fully now (``registry``: its
    writes fail, so nothing new is acknowledged; reads, running jobs and their slots go on; ``engine``: the executor's
    engine does not answer, so nothing is started and running jobs' liveness is unknown; they keep their slots;
    ``queue``: the queue is stuck, docs/operations.md § The queue's watch)."""

    boot_id: str
    exec_mode: str
    paused: bool | None  # None: the registry could not be read
    degraded: dict[str, str]
    host_id: str = ""
    leader: bool = False  # this host leads the fleet (ADR 0012)

    @property
    def status(self) -> str:
        return "degraded" if self.degraded else "ok"


class Supervisor:
    """One boot of the supervisor over ``registry``. ``executor``: how jobs run (default: the exec mode's).

    Its verbs (``enqueue``, ``cancel``, ``list_jobs``, ``drain``, ``sweep``, ...) are what the HTTP layer and an
    embedder call. Its parts are public attributes, and the documented seam for a test or an embedder that drives
    the tree by hand: ``boot`` (the frozen wiring: config, registry, executor, ``ledger``, ``standing``), ``drainer``,
    ``monitors``, ``reconciler``, ``sweeper``, ``fleet``, ``heartbeats``, ``absence``, ``queue_watch``, ``pruner``,
    ``pause_file``, ``enqueuer``, ``webhooks``, ``event_log``, ``metrics``; each one's public verbs are its contract,
    and nothing private of theirs is (``tests/test_public_surface.py`` holds the tests to that).
    """

    def __init__(
        self,
        config: Config,
        kinds: KindCatalog,
        registry: Registry,
        *,
        boot_id: str | None = None,
        base_env: Mapping[str, str] | None = None,
        executor: Executor | None = None,
        wall_clock: Callable[[], datetime] | None = None,
        standalone: bool = False,
        succeeds: str | None = None,
        heartbeat_base_url: str | None = None,
        webhook_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``wall_clock``: the time this boot stamps and judges by; ``supervisor serve`` gives the registry's own
        ``SteadyWallClock`` (steps of the system clock move neither). Default: the system's wall clock.
        ``standalone``: this boot runs no fleet task (``run_fleet``) and holds its registry alone, so it promotes and
        leads without a lease (an embedder, a test). Otherwise nothing is promoted and no leader's duty runs until
        the fleet task's first renewal opens those gates (``run_supervisor`` starts it first). ``succeeds``: this
        host's previous boot on this data dir, proved gone (``_succession.DataDirLock``). ``heartbeat_base_url``: how
        jobs reach the HTTP API for their heartbeats (``run_supervisor`` binds its socket first; default: the
        config's, else no URL). ``webhook_transport``: httpx's seam for where webhooks go (default: the network; the
        scenario kit records them instead)."""
        env = dict(base_env if base_env is not None else os.environ)
        for name in _PRIVATE_ENV:
            env.pop(name, None)
        self.events = EventBus()
        self.events.subscribe(log_event)
        # The one place the boot is put together: every part gets what it uses in its constructor, in an order with
        # no cycle (the drainer and the monitors meet through the drainer's bell, not each other).
        self.boot = Boot(
            config=config,
            kinds=kinds,
            registry=registry,
            # The exec mode is chosen here, once per boot: nothing else branches on it.
            executor=executor if executor is not None else create_executor(config, base_env=env),
            events=self.events,
            boot_id=boot_id or secrets.token_hex(16),
            data_dir=config.data_dir.resolve(),
            log_dir=config.jobs_log_dir.resolve(),
            # What the fleet lets this host do (written by the fleet task alone): INV-NO-PROMOTION-WITHOUT-LEASE.
            standing=Standing(config.max_concurrent, standalone=standalone),
            wall_clock=wall_clock or utc_now,
        )
        # Rung by whatever may free a slot or queue a job (an enqueue, a job's end, a cancel, a resume, a sweep),
        # waited on by the drainer alone: many rings make one drain.
        self.drain_bell = Doorbell()
        wake = self.drain_bell.ring
        tracker = AbsenceTracker(wall_clock=self.boot.wall_clock)
        self.heartbeats = Heartbeats(registry, tracker.beat, self.boot.wall_clock)
        # Every read that judges or shows progress goes through here: it sees every beat taken before it (ADR 0018).
        self.rows = CurrentRows(registry, self.heartbeats)
        self.enqueuer = Enqueuer(self.boot, wake)
        self.monitors = Monitors(
            self.boot, wake, self.enqueuer.follow_up_of, self.enqueuer.announce, self.heartbeats.flush
        )
        self.bulk = Bulk(self.boot, self.enqueuer, self.monitors.cancel)
        self.pause_file = PauseFile(config.pause_flag_path, registry, config.host_id)
        base_url = heartbeat_base_url or config.heartbeat_base_url
        self.drainer = Drainer(self.boot, self.drain_bell, self.monitors.start, self.pause_file, base_url)
        self.reconciler = Reconciler(self.boot, self.monitors, wake)
        # The leader's judge of a silent host's jobs: only by proof of their end that this host can read (ADR 0012).
        self.silent_hosts = SilentHostJobs(self.boot, self.monitors, wake)
        self.host_admin = HostAdmin(self.boot, self.monitors, wake)
        self.hosts = self.host_admin.view  # every host of the fleet, live or silent, and which leads
        self.drain_host = self.host_admin.drain  # drain or undrain any host of the fleet, this one too
        self.metrics = Metrics()
        self.events.subscribe(self.metrics.on_event)
        self.fleet = Fleet(
            self.boot,
            on_fresh=self.drainer.lease_renewed,
            on_forgotten=self.host_admin.this_boot_forgotten,
            end_by_proof=self.silent_hosts.end_by_proof,
            succeeds=succeeds,
        )
        # The durable copy of each event is the registry's outbox row, written in the change's own transaction; the
        # sender (a root-nursery task) delivers it and is woken by the bus. INV-ONE-LEADER: one sender for the fleet
        # keeps delivery in order.
        self.webhooks = WebhookSender(
            config, registry, may_send=self.boot.standing.may_lead, transport=webhook_transport
        )
        self.events.subscribe(self.webhooks.wake)
        # The event stream's readers (GET /api/events): numbered, kept for resume, each with its own bounded queue.
        self.event_log = EventLog(
            self.boot.boot_id,
            self.boot.wall_clock,
            replay_events=config.events_replay_events,
            client_buffer_events=config.events_client_buffer_events,
            max_clients=config.events_max_clients,
        )
        self.events.subscribe(self.event_log.on_event)
        stop = self.reconciler.stop_stalled
        self.absence = AbsenceJudge(config, registry, self.events, self.boot.boot_id, stop, tracker, rows=self.rows)
        # History past its retention goes a batch at a time; one host of a fleet prunes (INV-ONE-LEADER's duties).
        self.pruner = Pruner(config, registry, self.boot.wall_clock, self.boot.standing.may_lead)
        self.queue_watch = QueueWatch(
            self.boot,
            self.drainer.holds,
            lambda: self.drainer.last_promotion_at,
            stuck_after_s=config.queue_stuck_s,
            pause_warn_after_s=config.pause_warn_s,
            wake_sender=self.webhooks.wake,  # queue.stuck / queue.moving go through the outbox
        )
        self.sweeper = Sweeper(
            self.boot,
            self.reconciler,
            self.absence,
            self.drainer,
            self.metrics,
            self.pause_file,
            self.pruner,
            self.queue_watch,
        )
        # What other hosts change (an enqueue, a cancel of a job here, the pause), heard at once; the sweep is the
        # guarantee (INV-NOTIFY-IS-A-HINT).
        self.wakeups = WakeupListener(self.boot, wake, self.monitors)
        self.registry_reads = RegistryReads(self.boot, lambda: read_registry(self.boot, self.queue_watch))
        self.events.subscribe(self.heartbeats.on_event)

    # -- what the root of the nursery tree and the HTTP layer read -------------------------------------------

    @property
    def config(self) -> Config:
        return self.boot.config

    @property
    def kinds(self) -> KindCatalog:
        return self.boot.kinds

    @property
    def registry(self) -> Registry:
        return self.boot.registry

    @property
    def executor(self) -> Executor:
        return self.boot.executor

    @property
    def boot_id(self) -> str:
        return self.boot.boot_id

    @property
    def exec_mode(self) -> str:
        return self.boot.executor.mode

    @property
    def data_dir(self) -> Path:
        return self.boot.data_dir

    @property
    def log_dir(self) -> Path:
        return self.boot.log_dir

    @property
    def heartbeat_base_url(self) -> str | None:
        return self.drainer.heartbeat_base_url

    @property
    def last_sweep_done(self) -> float | None:
        return self.sweeper.last_sweep_done

    def attach(self, job_nursery: trio.Nursery) -> None:
        """Give the supervisor the nursery that owns every monitor (and any task its executor runs)."""
        self.boot.tree.attach(job_nursery)
        self.boot.executor.attach(job_nursery)

    async def run_drainer(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.drainer.run(task_status=task_status)

    async def run_fleet(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.fleet.run(task_status=task_status)

    async def run_wakeups(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.wakeups.run(task_status=task_status)

    async def forget_host(self, host_id: str) -> dict[str, Any]:
        """The operator says host ``host_id`` will never come back (``HostAdmin.forget``), in a task of the tree.
        Refused for this host."""
        if host_id == self.boot.host_id:
            raise Conflict(f"host {host_id} is this supervisor: it cannot forget itself")
        return await self._in_tree(lambda: self.host_admin.forget(host_id), "host_forget_failed")

    async def run_sweeper(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await run_sweeper(
            self.sweeper, self.boot.config.sweep_interval_s, tally=self.boot.tally, task_status=task_status
        )

    # -- enqueue ------------------------------------------------------------------------------------------

    async def enqueue(
        self, kind: str, params: Params, *, idempotency_key: Key = None, by: By = None, schedule: Sched = None
    ) -> Enqueued:
        """Validate and store a job (``Enqueuer.enqueue``): never waits for a spawn. With ``idempotency_key``, a retry
        of the request answers the first answer; ``by``: who asks (the API token's name: the row's ``enqueued_by``);
        ``schedule``: the schedule whose tick it is (a skipped tick makes no job: ``skipped``)."""
        return await self.enqueuer.enqueue(kind, params, idempotency_key, by, schedule)

    async def enqueue_many(
        self, requests: Sequence[JobRequest], *, idempotency_key: Key = None, by: By = None
    ) -> list[Enqueued]:
        """A batch, all or nothing (``Enqueuer.enqueue_many``); ``idempotency_key`` covers the batch."""
        return await self.enqueuer.enqueue_many(requests, idempotency_key, by)

    async def retry(self, job_id: str, *, by: By = None) -> Enqueued:
        """The operator's explicit second try of a finished job (``Enqueuer.retry``)."""
        return await self.enqueuer.retry(job_id, by)

    # -- the queue ----------------------------------------------------------------------------------------

    def wake_drainer(self) -> None:
        self.drainer.wake()

    async def drain(self) -> list[Job]:
        return await self.drainer.drain()

    async def is_paused(self) -> bool:
        return (await self.boot.registry.pause_state()).paused

    async def health(self) -> Health:
        """Always answers (a health check must not fail with what it reports): what works, and what does not."""
        degraded: dict[str, str] = {}
        fault = self.boot.registry.fault()
        if fault is not None:
            degraded["registry"] = (
                f"writes failing since {fault.since.isoformat()} ({fault.failed_writes} failed): {fault.reason}"
            )
        trouble = self.boot.executor.fault()
        if trouble is not None:
            degraded["engine"] = (
                f"not answering since {trouble.since.isoformat()} ({trouble.failed_calls} failed calls; jobs are not "
                f"started, running ones keep their slots): {trouble.reason}"
            )
        stuck = self.queue_watch.rule.stuck
        # A stuck queue is still 200: a supervisor waiting for its engine must not be killed for it.
        if stuck is not None:
            degraded["queue"] = f"stuck since {stuck.since.isoformat()}: {stuck.reason}"
        paused: bool | None = None
        try:
            paused = await self.is_paused()
        except RegistryError as exc:
            degraded["registry_reads"] = str(exc)
        return Health(self.boot.boot_id, self.exec_mode, paused, degraded, self.boot.host_id, self.fleet.may_lead())

    async def queue_state(self) -> QueueState:
        counts = await self.boot.registry.counts()
        paused = await self.is_paused()
        signals = self.queue_watch.latest
        return QueueState(
            paused,
            counts["running"],
            counts["queued"],
            self.boot.max_concurrent,
            signals.oldest_queued_age_s if signals else None,
            to_iso(signals.last_promotion_at) if signals else None,
            {reason: to_iso(since) for reason, since in signals.held.items()} if signals else {},
            {"reason": signals.stuck.reason, "since": to_iso(signals.stuck.since)}
            if signals and signals.stuck
            else None,
            {kind: dataclasses.asdict(load) for kind, load in (await self.queue_watch.kinds()).items()},
        )

    async def pause(self) -> QueueState:
        await self.boot.registry.set_paused(True, by=PAUSED_BY_OPERATOR)
        log.warning("queue_paused", by=PAUSED_BY_OPERATOR)
        return await self.queue_state()

    async def resume(self) -> QueueState:
        """Resume promotion, whoever paused it: the operator's pause file goes too (it would pause again). Then the
        drainer runs a round (its own task's: a caller that goes away never leaves a promotion half started)."""
        await self._in_tree(self._resume, "queue_resume_failed")
        return await self.queue_state()

    async def _resume(self) -> None:
        await self.pause_file.remove()
        await self.boot.registry.set_paused(False, by=PAUSED_BY_OPERATOR)
        log.info("queue_resumed", by=PAUSED_BY_OPERATOR)
        await self.drainer.round()

    async def _in_tree(self, work: Callable[[], Awaitable[T]], step: str) -> T:
        """An operator's request whose work has several steps (a resume, a reconcile, a forget) runs in a task of
        the nursery tree, and the request only waits for it: a client that hangs up cancels its wait, never the
        work half done (ADR 0014). Without a job nursery (a Supervisor driven by hand), in the caller's task."""
        if not self.boot.tree.attached:
            return await work()
        return await self.boot.run_in_tree(work, step)

    # -- cancel, reconcile, sweep ------------------------------------------------------------------------------

    async def cancel(self, job_id: str, *, by: By = None) -> Job:
        return await self.monitors.cancel(job_id, by)

    async def bulk_action(self, request: BulkRequest, *, by: By = None) -> BulkAnswer:
        """An operator's dry run or bulk action (``Bulk``): cancel or retry every job a selection names."""
        return await self.bulk.run(request, by)

    async def reconcile(self, *, stale_marks_live_processes: bool) -> ReconcileReport:
        return await self.reconciler.reconcile(stale_marks_live_processes=stale_marks_live_processes)

    async def operator_reconcile(self) -> ReconcileReport:
        """The manual reconcile route: an operator may evict a live job past the wall-clock window. Then the drainer
        runs a round for the slots it freed. Both in the nursery tree (``_in_tree``)."""

        async def work() -> ReconcileReport:
            report = await self.reconcile(stale_marks_live_processes=True)
            await self.drainer.round()
            return report

        return await self._in_tree(work, "operator_reconcile_failed")

    async def sweep(self) -> None:
        await self.sweeper.sweep()

    async def prune(self, *, dry_run: bool, limit: int) -> list[PrunedJob]:
        """The operator's prune, now: up to ``limit`` finished jobs past the retention, oldest first, removed with
        their files (``dry_run``: only what would go)."""
        return await self.pruner.prune(limit=limit, dry_run=dry_run)

    def retention(self) -> dict[str, float | int | None]:
        """The retention in force (None: that rule is off)."""
        return {"days": self.boot.config.retention_days, "max_jobs": self.boot.config.retention_max_jobs}

    # -- the event stream -----------------------------------------------------------------------------------

    def subscribe_events(
        self,
        *,
        last_event_id: str | None = None,
        jobs: Sequence[str] = (),
        kinds: Sequence[str] = (),
        backlog: bool = False,
        follow: bool = True,
    ) -> Subscription:
        """A reader of the event stream (see ``observe.EventLog.subscribe``); the caller closes it."""
        return self.event_log.subscribe(
            last_event_id=last_event_id, jobs=jobs, kinds=kinds, backlog=backlog, follow=follow
        )

    def end_event_streams(self) -> None:
        """Shutdown: every event stream ends (its reader gets what is queued, then the end); none is opened after."""
        self.event_log.close()

    # -- reads, heartbeats, logs, metrics -------------------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        return await self.rows.get(job_id)

    async def show(self, job_id: str) -> tuple[Job, list[str]]:
        """One job's row, and the jobs enqueued as explicit retries of it (oldest first)."""
        job = await self.rows.get(job_id)
        return job, await self.boot.registry.retries_of(job_id)

    async def list_jobs(self, page: PageRequest = FIRST_PAGE) -> tuple[list[Job], str | None]:
        """A page of the job list (``PageRequest.parse`` makes one from a request's text) and the next cursor."""
        return await self.rows.list_jobs(page)

    async def read_log(self, job_id: str, *, tail_bytes: int | None = None, offset: int | None = None) -> bytes:
        """A job's log: whole, its last ``tail_bytes``, or from byte ``offset`` on, in one piece (at most the log's
        cap). The API streams it instead (``log_slice``)."""
        piece = await self.log_slice(job_id, tail_bytes=tail_bytes, offset=offset)
        return b"".join([chunk async for chunk in piece.chunks()])

    async def log_slice(
        self, job_id: str, *, tail_bytes: int | None = None, offset: int | None = None, attempt: int | None = None
    ) -> LogSlice:
        """Which bytes of a job's log a read gets (``log_slice_of``; an unknown job raises first), a running job's log
        brought up to date first where output reaches it only at the end (``Executor.refresh_log``)."""
        job = await self.boot.registry.get(job_id)
        return await log_slice_of(job, tail_bytes, offset, attempt, self.boot.executor if self.boot.owns(job) else None)

    async def render_metrics(self) -> bytes:
        """``GET /metrics``: what this boot knows now over the registry's latest read (``_scrape.RegistryReads``)."""
        view, age_s = await self.registry_reads.latest()
        fault = self.boot.registry.fault()
        snapshot = Snapshot(
            registry=brought_up(view, self.heartbeats.known) if view is not None else None,
            registry_age_s=age_s,
            max_concurrent=self.boot.max_concurrent,
            writes_failing_since_s=fault.since.timestamp() if fault is not None else None,
            deliveries=dict(self.webhooks.outcomes),
            streams=self.event_log.stats(),
            conditions=dict(self.boot.tally.counts),
            queue=self.queue_watch.gauges(),
            schedules_missed=dict(self.queue_watch.schedules_missed),
        )
        return self.metrics.render(snapshot)
