"""``Supervisor``: the core's one surface. The HTTP layer and the CLI only translate into calls on it.

It holds no rule itself (``_rules`` does): it builds one boot's parts, each with the parts it calls (``_ports`` names
what one offers another), declares the event bus's listeners, and starts its parts' tasks (``start``):

    Supervisor              its tasks in the order ``Supervisor.start`` starts them in the root nursery:
    ├── fleet               this host's lease, the lead, the leader's silent-host rounds       _fleet.Fleet
    ├── drainer             promotes and starts jobs when woken                                _drain.Drainer
    ├── wake-ups            acts on other hosts' changes at once (LISTEN/NOTIFY)               _wakeups.WakeupListener
    ├── webhook sender      delivers the registry's outbox                                     observe.WebhookSender
    ├── check-in            this process's presence: its own absence ages no job               _absence.AbsenceTracker
    ├── sweeper             reconcile -> absence -> drain -> the queue's watch, on a timer     _sweeper.Sweeper
    ├── heartbeat writer    the beats the API took, written behind (ADR 0018)                  _heartbeats.Heartbeats
    └── job nursery         (started first: ``_tree.run_job_nursery``)
        ├── one monitor per running job, and each cancel's stop task                           _monitor.Monitors
        └── whatever the executor runs there (the shepherd's reader)                           execution/
"""

from __future__ import annotations

import functools
import os
import random
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio
from prometheus_client import CollectorRegistry

from ..domain import (
    FIRST_PAGE,
    BulkRequest,
    Config,
    Conflict,
    Doorbell,
    Job,
    JobRequest,
    KindCatalog,
    PageRequest,
    Progress,
    RequestError,
    RequestKey,
    Schedule,
    utc_now,
)
from ..execution import Executor, create_executor
from ..observe import (
    EventBus,
    EventLog,
    JobEvent,
    Metrics,
    Snapshot,
    Subscription,
    WebhookSender,
    get_logger,
    log_event,
)
from ..registry import PAUSED_BY_OPERATOR, EnqueueResult, PrunedJob, Registry
from ._absence import AbsenceJudge, AbsenceTracker
from ._boot import Boot
from ._bulk import Bulk, BulkAnswer
from ._drain import Drainer
from ._enqueue import Enqueuer
from ._fleet import Fleet
from ._heartbeats import CurrentRows, Heartbeats
from ._hosts import HostAdmin
from ._logs import LogSlice, log_slice_of
from ._monitor import Monitors
from ._pause import PauseFile
from ._prune import Pruner
from ._queue_watch import QueueWatch
from ._reconcile import Reconciler, ReconcileReport
from ._scrape import RegistryReads, brought_up
from ._silent import SilentHostJobs
from ._standing import Standing
from ._status import Health, QueueState, health_of, queue_state_of
from ._sweeper import QuietSweeps, Sweeper
from ._tree import run_job_nursery
from ._wakeups import WakeupListener

log = get_logger()

# The request-facing methods' types: an Idempotency-Key, who asks (an API token's name), what an enqueue answers.
Key = RequestKey | None
By = str | None
Sched = Schedule | None
Params = Mapping[str, object] | None  # a JSON object's names and values (parsed at the edge: api.parse_job)
Enqueued = EnqueueResult
Subscriber = Callable[[JobEvent], None]  # a listener of the event bus (``observe.EventBus.subscribe``)
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


def _boot_of(
    config: Config,
    kinds: KindCatalog,
    registry: Registry,
    events: EventBus,
    boot_id: str | None,
    base_env: Mapping[str, str] | None,
    executor: Executor | None,
    wall_clock: Callable[[], datetime] | None,
    standalone: bool,
) -> Boot:
    """The one place a boot's shared state is put together (``Boot``: every part takes it first)."""
    env = dict(base_env if base_env is not None else os.environ)
    for name in _PRIVATE_ENV:
        env.pop(name, None)
    return Boot(
        config=config,
        kinds=kinds,
        registry=registry,
        # The exec mode is chosen here, once per boot: nothing else branches on it.
        executor=executor if executor is not None else create_executor(config, base_env=env),
        events=events,
        boot_id=boot_id or secrets.token_hex(16),
        data_dir=config.data_dir.resolve(),
        log_dir=config.jobs_log_dir.resolve(),
        # What the fleet lets this host do (written by the fleet task alone): INV-NO-PROMOTION-WITHOUT-LEASE.
        standing=Standing(config.max_concurrent, standalone=standalone),
        wall_clock=wall_clock or utc_now,
    )


