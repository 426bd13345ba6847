"""A scenario: the production core on the in-memory registry and the scripted executor, in virtual time.

What runs is the tree ``run_supervisor`` starts (``core.start_tree``: the fleet task, drainer, monitors, sweeper,
absence judge, queue watch, heartbeat writer, webhook sender), but the HTTP server: no socket, no subprocess, no real
sleep. Time is the test's ``MockClock``, jumping whenever every task waits; blocking calls (a log file's write) run
inline while a scenario is open, so virtual time never runs ahead of real work. Hours of a scenario take well under a
second.
"""

from __future__ import annotations

import json
import signal as signals
from collections.abc import AsyncIterator, Mapping, MutableMapping
from contextlib import asynccontextmanager, suppress
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import structlog.testing
import trio
import trio.testing

from ..core import Supervisor, start_tree
from ..domain import Config, Job, KindCatalog, Progress, RegistryError, RequestError, SupervisorError, config_from
from ..registry import MemoryRegistry
from ._executor import Script, ScriptedExecutor

# The wall-clock time at virtual time 0: every scenario starts on the same date, so that its rows and events repeat.
SCENARIO_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# Where the outbox's webhooks go: nowhere on the network (the scenario's transport records them).
WEBHOOK_URL = "http://webhooks.scenario.invalid/events"
HOST_ID = "scenario"


class ScenarioError(SupervisorError):
    """A scenario used out of order (``enqueue`` before ``start``, ``restart`` of a running boot), or not in
    virtual time."""


class Scenario:
    """One scenario; made by ``open_scenario`` (or the ``supervisor_scenario`` fixture), ended with it."""

    def __init__(self, data_dir: Path, nursery: trio.Nursery, logs: list[MutableMapping[str, Any]]) -> None:
        self._data_dir = data_dir
        self._nursery = nursery  # the machine (jobs) and the boots live here, beside the test's own tasks
        self._logs = logs
        self._webhooks: list[dict[str, Any]] = []
        self._config: Config | None = None
        self._kinds: KindCatalog | None = None
        self._registry: MemoryRegistry | None = None
        self._machine: ScriptedExecutor | None = None
        # The running boot: its root's cancel scope, and the event its task sets when it has ended (each boot its own
        # pair, so no waiter is ever left on an event a later boot replaced).
        self._boot: tuple[trio.CancelScope, trio.Event] | None = None
        self._boots = 0
        self.supervisor: Supervisor | None = None  # the boot running now (None after a crash, until restart)

    # -- setting it up -------------------------------------------------------------------------------------

    @staticmethod
    def script(
        run_for: float | None = None,
        exit_code: int = 0,
        beats_every: float | None = None,
        progress_every: float | None = None,
        ignore_sigterm: bool = False,
        *,
        max_attempts: int = 1,
        retry_backoff_s: float = 60.0,
        max_running: int | None = None,
        deadline_s: float | None = None,
    ) -> Script:
        """A kind whose "process" behaves so in virtual time (``Script`` says what each argument means)."""
        return Script(
            run_for, exit_code, beats_every, progress_every, ignore_sigterm, max_attempts, retry_backoff_s, max_running,
            deadline_s,
        )  # fmt: skip

    async def start(self, *, kinds: Mapping[str, Script], **settings: Any) -> None:
        """The first boot: ``kinds`` by name; ``settings`` by ``Config``'s field names (``max_concurrent``,
        ``sweep_interval_s``, ``progress_stale_after_s``, ``stall_action``, ...). An unknown name is a ``TypeError``
        naming it; a bad value, the ``ConfigError`` a real boot would give."""
        if self._config is not None:
            raise ScenarioError("the scenario is started already: restart() starts a new boot")
        known = {f.name for f in fields(Config)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"unknown setting {unknown[0]!r}: a scenario takes Config's field names")
        if not kinds:
            raise ScenarioError("a scenario needs at least one kind: kinds={'name': scenario.script(...)}")
        # One host: nothing waits on its lease, so it is renewed a minute apart, not every 5 s (a quarter of the
        # wake-ups of an hours-long scenario); a caller's host_lease_s stands.
        values: dict[str, Any] = {
            "data_dir": str(self._data_dir), "host_id": HOST_ID, "webhook_url": WEBHOOK_URL, "host_lease_s": 60,
        }  # fmt: skip
        self._config = config_from({**values, **settings})
        self._kinds = KindCatalog({name: script.kind(name) for name, script in kinds.items()})
        self._registry = MemoryRegistry(boot_id=None, outbox=True, clock=self.now)
        self._machine = ScriptedExecutor(kinds, self._nursery, beat=self._beat)
        await self._start_boot(succeeds=None)

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

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass while every task (boots, jobs, the test's own) runs, then let what is
        due at that instant happen."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, not {seconds!r}")
        await trio.sleep(seconds)
        await trio.testing.wait_all_tasks_blocked()

    def kill(self, job_id: str, signal: str | int = "SIGKILL") -> None:
        """The job's process dies from outside (``kill -9`` by default; any signal by name or number)."""
        signum = signals.Signals[signal] if isinstance(signal, str) else signals.Signals(signal)
        machine = self._started_machine()
        if job_id not in machine.jobs:
            raise ScenarioError(f"job {job_id} has no process (not started yet?)")
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
        previous = self._registry.rules.boot_id if self._registry is not None else None
        await self._start_boot(succeeds=previous)

    def webhooks(self) -> list[dict[str, Any]]:
        """Every webhook body the outbox delivered, in order (as a receiver would have parsed them)."""
        return list(self._webhooks)

    def log(self) -> list[MutableMapping[str, Any]]:
        """The structured log lines so far, each a dict (``event`` is its name)."""
        return list(self._logs)

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
        )  # fmt: skip
        ended = trio.Event()
        self._boot = (await self._nursery.start(self._run_boot, supervisor, ended), ended)
        self.supervisor = supervisor

    @staticmethod
    async def _run_boot(
        supervisor: Supervisor, ended: trio.Event, *, task_status: trio.TaskStatus[trio.CancelScope]
    ) -> None:
        try:
            async with trio.open_nursery() as root:
                await start_tree(supervisor, root)
                task_status.started(root.cancel_scope)
                await trio.sleep_forever()
        finally:
            ended.set()

    def _received(self, request: httpx.Request) -> httpx.Response:
        self._webhooks.append(json.loads(request.content))
        return httpx.Response(200)

    async def _beat(self, job_id: str, token: str, progress: Progress) -> None:
        """A scripted job's heartbeat, as the route takes it: nowhere while no boot runs (a refused connection),
        and a refusal (an ended job's token) changes nothing, as for the runner."""
        supervisor = self.supervisor
        if supervisor is None:
            return
        with suppress(RequestError, RegistryError):
            supervisor.heartbeats.take(await supervisor.heartbeats.admit(job_id, token), progress)

    def _running(self) -> Supervisor:
        if self.supervisor is None:
            raise ScenarioError("no boot is running: start() or restart() first")
        return self.supervisor

    def _started_registry(self) -> MemoryRegistry:
        if self._registry is None:
            raise ScenarioError("the scenario is not started: start() first")
        return self._registry

    def _started_machine(self) -> ScriptedExecutor:
        if self._machine is None:
            raise ScenarioError("the scenario is not started: start() first")
        return self._machine


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
    try:
        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                yield Scenario(data_dir, nursery, logs)
                nursery.cancel_scope.cancel()
    finally:
        trio.to_thread.run_sync = real_run_sync
