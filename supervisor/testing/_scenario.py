"""A scenario: the production core on the in-memory registry and the scripted executor, in virtual time.

What runs is the tree ``run_supervisor`` starts (``Supervisor.start``: the fleet task, drainer, monitors, sweeper,
queue watch, heartbeat writer, webhook sender), but the HTTP server: no socket, no subprocess, no real sleep. The
kinds are read from a kinds file by the loader ``supervisor serve`` uses. The operator's verbs are the ``Supervisor``
calls the API makes. Time is the test's ``MockClock``, jumping whenever every task waits; blocking calls (a log
file's write) run inline while a scenario is open, so virtual time never runs ahead of real work.
"""

from __future__ import annotations

import math
import signal as signals
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager, suppress
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from difflib import get_close_matches
from inspect import isawaitable
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing

from ..core import BulkAnswer, ReconcileReport, Supervisor
from ..domain import (
    SETTINGS,
    BulkRequest,
    Config,
    Job,
    JobFilter,
    JobStatus,
    KindCatalog,
    KindsFileError,
    Progress,
    RegistryError,
    RequestError,
    SupervisorError,
    config_from,
    load_kinds,
)
from ..execution.memory import Program
from ..registry import MemoryRegistry, PrunedJob
from ._executor import Script, ScriptedExecutor, ScriptOf, check_kind_settings, chosen_by
from ._record import CuttableBackend, Draws, QuietGate, Record, Transition, kinds_toml_of, write_kinds_file

# The wall-clock time at virtual time 0: every scenario starts on the same date, so that its rows and events repeat.
SCENARIO_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# Where the outbox's webhooks go: nowhere on the network (the scenario's transport records them).
WEBHOOK_URL = "http://webhooks.scenario.invalid/events"
HOST_ID = "scenario"
# One host: nothing waits on its lease, so it is renewed every 20 minutes, not every 5 s (a scenario that tests an
# outage's effect on the lease sets host_lease_s itself).
SCENARIO_LEASE_S = 3600
Predicate = Callable[[], bool | Awaitable[bool]]
Behaviour = Script | ScriptOf


class ScenarioError(SupervisorError):
    """A scenario used out of order (``enqueue`` before ``start``, ``restart`` of a running boot), or not in
    virtual time."""


class ScenarioTimeout(ScenarioError):
    """``advance_until`` / ``advance_until_ended``: what was awaited did not happen within the virtual time given."""