class Supervisor:
    """One boot of the supervisor over ``registry``: the core's one surface. The HTTP layer, the CLI, ``supervisor
    serve``'s root and the scenario kit call its verbs and read its properties, and nothing past them
    (``tests/test_front_door.py`` holds them to that): ``start`` (the boot's tasks, in order), the client's verbs
    (``enqueue``, ``cancel``, ``pause``, ``resume``, ``list_jobs``, ``heartbeat``, ``subscribe_events``, ...), and what
    a boot is (``config``, ``boot_id``, ``leading``, ``settled``, ...).

    Its parts are public attributes too (``boot``, ``drainer``, ``monitors``, ``reconciler``, ``sweeper``, ``fleet``,
    ``heartbeats``, ``absence``, ``queue_watch``, ``pruner``, ``pause_file``, ``enqueuer``, ``webhooks``,
    ``event_log``, ``metrics``): the seam of a test that drives the tree by hand (``attach``, then a part's own verb:
    ``drainer.drain``, ``sweeper.sweep``, ``reconciler.reconcile``), never of a client.
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
        webhook_poll_s: float | None = None,
        jitter: random.Random | None = None,
        subscribers: Sequence[Subscriber] = (),
    ) -> None:
        """``wall_clock``: the time this boot stamps and judges by (default: the system's). ``standalone``: no fleet
        task runs; the boot promotes and leads without a lease (else not until the fleet task's first renewal).
        ``succeeds``: this host's previous boot, proved gone (``DataDirLock``). ``heartbeat_base_url``: how jobs reach
        the API (default: the config's). The scenario kit's seams: ``webhook_transport`` (httpx's), ``webhook_poll_s``
        (the sender's look at the outbox unwoken; default the sweep interval), ``jitter`` (the draws that spread
        resubmissions apart), ``subscribers`` (more listeners on the event bus)."""
        self.events = EventBus()
        self.boot = _boot_of(config, kinds, registry, self.events, boot_id, base_env, executor, wall_clock, standalone)
        # Rung by whatever may free a slot or queue a job (an enqueue, a job's end, a cancel, a resume, a sweep),
        # waited on by the drainer alone: many rings make one drain.
        self.drain_bell = Doorbell()
        self.tracker = AbsenceTracker(wall_clock=self.boot.wall_clock)
        self._build_the_queue(heartbeat_base_url or config.heartbeat_base_url, jitter)
        self._build_the_fleet(succeeds)
        self._build_the_observers(webhook_transport, webhook_poll_s)
        self._build_the_sweep()
        self._subscribe(subscribers)

    def _build_the_queue(self, heartbeat_base_url: str | None, jitter: random.Random | None) -> None:
        """The parts a job passes through, from its enqueue to its end: each built with the parts it calls (the
        drainer and the monitors meet through the drain bell, not each other: no cycle)."""
        boot, bell = self.boot, self.drain_bell
        self.heartbeats = Heartbeats(boot.registry, self.tracker, boot.wall_clock)
        # Every read that judges or shows progress goes through here: it sees every beat taken before it (ADR 0018).
        self.rows = CurrentRows(boot.registry, self.heartbeats)
        self.enqueuer = Enqueuer(boot, bell)
        self.monitors = Monitors(boot, bell, self.enqueuer, self.heartbeats, jitter=jitter)
        self.bulk = Bulk(boot, self.enqueuer, self.monitors)
        self.pause_file = PauseFile(boot)
        self.drainer = Drainer(boot, bell, self.monitors, self.pause_file, heartbeat_base_url)
        self.reconciler = Reconciler(boot, self.monitors, bell)

    def _build_the_fleet(self, succeeds: str | None) -> None:
        """This host among others (ADR 0012): its lease and lead, the operator's view of the hosts, and the leader's
        judge of a silent host's jobs (only by proof of their end that this host can read)."""
        boot, bell = self.boot, self.drain_bell
        self.silent_hosts = SilentHostJobs(boot, self.monitors, bell)
        self.host_admin = HostAdmin(boot, self.monitors, bell)
        self.fleet = Fleet(
            boot, drainer=self.drainer, hosts=self.host_admin, silent_jobs=self.silent_hosts, succeeds=succeeds
        )
        # What other hosts change (an enqueue, a cancel of a job here, the pause), heard at once; the sweep is the
        # guarantee (INV-NOTIFY-IS-A-HINT).
        self.wakeups = WakeupListener(boot, bell, self.monitors)

    def _build_the_observers(self, transport: httpx.AsyncBaseTransport | None, poll_s: float | None) -> None:
        """What reports: the metrics, the webhook sender, the event stream's readers."""
        boot, config = self.boot, self.boot.config
        self.metrics = Metrics()
        # The durable copy of each event is the registry's outbox row, written in the change's own transaction; the
        # sender (a root-nursery task) delivers it and is woken by the bus. INV-ONE-LEADER: one sender for the fleet
        # keeps delivery in order.
        self.webhooks = WebhookSender(config, boot.registry, lead=boot.standing, poll_s=poll_s, transport=transport)
        # The event stream's readers (GET /api/events): numbered, kept for resume, each with its own bounded queue.
        self.event_log = EventLog(
            boot.boot_id,
            boot.wall_clock,
            replay_events=config.events_replay_events,
            client_buffer_events=config.events_client_buffer_events,
            max_clients=config.events_max_clients,
        )

    def _build_the_sweep(self) -> None:
        """The sweep's steps (``Sweeper``, in its order) and what only they use."""
        boot = self.boot
        self.absence = AbsenceJudge(boot, self.reconciler, self.tracker, self.rows)
        # History past its retention goes a batch at a time; one host of a fleet prunes (INV-ONE-LEADER's duties).
        self.pruner = Pruner(boot)
        # queue.stuck / queue.moving go through the outbox: the watch wakes the sender.
        self.queue_watch = QueueWatch(boot, self.drainer, self.webhooks)
        self.sweeper = Sweeper(
            boot, self.reconciler, self.absence, self.drainer, self.metrics, self.pause_file, self.pruner,
            self.queue_watch,
        )  # fmt: skip
        self.registry_reads = RegistryReads(boot, self.queue_watch)

    def _subscribe(self, extra: Sequence[Subscriber]) -> None:
        """Every listener of the boot's event bus, in the order each hears an event (docs/architecture.md § The event
        seam draws them): the log line, the metrics, the webhook sender's wake, the event stream, the absence
        tracker (a promotion starts a job's clocks), the heartbeats (a job's tokens and latest beats), then
        ``extra``."""
        listeners = (
            log_event,
            self.metrics.on_event,
            self.webhooks.wake,
            self.event_log.on_event,
            self.tracker.on_event,
            self.heartbeats.on_event,
            *extra,
        )
        for listener in listeners:
            self.events.subscribe(listener)

    async def start(
        self, root: trio.Nursery, *, virtual_time: bool = False, quiet_sweeps: QuietSweeps | None = None
    ) -> None:
        """Start this boot's tasks in ``root``, each part's own task with ``root.start`` (it returns once each is
        ready), in this order; cancelling ``root`` ends the boot, and its jobs run on (they are the executor's).

        ``virtual_time``: the boot runs on ``trio.testing.MockClock`` (the scenario kit), where time moves only when
        every task waits, so this process can never be frozen while time passes: the check-in that notices such a
        freeze is not started (INV-OWN-ABSENCE-NOT-THE-JOBS holds without it). ``quiet_sweeps`` (virtual time only):
        says when the sweeps have nothing to act on, so that the sweeper sleeps through those ticks."""
        self.attach(await root.start(run_job_nursery))
        # This host's lease, the fleet's lead and its limit (ADR 0012): settled before anything promotes.
        await root.start(self.fleet.run)
        await root.start(self.drainer.run)
        # Listening before the startup sweep: a change made after this is heard, one made before is swept.
        await root.start(self.wakeups.run)
        # Started before the first sweep, so that events left undelivered by a previous boot go out first.
        await root.start(self.webhooks.run)
        # This process's own presence, noted every half second: an absence (a freeze) is not the jobs'.
        if not virtual_time:
            await root.start(self.tracker.keep_checking_in)
        # The startup sweep runs before serving; it never waits on a job, so /api/health is not delayed.
        await root.start(functools.partial(self.sweeper.run, quiet=quiet_sweeps))
        await root.start(self.heartbeats.run)  # the beats the API takes, written behind (ADR 0018)

    # -- what a boot is ------------------------------------------------------------------------------------

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
        """``trio.current_time()`` of the last sweep's end (the watchdog's sign of life)."""
        return self.sweeper.last_sweep_done

    @property
    def leading(self) -> bool:
        """This host leads the fleet now (ADR 0012)."""
        return self.fleet.leading

    @property
    def settled(self) -> bool:
        """This boot watches and starts no job, and what a previous boot left unreleased is released."""
        return self.sweeper.leftovers_released and not len(self.boot.ledger)

    @property
    def metrics_registry(self) -> CollectorRegistry:
        """The Prometheus registry of this boot's metrics (the HTTP server adds its own collector to it)."""
        return self.metrics.registry

    def attach(self, job_nursery: trio.Nursery) -> None:
        """Give the supervisor the nursery that owns every monitor (and any task its executor runs)."""
        self.boot.tree.attach(job_nursery)
        self.boot.executor.attach(job_nursery)

    async def hosts(self) -> dict[str, Any]:
        """Every host of the fleet, live or silent, and which leads (``HostAdmin.view``)."""
        return await self.host_admin.view()

    async def drain_host(self, host_id: str, drained: bool, by: By = None) -> dict[str, Any]:
        """Drain or undrain any host of the fleet, this one too (``HostAdmin.drain``)."""
        return await self.host_admin.drain(host_id, drained, by)

    async def forget_host(self, host_id: str) -> dict[str, Any]:
        """The operator says host ``host_id`` will never come back (``HostAdmin.forget``), in a task of the tree.
        Refused for this host."""
        if host_id == self.boot.host_id:
            raise Conflict(f"host {host_id} is this supervisor: it cannot forget itself")
        return await self._in_tree(lambda: self.host_admin.forget(host_id), "host_forget_failed")

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

    async def is_paused(self) -> bool:
        return (await self.boot.registry.pause_state()).paused

    async def health(self) -> Health:
        """Always answers (a health check must not fail with what it reports): what works, and what does not."""
        return await health_of(self.boot, self.queue_watch)

    async def queue_state(self) -> QueueState:
        return await queue_state_of(self.boot, self.queue_watch)

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

    # -- cancel, bulk, the operator's reconcile, prune -----------------------------------------------------------

    async def cancel(self, job_id: str, *, by: By = None) -> Job:
        return await self.monitors.cancel(job_id, by)

    async def bulk_action(self, request: BulkRequest, *, by: By = None) -> BulkAnswer:
        """An operator's dry run or bulk action (``Bulk``): cancel or retry every job a selection names."""
        return await self.bulk.run(request, by)

    async def operator_reconcile(self) -> ReconcileReport:
        """The manual reconcile route: an operator may evict a live job past the wall-clock window. Then the drainer
        runs a round for the slots it freed. Both in the nursery tree (``_in_tree``)."""

        async def work() -> ReconcileReport:
            report = await self.reconciler.reconcile(stale_marks_live_processes=True)
            await self.drainer.round()
            return report

        return await self._in_tree(work, "operator_reconcile_failed")

    async def prune(self, *, dry_run: bool, limit: int) -> list[PrunedJob]:
        """The operator's prune, now: up to ``limit`` finished jobs past the retention, oldest first, removed with
        their files (``dry_run``: only what would go)."""
        return await self.pruner.prune(limit=limit, dry_run=dry_run)

    def retention(self) -> dict[str, float | int | None]:
        """The retention in force (None: that rule is off)."""
        return {"days": self.boot.config.retention_days, "max_jobs": self.boot.config.retention_max_jobs}

    # -- the event stream -----------------------------------------------------------------------------------

    def subscribe_events(
        self, *, last_event_id: str | None = None, jobs: Sequence[str] = (), kinds: Sequence[str] = (),
        backlog: bool = False, follow: bool = True,
    ) -> Subscription:  # fmt: skip
        """A reader of the event stream (see ``observe.EventLog.subscribe``); the caller closes it."""
        return self.event_log.subscribe(
            last_event_id=last_event_id, jobs=jobs, kinds=kinds, backlog=backlog, follow=follow
        )

    def end_event_streams(self) -> None:
        """Shutdown: every event stream ends (its reader gets what is queued, then the end); none is opened after."""
        self.event_log.close()

    async def heartbeat(self, job_id: str, token: str, progress: Callable[[], Awaitable[Progress]]) -> None:
        """A running job's heartbeat: ``token`` is checked first (401 unless it is ``job_id``'s), then ``progress()``
        reads the body (the edge's parse; its ``RequestError`` answered as it is, unless the token no longer works),
        then the beat is taken, to be written behind (ADR 0018)."""
        admission = await self.heartbeats.admit(job_id, token)
        try:
            beat = await progress()
        except RequestError as exc:
            await self.heartbeats.refuse(admission, exc)
        self.heartbeats.take(admission, beat)

    def deliver_webhooks(self) -> None:
        """Wake the webhook sender: what the outbox holds goes out now (a registry that answers again)."""
        self.webhooks.wake()

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
