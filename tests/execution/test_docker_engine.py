"""Docker mode when its engine is in trouble (ADR 0010): stopped (its socket refuses, or is not there), hung (it
accepts and never answers), or answering 500 (to everything, or to all but ``/_ping``, or to all but the container
list). Probes are UNKNOWN within the configured timeout, slots are kept, no job fails, the queue is held while starts
cannot be made, one WARNING says so per episode and one INFO when it ends, ``/api/health`` names it; and everything
resumes when the engine answers again.

The engine is a fake on a unix socket (``core_engine.FakeEngine``) that the test flips between its faults and proxying
to the real engine. The tests of the faults alone need no real engine; those that resume jobs are marked ``docker``.
The drainer's own hold is also checked on a virtual clock, against the in-memory executor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing
from core_engine import FakeEngine, Mode  # type: ignore[import-not-found]
from core_executors import PROGRAMS, DockerWorld, supervisors_in  # type: ignore[import-not-found]
from core_helpers import insert_running, poll, wait_running, wait_terminal  # type: ignore[import-not-found]
from structlog.testing import capture_logs

from supervisor import Config, ExecutorUnavailable, JobStatus, MemoryRegistry, Supervisor, load_kinds
from supervisor.core import ENGINE_UNAVAILABLE
from supervisor.domain import Job, PageRequest
from supervisor.execution import Executor, Launch, create_executor
from supervisor.execution.docker import ENGINE_ERRORS, container_record, make_client
from supervisor.execution.memory import MemoryExecutor, MemoryHandle
from supervisor.observe import JobEvent
from supervisor.registry import IdentityClaim

TIMEOUT_S = 0.5  # docker_timeout_s here: a hung engine is UNKNOWN after it
# With the real engine behind the fake: its `docker start` takes up to a second, and a start that times out and
# whose container cannot be removed in time either has an unknown outcome (it may yet run: see execution/docker.py).
REAL_TIMEOUT_S = 3.0
SLACK_S = 1.0  # what a probe may take beyond the timeout (a worker thread, the registry read before it)
TROUBLES: list[Mode] = ["stopped", "hang", "500", "ping_only"]


class _RealEngine(DockerWorld):
    """The real engine, behind the fake: what the resuming tests started there is removed at the end. The tests of
    the faults alone start nothing, and run where there is no engine at all."""

    def clean_up(self, jobs: list[Job]) -> None:
        with contextlib.suppress(*ENGINE_ERRORS):
            super().clean_up(jobs)


@pytest.fixture
def world() -> DockerWorld:
    return _RealEngine()  # made before DOCKER_HOST names the fake (the engine fixture asks for it first)


@pytest.fixture
async def engine(world: DockerWorld, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeEngine]:
    """The fake, serving until the supervisors made on it are torn down (their teardown stops jobs through it)."""
    # A short path: a unix socket's path is at most 107 bytes, and pytest's tmp_path with a test's name is longer.
    where = Path(tempfile.mkdtemp(prefix="fake-engine-", dir="/tmp"))
    fake = FakeEngine(where / "docker.sock")
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.run)
        monkeypatch.setenv("DOCKER_HOST", fake.url)  # what `serve` reads: the executor talks to the fake
        yield fake
        nursery.cancel_scope.cancel()
    shutil.rmtree(where, ignore_errors=True)


def docker_mode(config: Config) -> Executor:
    """The executor `serve` builds in docker mode (the engine from DOCKER_HOST, the configured timeout)."""
    return create_executor(dataclasses.replace(config, exec_mode="docker"), base_env={})


@pytest.fixture
async def make(
    engine: FakeEngine, world: DockerWorld, make_supervisor: Callable[..., Supervisor]
) -> AsyncIterator[Callable[..., Supervisor]]:
    made_here: list[Supervisor] = []
    async with supervisors_in(world, make_supervisor, docker_mode) as make_:

        def made(**kwargs: object) -> Supervisor:
            sup = make_(**{"docker_timeout_s": TIMEOUT_S, "sweep_interval_s": 3600, **kwargs})
            made_here.append(sup)
            return sup

        yield made
        # make_supervisor does not depend on the engine, so pytest-trio may tear the two down at once: its own stop
        # of what is still watched would then ask a fake that is gone, again and again (a stop is asked until the
        # engine answers). So a failed test's jobs are stopped here, through the real engine behind the fake, and
        # their monitors' ends awaited, while the fake still serves (this fixture is torn down before it).
        await engine.set_mode("proxy")
        with trio.fail_after(30):
            for sup in made_here:
                for entry in sup.boot.ledger.entries():
                    if entry.handle is not None:
                        await sup.executor.stop(entry.handle, 0)
                while len(sup.boot.ledger):  # noqa: ASYNC110 - monitors remove themselves; bounded above
                    await trio.sleep(0.01)


async def _prior_container_job(sup: Supervisor) -> Job:
    """A RUNNING row a prior boot left, recording a container: only the engine can say whether it lives."""
    row = await insert_running(sup, boot_id="prior-boot", spawned=False)
    [row] = await sup.registry.record_identities([IdentityClaim(row.job_id, container_record("c0ffee" * 10 + "beef"))])
    return row


async def _failed(sup: Supervisor) -> list[Job]:
    jobs, _ = await sup.registry.list_jobs(PageRequest.parse(status="failed", limit=100))
    return jobs


def _loud(logs: list[dict[str, object]]) -> list[str]:
    return [str(e["event"]) for e in logs if e["log_level"] in ("warning", "error", "critical")]


def _queue_lines(logs: list[dict[str, object]]) -> list[str]:
    return [str(e["event"]) for e in logs if e["event"] in ("drain_held", "drain_resumed")]


@pytest.mark.parametrize("trouble", [*TROUBLES, "absent"])
async def test_engine_trouble_keeps_slots_fails_nothing_holds_the_queue_and_warns_once_INV_UNKNOWN_KEEPS_SLOT(
    trouble: Mode | str, engine: FakeEngine, make: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    if trouble == "absent":
        monkeypatch.setenv("DOCKER_HOST", f"unix://{engine.path.parent}/no-such.sock")  # no engine was ever there
    else:
        await engine.set_mode(trouble)  # type: ignore[arg-type]
    sup = make(max_concurrent=2)  # a free slot: only the engine holds the queue
    prior = await _prior_container_job(sup)
    with capture_logs() as logs, trio.fail_after(20):
        queued = (await sup.enqueue("exit", {"code": 0})).job
        for _ in range(3):  # three sweeps' worth: one WARNING, not one per probe
            began = trio.current_time()
            report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
            took = trio.current_time() - began
            # Every engine call runs under the configured timeout: a hung engine is UNKNOWN after it, not later.
            assert took < TIMEOUT_S + SLACK_S
            if trouble == "hang":
                assert took >= TIMEOUT_S * 0.9  # it did wait for an answer, and gave up at the timeout
            [detail] = report.details
            assert (detail.action, detail.reason, detail.liveness) == ("keep", "liveness_unknown_kept", "unknown")
            await sup.drainer.drain()
        health = await sup.health()
    # INV-UNKNOWN-KEEPS-SLOT: the prior boot's job still holds its slot; the queued job was never promoted.
    assert (await sup.get(prior.job_id)).status is JobStatus.RUNNING
    waiting = await sup.get(queued.job_id)
    assert (waiting.status, waiting.attempts, waiting.started_at) == (JobStatus.QUEUED, 0, None)
    assert not await _failed(sup)
    assert _loud(logs) == ["docker_engine_unavailable"]  # one WARNING for the episode
    assert [e["event"] for e in logs if e["event"] == "drain_held"] == ["drain_held"]
    assert health.status == "degraded" and set(health.degraded) == {"engine"}
    assert "not answering since" in health.degraded["engine"]
    if trouble == "hang":
        assert "timed out" in health.degraded["engine"].lower()
    # The queue's watch names what holds it: the engine, with a job waiting and a slot free.
    signals = await sup.queue_watch.judge()
    assert set(signals.held) == {"engine_unreachable"} and signals.stuck is None  # not stuck before 900 s
    metrics = (await sup.render_metrics()).decode()
    assert 'podcast_queue_held{reason="engine_unreachable"} 1.0' in metrics


async def test_a_hung_engine_answers_unknown_within_the_configured_timeout_for_a_monitor_too(
    engine: FakeEngine, make: Callable[..., Supervisor]
) -> None:
    """The probe of a single row (a cancel of a prior boot's job) is bounded the same way, and keeps the slot."""
    await engine.set_mode("hang")
    sup = make(max_concurrent=1)
    prior = await _prior_container_job(sup)
    with trio.fail_after(TIMEOUT_S * 4 + SLACK_S * 2):
        began = trio.current_time()
        kept = await sup.cancel(prior.job_id)
        took = trio.current_time() - began
    # The evidence (one timeout) and the probe of the engine (another): never a wait without end.
    assert took < 2 * TIMEOUT_S + SLACK_S
    assert (kept.status, kept.cancel_requested) == (JobStatus.RUNNING, True)  # the cancel waits for the engine


async def test_as_many_calls_at_once_as_the_executor_makes_keep_their_connections_with_no_pool_full_warning(
    engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """The executor's threads may hold MAX_CALLS + MAX_WAITS connections at once (a wait slice per watched job). A
    client pool that keeps fewer opens the rest anyway and closes each on its return with a urllib3 WARNING: with
    more jobs watched than it kept (64 before), every wait slice of every job said "connection pool is full"."""
    await engine.set_mode("slow")  # each answer takes a while: the calls below overlap
    client = make_client(timeout=10)
    at_once = 100  # more than the 64 kept before
    threads = trio.CapacityLimiter(at_once)
    with caplog.at_level(logging.WARNING, logger="urllib3"), trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(at_once):
                nursery.start_soon(functools.partial(trio.to_thread.run_sync, client.ping, limiter=threads))
    await trio.to_thread.run_sync(client.close)
    assert len(engine.requests) == at_once
    assert [r.getMessage() for r in caplog.records if r.name.startswith("urllib3")] == []


# -- resuming: the fake proxies to the real engine again ------------------------------------------------------


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.parametrize("trouble", [*TROUBLES, "list_only", "list_then_hang"])
async def test_everything_resumes_when_the_engine_answers_again_and_nothing_failed_or_ran_twice(
    trouble: Mode, engine: FakeEngine, make: Callable[..., Supervisor]
) -> None:
    sup = make(max_concurrent=2, docker_timeout_s=REAL_TIMEOUT_S)
    gate = sup.data_dir / "gate"
    events: list[JobEvent] = []
    sup.events.subscribe(events.append)
    running = await wait_running(sup, (await sup.enqueue("gated", {"gate": str(gate), "code": 0})).job.job_id)
    await _trouble_then_resume(sup, engine, trouble, running, gate, events)  # `make` stops what a failure left


async def _trouble_then_resume(
    sup: Supervisor, engine: FakeEngine, trouble: Mode, running: Job, gate: Path, events: list[JobEvent]
) -> None:
    with capture_logs() as logs:
        await engine.set_mode(trouble)
        queued = (await sup.enqueue("exit", {"code": 0})).job
        with trio.fail_after(30):
            for _ in range(2):
                await sup.reconciler.reconcile(stale_marks_live_processes=False)
                await sup.drainer.drain()
        # The engine is named once a call of it fails: at once where it answers 500 or refuses, but list_then_hang's
        # only failures are calls that time out (the trial start's, and the monitor's wait if it asked after the
        # flip), and the rounds above may end before either has.
        await poll(_engine_degraded(sup), timeout_s=REAL_TIMEOUT_S + 10)
        assert (await sup.get(running.job_id)).status is JobStatus.RUNNING  # its slot kept
        waiting = await sup.get(queued.job_id)
        # Never started: still queued (list_only: promoted, its start refused, back at the head, uncounted), or
        # in the window of a trial start that the engine has not answered yet (list_then_hang).
        assert not waiting.spawned and waiting.status in (JobStatus.QUEUED, JobStatus.RUNNING)
        await trio.to_thread.run_sync(gate.write_text, "open")  # it ends while the engine cannot say so

        await engine.set_mode("proxy")
        done = await wait_terminal(sup, running.job_id, timeout_s=30)
        later = await wait_terminal(sup, queued.job_id, timeout_s=30)
        follow = await wait_terminal(sup, (await _follow_up_of(sup, running)).job_id, timeout_s=30)
        health = await sup.health()
    # INV-TRUE-OUTCOME: the engine kept the exit code; each job ran once.
    assert (done.status, done.exit_code, done.attempts) == (JobStatus.SUCCEEDED, 0, 1)
    assert (later.status, later.attempts) == (JobStatus.SUCCEEDED, 1)
    assert follow.status is JobStatus.SUCCEEDED
    assert not await _failed(sup)
    assert (health.status, health.degraded) == ("ok", {})
    assert _loud(logs) == ["docker_engine_unavailable"]
    assert [e["event"] for e in logs if e["event"] == "docker_engine_reachable"] == ["docker_engine_reachable"]
    assert _queue_lines(logs) == ["drain_held", "drain_resumed"]
    deferred = [e for e in events if e.job.job_id == queued.job_id and e.reason == ENGINE_UNAVAILABLE]
    assert all(e.job.status is JobStatus.QUEUED for e in deferred)
    if trouble in ("list_only", "list_then_hang"):
        assert deferred  # the probe passed; the start was refused and undone (else the probe held the queue)


def _engine_degraded(sup: Supervisor) -> Callable[[], Awaitable[bool | None]]:
    async def check() -> bool | None:
        degraded = (await sup.health()).degraded
        assert set(degraded) <= {"engine"}, degraded  # nothing but the engine is in trouble
        return True if degraded else None

    return check


async def _follow_up_of(sup: Supervisor, parent: Job) -> Job:
    """The `done` job a `gated` job's success enqueued."""

    async def found() -> Job | None:
        jobs, _ = await sup.registry.list_jobs(PageRequest.parse(kind="done", limit=10))
        return jobs[0] if jobs else None

    return await poll(found, timeout_s=30)


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.parametrize("reaches", [True, False], ids=["started_unanswered", "never_started"])
async def test_a_start_the_engine_never_answers_is_not_failed_and_is_judged_once_it_answers(
    reaches: bool, engine: FakeEngine, make: Callable[..., Supervisor]
) -> None:
    """ADR 0014 in docker mode: the container is made, its start is never answered and its removal neither, so
    nobody here can know whether it runs. Before: ``failed / spawn_failed: docker start: …`` with its slot freed, and
    a container that had started ran unwatched. Now the row keeps its slot, running, until the engine answers: the
    container that started is found and its true end recorded; the one that never started is removed and the job
    goes back to the queue uncounted and runs once."""
    sup = make(max_concurrent=1, docker_timeout_s=REAL_TIMEOUT_S)
    engine.start_reaches_engine = reaches
    await engine.set_mode("withhold_start")
    with capture_logs() as logs:
        job = (await sup.enqueue("exit", {"code": 0})).job

        async def given_up() -> Job | None:
            row = await sup.get(job.job_id)
            return row if row.status is JobStatus.RUNNING and not sup.boot.ledger.being_started(job.job_id) else None

        row = await poll(given_up, timeout_s=4 * REAL_TIMEOUT_S + 10)
        assert (row.spawned, row.error_reason) == (False, None)  # never failed
        assert any(e["event"] == "job_start_unknown" for e in logs)
        await engine.set_mode("proxy")

        async def ended() -> Job | None:
            await sup.sweeper.sweep()  # the sweeper's turn: the row is judged on what the engine says now
            final = await sup.get(job.job_id)
            return final if final.status.is_terminal else None

        final = await poll(ended, timeout_s=60)
    assert (final.status, final.exit_code, final.attempts, final.history) == (JobStatus.SUCCEEDED, 0, 1, ())
    assert await sup.read_log(job.job_id) == b"bye\n"  # it ran once
    assert not await _failed(sup)


# -- the drainer's hold, on a virtual clock ---------------------------------------------------------------------


class _StartsRefused(MemoryExecutor):
    """An engine whose containers can be listed (the probe passes) and not made: every start raises
    ``ExecutorUnavailable`` while ``refusing``, after ``refuse_after_s`` (an engine that takes its time to fail);
    the times of the refused starts are kept."""

    def __init__(self, nursery: trio.Nursery, *, enough: int, refuse_after_s: float = 0.0) -> None:
        super().__init__(PROGRAMS, nursery)
        self.refuse_after_s = refuse_after_s
        self.refusing = True
        self.refused_at: list[float] = []
        self.enough = trio.Event()  # set at the ``enough``-th refused start
        self._enough = enough

    async def start(self, launch: Launch) -> MemoryHandle:
        if self.refusing:
            self.refused_at.append(trio.current_time())
            if len(self.refused_at) == self._enough:
                self.enough.set()
            if self.refuse_after_s:
                await trio.sleep(self.refuse_after_s)
            raise ExecutorUnavailable("docker create: APIError: 500 Server Error: Internal Server Error")
        return await super().start(launch)


@pytest.mark.parametrize("refuse_after_s", [0.0, 0.3])
@pytest.mark.timeout(60)  # a drainer that spun on a stale retry time would never let the virtual clock move
async def test_a_start_the_engine_cannot_make_requeues_the_job_uncounted_holds_the_queue_INV_IDENTITY_BEFORE_PROGRAM(
    autojump_clock: trio.testing.MockClock,  # pytest-trio runs the test on a clock the test itself requests
    kinds_file: Path,
    tmp_path: Path,
    refuse_after_s: float,
) -> None:
    """On the in-memory registry and a virtual clock: the drainer holds the queue and asks again on its own, backing
    off, for as long as starts are refused; the job is never failed nor its start counted; the first start the engine
    makes again runs it. A trial start still under way (an engine slow to refuse) is waited for: its outcome sets the
    next retry; the drainer never makes a second trial at the same moment nor spins on the retry time it passed."""
    events: list[JobEvent] = []
    done = trio.Event()
    requeued_8 = trio.Event()

    def on_event(event: JobEvent) -> None:
        events.append(event)
        if sum(e.job.status is JobStatus.QUEUED and e.previous_status == "running" for e in events) == 8:
            requeued_8.set()
        if event.job.status.is_terminal:
            done.set()

    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            machine = _StartsRefused(nursery, enough=8, refuse_after_s=refuse_after_s)
            config = Config(data_dir=tmp_path / "data", bind_port=0, kinds_file=kinds_file, sweep_interval_s=86400.0)
            sup = Supervisor(
                config, load_kinds(kinds_file), MemoryRegistry(), boot_id="b", executor=machine, standalone=True
            )
            sup.events.subscribe(on_event)
            sup.attach(nursery)
            await nursery.start(sup.drainer.run)  # no sweeper: the drainer alone must come back to the queue
            job = (await sup.enqueue("exit", {"code": 0})).job
            # No deadline around the waits: the autojumping clock jumps to a pending deadline while a worker thread
            # runs (the pause file's look), which would end a bound early. pytest-timeout is the backstop.
            await requeued_8.wait()  # the 8th refused start is back in the queue
            held = await sup.get(job.job_id)
            machine.refusing = False
            await done.wait()
            final = await sup.get(job.job_id)
            finished_at = trio.current_time()
            nursery.cancel_scope.cancel()
    # Never failed, never counted: back at the head of the queue after each refused start.
    assert (held.status, held.attempts, held.started_at) == (JobStatus.QUEUED, 0, None)
    tries = machine.refused_at
    gaps = [later - earlier for earlier, later in itertools.pairwise(tries)]
    # The hold's retries: 0.5 s doubling to 10 s. No busy loop, and no giving up.
    # (A retry or two more may come before the test task runs again: a worker thread lets the virtual clock jump.)
    # Each retry is counted from the refusal before it, so a slow refusal adds its own time to every gap.
    backoff = [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert gaps[:7] == pytest.approx([b + refuse_after_s for b in backoff]), gaps
    assert all(g == pytest.approx(10.0 + refuse_after_s) for g in gaps[7:]), gaps
    requeued = [e for e in events if e.job.status is JobStatus.QUEUED and e.previous_status == "running"]
    assert len(requeued) == len(tries) and {e.reason for e in requeued} == {ENGINE_UNAVAILABLE}
    assert (final.status, final.attempts) == (JobStatus.SUCCEEDED, 1)
    assert finished_at - tries[-1] <= 10.0 + refuse_after_s  # the next retry started it, with no wake from outside
    assert _queue_lines(logs) == ["drain_held", "drain_resumed"]
    assert not _loud(logs)  # the engine's own WARNING is the executor's (docker mode); the queue's lines are INFO