class Scenario:
    """One scenario; made by ``open_scenario`` (or the ``supervisor_scenario`` fixture), ended with it."""

    def __init__(self, data_dir: Path, nursery: trio.Nursery, record: Record, draws: Draws) -> None:
        self._data_dir = data_dir
        self._nursery = nursery  # the machine (jobs) and the boots live here, beside the test's own tasks
        self._record = record
        self._draws = draws
        self._config: Config | None = None
        self._kinds: KindCatalog | None = None
        self._registry: MemoryRegistry | None = None
        self._backend: CuttableBackend | None = None
        self._machine: ScriptedExecutor | None = None
        # The running boot: its root's cancel scope, and the event its task sets when it has ended (each boot its own
        # pair, so no waiter is ever left on an event a later boot replaced).
        self._boot: tuple[trio.CancelScope, trio.Event] | None = None
        self._boots = 0
        self._bulk_used = False  # a bulk selection expires in an hour: sweeps are never quiet after one
        self.supervisor: Supervisor | None = None  # the boot running now (None after a crash, until restart)

    # -- setting it up -------------------------------------------------------------------------------------

    script = staticmethod(Script)

    async def start(
        self,
        *,
        kinds: Mapping[str, Script] | None = None,
        kinds_toml: str | None = None,
        kinds_file: str | Path | None = None,
        behave: Mapping[str, Behaviour] | None = None,
        seed: int = 0,
        **settings: Any,
    ) -> None:
        """The first boot. The kinds: a kinds file (``kinds_toml``: its text; ``kinds_file``: its path), read as
        ``supervisor serve`` reads it, built-ins included, with ``behave``: how each kind's process behaves (a
        ``Script``, or a function of the job's params that returns one); or ``kinds={name: script}``, each script's
        kind settings made into that kinds file. ``seed``: every draw of the scenario (jitter, ids, the order of
        tasks ready at one instant). ``settings``: ``Config``'s field names, checked as a config file's values."""
        if self._config is not None:
            raise ScenarioError("the scenario is started already: restart() starts a new boot")
        known = {f.name for f in fields(Config)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"unknown setting {unknown[0]!r}: a scenario takes Config's field names{_hint(unknown[0])}")
        behaviours = self._kinds_file(kinds, kinds_toml, kinds_file, behave)
        if kinds_file is not None or kinds_toml is not None or kinds:
            settings["kinds_file"] = self._kinds_path if kinds_file is None else Path(kinds_file)
        values: dict[str, Any] = {
            "data_dir": str(self._data_dir), "host_id": HOST_ID, "webhook_url": WEBHOOK_URL,
            "host_lease_s": SCENARIO_LEASE_S,
        }  # fmt: skip
        config = config_from({**values, **settings})
        catalog = load_kinds(config.kinds_file)  # what `supervisor serve` does with its config's kinds file
        strange = sorted(set(behaviours) - set(catalog.names()))
        if strange:
            raise KindsFileError(f"behave names {strange[0]!r}, a kind the kinds file does not declare")
        self._draws.seed(seed)
        self._config, self._kinds = config, catalog
        registry = MemoryRegistry(boot_id=None, outbox=True, clock=self.now)
        self._backend = registry.backend = CuttableBackend(clock=self.now)
        self._registry = registry
        self._machine = ScriptedExecutor(self._programs(behaviours), self._nursery, beat=self._beat)
        await self._start_boot(succeeds=None)

    @property
    def _kinds_path(self) -> Path:
        return self._data_dir / "scenario-kinds.toml"

    def _kinds_file(
        self,
        kinds: Mapping[str, Script] | None,
        kinds_toml: str | None,
        kinds_file: str | Path | None,
        behave: Mapping[str, Behaviour] | None,
    ) -> dict[str, Behaviour]:
        """Write the kinds file the arguments stand for (if any); the behaviour of each kind, by name."""
        if kinds_toml is not None and kinds_file is not None:
            raise ScenarioError("give kinds_toml or kinds_file, not both")
        if kinds is not None:
            if kinds_toml is not None or kinds_file is not None or behave is not None:
                raise ScenarioError("kinds={...} is a kinds file of its own: give it alone, or kinds_toml with behave")
            if not kinds:
                raise ScenarioError("a scenario needs at least one kind: kinds={'name': scenario.script(...)}")
            write_kinds_file(self._kinds_path, kinds_toml_of(kinds))
            return dict(kinds)
        if kinds_toml is not None:
            write_kinds_file(self._kinds_path, kinds_toml)
        for name, behaviour in (behave or {}).items():
            if isinstance(behaviour, Script):
                check_kind_settings(name, behaviour)
            elif not callable(behaviour):
                raise TypeError(f"behave[{name!r}] must be sc.script(...) or a function of params, not {behaviour!r}")
        return dict(behave or {})

    def _programs(self, behaviours: Mapping[str, Behaviour]) -> dict[str, Script | Program]:
        return {
            name: b if isinstance(b, Script) else chosen_by(b, self._beat, self._params_of)
            for name, b in behaviours.items()
        }

    # -- what the test does ----------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The scenario's wall clock: ``SCENARIO_EPOCH`` plus the virtual time."""
        return SCENARIO_EPOCH + timedelta(seconds=trio.current_time())

    async def enqueue(self, kind: str, **params: Any) -> str:
        """Enqueue a job as the API would (validated against its kind); its id."""
        return (await self._running().enqueue(kind, params)).job.job_id

    async def job(self, job_id: str) -> Job:
        """The job's row as the registry holds it now (beats taken so far written first, as any read does)."""
        if self.supervisor is not None:
            return await self.supervisor.get(job_id)
        return await self._started_registry().get(job_id)

    async def counts(self) -> dict[str, int]:
        """How many jobs are in each status now (every status named, 0 included)."""
        counts = await self._started_registry().counts()
        return {str(status): counts.get(str(status), 0) for status in JobStatus}

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass while every task (boots, jobs, the test's own) runs, then let what is
        due at that instant happen."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, not {seconds!r}")
        await trio.sleep(seconds)
        await trio.testing.wait_all_tasks_blocked()

    async def advance_until(self, predicate: Predicate, *, within: float) -> None:
        """Let virtual time pass until ``predicate()`` (a function, plain or async) holds, at most ``within`` virtual
        seconds (else ``ScenarioTimeout``). It is asked now, whenever something happens (a transition, a webhook, a
        log line, a beat) once that instant has settled, and at the limit."""
        if within < 0:
            raise ValueError(f"within must be >= 0, not {within!r}")
        limit = trio.current_time() + within
        while True:
            await trio.testing.wait_all_tasks_blocked()
            answer = predicate()
            if await answer if isawaitable(answer) else answer:
                return
            if trio.current_time() >= limit:
                raise ScenarioTimeout(f"not within {within:g} virtual seconds: {predicate!r}")
            with trio.move_on_at(limit):
                await self._record.changed.wait()

    async def advance_until_ended(self, job_id: str, *, within: float) -> Job:
        """Let virtual time pass until the job ends (succeeded, failed, cancelled or stale; a resubmitted job goes on),
        at most ``within`` virtual seconds (else ``ScenarioTimeout``); its final row."""

        async def ended() -> bool:
            return (await self.job(job_id)).status.is_terminal

        await self.advance_until(ended, within=within)
        return await self.job(job_id)

    def kill(self, job_id: str, signal: str | int = "SIGKILL") -> None:
        """The job's process dies from outside (``kill -9`` by default; any signal by name or number). A script that
        ignores SIGTERM lives on through a SIGTERM from outside, as a process that ignores it does."""
        signum = signals.Signals[signal] if isinstance(signal, str) else signals.Signals(signal)
        machine = self._started_machine()
        if job_id not in machine.jobs:
            raise ScenarioError(f"job {job_id} has no process (not started yet?)")
        if signum is signals.SIGTERM and machine.jobs[job_id].ignores_sigterm:
            return
        machine.kill(job_id, signum)

    async def crash(self, *, box: bool = False) -> None:
        """The supervisor dies at once (SIGKILL): its tasks end, beats taken but not yet written are lost, and its
        jobs run on. ``box=True``: the whole machine goes down with it (a reboot): every job's process is gone too,
        with no record of how it ended."""
        if self._boot is None or self.supervisor is None:
            raise ScenarioError("no boot is running: start() or restart() first")
        scope, ended = self._boot
        scope.cancel()
        await ended.wait()
        self._boot = None
        self.supervisor = None
        if box:
            machine = self._started_machine()
            for job_id, job in machine.jobs.items():
                if job.status is None:
                    machine.lose(job_id)
        await trio.testing.wait_all_tasks_blocked()

    async def restart(self) -> None:
        """A new boot on the same registry and machine, as ``supervisor serve`` started again: its startup sweep
        finds what the last boot left (it succeeds that boot at once: its data dir's lock proves it gone)."""
        if self.supervisor is not None:
            raise ScenarioError("a boot is running: crash() it first")
        previous = self._registry.author.boot_id if self._registry is not None else None
        await self._start_boot(succeeds=previous)

    # -- the operator's verbs: the calls the API makes ---------------------------------------------------------

    async def cancel(self, job_id: str) -> Job:
        """``POST /api/jobs/{id}/cancel``: a queued job ends cancelled; a running one is stopped (SIGTERM, then SIGKILL
        after ``cancel_grace_s``) and ends cancelled once its process has ended. The row as the cancel left it."""
        return await self._running().cancel(job_id, by="scenario")

    async def retry(self, job_id: str) -> str:
        """``POST /api/jobs/{id}/retry``: a new job with the finished one's kind and params; its id."""
        return (await self._running().retry(job_id, by="scenario")).job.job_id

    async def bulk(self, action: str, *, dry_run: bool = False, **filters: str) -> BulkAnswer:
        """``POST /api/jobs/bulk``: ``action`` (``cancel`` or ``retry``) of every job the list's ``filters`` select
        (``status="failed"``, ``kind="x"``, ``reason=...``). ``dry_run=True``: only the selection; else the dry run,
        then the action on exactly its selection (each job's result in ``results``, their counts in ``outcomes``)."""
        supervisor = self._running()
        self._bulk_used = True
        # The filters as the API's query reads them (JobFilter.parse), so a bad one is the API's 422 error.
        dry = BulkRequest(action, JobFilter.parse(filters, supervisor.kinds), dry_run=True)
        selected = await supervisor.bulk_action(dry, by="scenario")
        if dry_run:
            return selected
        act = BulkRequest(action, selection=selected.selection)
        return await supervisor.bulk_action(act, by="scenario")

    async def pause(self) -> None:
        """``POST /api/queue/pause``: nothing more is promoted; running jobs run on."""
        await self._running().pause()
        self._record.ring()

    async def resume(self) -> None:
        """``POST /api/queue/resume``: promotion resumes, whoever paused it (the pause file goes too)."""
        await self._running().resume()

    def pause_file(self, present: bool = True) -> None:
        """The operator's pause file (``touch`` / ``rm`` of the config's ``pause_flag_path``): noticed at the next
        sweep or drain, as by a running supervisor."""
        path = self._started_config().pause_flag_path
        if present:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.unlink(missing_ok=True)
        self._record.ring()  # the quiet sweeper looks again

    async def reconcile(self) -> ReconcileReport:
        """``POST /api/jobs/reconcile``: the operator's reconcile (it may evict a live job past the wall-clock
        window)."""
        return await self._running().operator_reconcile()

    async def prune(self, *, dry_run: bool = False, limit: int = 1000) -> list[PrunedJob]:
        """``POST /api/jobs/prune``: up to ``limit`` finished jobs past the retention go now, with their files."""
        return await self._running().prune(dry_run=dry_run, limit=limit)

    def make_unreachable(self, what: str) -> None:
        """``"engine"``: the machine does not answer (evidence is unknown, starts wait); ``"registry"``: every read
        and write fails as a database that does not answer. Until ``make_reachable``."""
        if what == "engine":
            self._started_machine().unreachable()
        elif what == "registry":
            self._started_backend().cut(self.now())
        else:
            raise ValueError(f"what must be 'engine' or 'registry', not {what!r}")
        self._record.ring()

    def make_reachable(self, what: str) -> None:
        """The engine or the registry answers again."""
        if what == "engine":
            self._started_machine().reachable()
        elif what == "registry":
            self._started_backend().mend()
            if self.supervisor is not None:
                self.supervisor.deliver_webhooks()  # what the outage held in the outbox goes out
        else:
            raise ValueError(f"what must be 'engine' or 'registry', not {what!r}")
        self._record.ring()

    # -- what the test reads -----------------------------------------------------------------------------------

    def webhooks(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """Every webhook body the outbox delivered, in order (as a receiver would have parsed them); ``job_id``: only
        that job's."""
        hooks = self._record.webhooks
        return [h for h in hooks if job_id is None or (h.get("job") or {}).get("job_id") == job_id]

    def log(self, job_id: str | None = None) -> list[MutableMapping[str, Any]]:
        """The structured log lines so far, each a dict (``event`` is its name); ``job_id``: only those naming it."""
        return [line for line in self._record.logs if job_id is None or line.get("job_id") == job_id]

    def transitions(self, job_id: str | None = None) -> list[Transition]:
        """Every status change, in order (``Transition``: ``at``, ``job_id``, ``kind``, ``status``, ``reason``,
        ``boot_id``); ``job_id``: only that job's."""
        return [t for t in self._record.transitions if job_id is None or t.job_id == job_id]

    @property
    def executor(self) -> ScriptedExecutor:
        """The machine: its ``jobs`` (each one's ``status``, ``output``), shared by every boot."""
        return self._started_machine()

    # -- the boots -------------------------------------------------------------------------------------------

    async def _start_boot(self, *, succeeds: str | None) -> None:
        assert self._config is not None and self._kinds is not None and self._registry is not None
        self._boots += 1
        boot_id = f"boot-{self._boots}"
        registry = self._registry = self._registry.reopened(boot_id=boot_id)
        supervisor = Supervisor(
            self._config, self._kinds, registry, boot_id=boot_id, executor=self._started_machine(),
            wall_clock=self.now, succeeds=succeeds, webhook_transport=httpx.MockTransport(self._received),
            # The sender looks at the outbox every sweep interval for events another process wrote: in a scenario
            # only this boot writes them, and each wakes it (an outage's held events go out as the registry answers).
            webhook_poll_s=math.inf,
            jitter=self._draws.jitter,  # one seeded generator across boots: the scenario repeats
            subscribers=[self._record.on_event],
        )  # fmt: skip
        ended = trio.Event()
        quiet = QuietGate(supervisor, self._record.moved, bulk_used=lambda: self._bulk_used)
        self._boot = (await self._nursery.start(self._run_boot, supervisor, ended, quiet), ended)
        self.supervisor = supervisor

    @staticmethod
    async def _run_boot(
        supervisor: Supervisor,
        ended: trio.Event,
        quiet: QuietGate,
        *,
        task_status: trio.TaskStatus[trio.CancelScope],
    ) -> None:
        try:
            async with trio.open_nursery() as root:
                await supervisor.start(root, virtual_time=True, quiet_sweeps=quiet)
                task_status.started(root.cancel_scope)
                await trio.sleep_forever()
        finally:
            ended.set()

    def _received(self, request: httpx.Request) -> httpx.Response:
        """The webhook receiver: each body recorded, answered 200."""
        self._record.webhook(request.content)
        return httpx.Response(200)

    async def _beat(self, job_id: str, token: str, progress: Progress) -> None:
        """A scripted job's heartbeat, as the route takes it: nowhere while no boot runs (a refused connection),
        and a refusal (an ended job's token, a registry that does not answer) changes nothing, as for the runner."""
        supervisor = self.supervisor
        if supervisor is None:
            return

        async def given() -> Progress:
            return progress

        with suppress(RequestError, RegistryError):
            await supervisor.heartbeat(job_id, token, given)
        self._record.changed.ring()

    async def _params_of(self, job_id: str) -> Mapping[str, Any]:
        """A scripted job's params: its row's (what its argv was rendered from)."""
        return (await self._started_registry().get(job_id)).params

    def _running(self) -> Supervisor:
        if self.supervisor is None:
            raise ScenarioError("no boot is running: start() or restart() first")
        return self.supervisor

    def _started_config(self) -> Config:
        if self._config is None:
            raise ScenarioError("the scenario is not started: start() first")
        return self._config

    def _started_registry(self) -> MemoryRegistry:
        if self._registry is None:
            raise ScenarioError("the scenario is not started: start() first")
        return self._registry

    def _started_backend(self) -> CuttableBackend:
        if self._backend is None:
            raise ScenarioError("the scenario is not started: start() first")
        return self._backend

    def _started_machine(self) -> ScriptedExecutor:
        if self._machine is None:
            raise ScenarioError("the scenario is not started: start() first")
        return self._machine


def _hint(name: str) -> str:
    """The field an unknown setting's name stands for: a variable's (``PODCAST_JOB_SILENT_SECONDS``), or a near one."""
    by_env = {setting.env: setting.attr for setting in SETTINGS}
    near = by_env.get(name.upper()) or next(iter(get_close_matches(name, [f.name for f in fields(Config)], n=1)), None)
    where = "docs/settings.md names each beside its PODCAST_JOB_* variable"
    return f" (did you mean {near}? {where})" if near else f" ({where})"


@asynccontextmanager
async def open_scenario(data_dir: Path) -> AsyncIterator[Scenario]:
    """A scenario whose files (the jobs' logs) go under ``data_dir``, inside the calling task's time: it must run
    on a ``trio.testing.MockClock`` (the fixture sees to it; autojump is set to 0 here). Every task it started ends
    with the block."""
    clock = trio.lowlevel.current_clock()
    if not isinstance(clock, trio.testing.MockClock):
        raise ScenarioError(
            "a scenario runs in virtual time: run it on trio.testing.MockClock (the supervisor_scenario fixture does)"
        )
    clock.autojump_threshold = 0
    real_run_sync = trio.to_thread.run_sync

    async def inline(fn: Any, *args: Any, **_: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    trio.to_thread.run_sync = inline  # type: ignore[assignment]
    record, draws = Record(), Draws()
    try:
        with record.capturing_logs(), draws.installed():
            async with trio.open_nursery() as nursery:
                yield Scenario(data_dir, nursery, record, draws)
                nursery.cancel_scope.cancel()
    finally:
        trio.to_thread.run_sync = real_run_sync
