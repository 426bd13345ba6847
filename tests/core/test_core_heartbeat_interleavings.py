"""The heartbeat writer's protocol between tasks, driven through random interleavings (ADR 0019): beats taken by the
API, reads that write what is pending first, a writer task, failing and slow registry writes, cancelled reads and a
shutdown that writes on the way out. A hypothesis state machine picks the order; a ``MockClock`` that only the rules
move makes each step deterministic.

Invariants (ADR 0018, INV-PROGRESS-NOT-LIVENESS):
- a beat taken is a beat written: with the registry healthy, within ``FLUSH_INTERVAL_S`` of being taken plus the
  write in flight and its own write (after an outage, from the writer's retry on), without any read's help;
- nothing is lost: once the registry is healthy and time passes, the registry holds every job's highest watermark;
- a read through ``CurrentRows`` sees every beat taken before it (when the registry can write);
- what the absence tracker is told never goes back (an older watermark than one already recorded);
- nothing is counted twice: a write carries one merged beat per job and token.

``JobTokens`` (the token check before a beat's body is read) gets a machine of its own, below.

The registry here is a small fake of the two calls the writer makes (``record_heartbeats``, ``check_job_token``) and
the read ``get``: the writer's protocol is what is under test. The real registries' own heartbeat writes are covered by
the contract suite, and the whole path by the end-to-end tests (``test_core_heartbeat.py``,
``tests/runner/test_runner_stall_under_supervisor.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing
from core_helpers import take_beat  # type: ignore[import-not-found]
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from trio_portal import Portal

from supervisor.core import FLUSH_INTERVAL_S, WRITE_RETRY_S, CurrentRows, Heartbeats, JobTokens
from supervisor.domain import Job, JobStatus, RegistryUnavailable, RequestError, from_iso, hash_token
from supervisor.observe import EventName, JobEvent
from supervisor.registry import Beat

JOBS = ("a", "b", "c")
LATENCIES = (0.0, 0.01, 0.2)
MAX_LATENCY_S = max(LATENCIES)
TEMPLATE = Job(
    job_id="a", seq=1, kind="k", params={}, argv=[], status=JobStatus.RUNNING, error_reason=None, exit_code=None,
    created_at=from_iso("2026-01-01T00:00:00+00:00"), started_at=None, ended_at=None, attempts=1,
    cancel_requested=False, boot_id="b", identity=None, token_hash=None,
    completed_units=0, total_units=None, stage=None, last_heartbeat_at=None, last_progress_at=None, log_path=None,
)  # fmt: skip


class FakeRegistry:
    """``record_heartbeats`` that takes ``latency`` of virtual time and then fails while ``failing``."""

    def __init__(self) -> None:
        self.units = dict.fromkeys(JOBS, 0)
        self.failing = False
        self.latency = 0.0
        self.healthy_since = 0.0  # when ``failing`` was last turned off
        self.written_at: dict[str, list[tuple[float, int]]] = {job: [] for job in JOBS}  # (when, watermark)

    async def check_job_token(self, job_id: str, token: str) -> None:
        return None

    async def record_heartbeats(self, beats: Sequence[Beat]) -> list[Job | RequestError]:
        await trio.sleep(self.latency)
        if self.failing:
            raise RegistryUnavailable("the disk is full")
        keys = [(beat.job_id, beat.token) for beat in beats]
        assert len(keys) == len(set(keys)), f"a write carried a job's beats unmerged: {keys}"
        rows: list[Job | RequestError] = []
        for beat in beats:
            self.units[beat.job_id] = max(self.units[beat.job_id], beat.completed_units)
            self.written_at[beat.job_id].append((trio.current_time(), self.units[beat.job_id]))
            rows.append(self._row(beat.job_id))
        return rows

    async def get(self, job_id: str) -> Job:
        return self._row(job_id)

    def _row(self, job_id: str) -> Job:
        return dataclasses.replace(TEMPLATE, job_id=job_id, completed_units=self.units[job_id])


class _Tracker:
    """Stands for the absence tracker: what it was told, per job."""

    def __init__(self, told: dict[str, int]) -> None:
        self.told = told

    def beat(self, job: Job) -> None:
        # INV-PROGRESS-NOT-LIVENESS: the tracker never sees a watermark go back.
        assert job.completed_units >= self.told.get(job.job_id, 0), "the tracker was told an older watermark"
        self.told[job.job_id] = job.completed_units


class HeartbeatWriterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = trio.testing.MockClock()  # moved only inside a rule (autojump while the rule runs)
        self.portal = Portal(clock=self.clock).__enter__()
        self.registry = FakeRegistry()
        self.told: dict[str, int] = {}  # what the absence tracker was told, per job
        self.beats = Heartbeats(self.registry, _Tracker(self.told))  # type: ignore[arg-type]
        self.rows = CurrentRows(self.registry, self.beats)  # type: ignore[arg-type]
        for job in JOBS:  # as this boot's promotion would have: no registry read before a beat is taken
            self.beats.tokens.remember(job, "t", self.beats.tokens.generation)
        self.taken: list[tuple[float, str, int]] = []  # (when, job, watermark) of every beat answered 204
        self.writer: trio.CancelScope | None = None
        self.writer_done: trio.Event | None = None
        self._run(self._start_writer)

    def teardown(self) -> None:
        try:
            self._run(self._stop_writer)
        finally:
            self.portal.close()

    # -- plumbing ----------------------------------------------------------------------------------------------

    def _run(self, fn: Any, *args: Any) -> Any:
        async def in_virtual_time() -> Any:
            self.clock.autojump_threshold = 0  # time moves while this rule waits, through every task's deadline
            try:
                return await fn(*args)
            finally:
                self.clock.autojump_threshold = float("inf")  # and stands still between rules

        return self.portal.run(in_virtual_time)

    async def _start_writer(self) -> None:
        self.writer_done = done = trio.Event()

        async def writer(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await self.beats.run()
            done.set()

        assert self.portal.nursery is not None
        self.writer = await self.portal.nursery.start(writer)

    async def _stop_writer(self) -> None:
        if self.writer is not None and self.writer_done is not None:
            self.writer.cancel()
            await self.writer_done.wait()  # its shielded last write is done

    # -- rules -------------------------------------------------------------------------------------------------

    @rule(job=st.sampled_from(JOBS), units=st.integers(0, 40))
    def beat(self, job: str, units: int) -> None:
        async def body() -> object:
            return {"completed_units": units}

        async def take() -> None:
            await take_beat(self.beats, job, "t", body)
            self.taken.append((trio.current_time(), job, units))

        self._run(take)

    @rule(job=st.sampled_from(JOBS))
    def read(self, job: str) -> None:
        async def read() -> tuple[bool, int, int]:
            healthy = not self.registry.failing
            want = max([units for _, j, units in self.taken if j == job], default=0)
            row = await self.rows.get(job)
            return healthy and not self.registry.failing, want, row.completed_units

        healthy, want, seen = self._run(read)
        if healthy:
            assert seen >= want, f"a read saw watermark {seen} of {job} after a 204 for {want}"

    @rule(job=st.sampled_from(JOBS), after=st.sampled_from((0.0, 0.005, 0.1)))
    def cancelled_read(self, job: str, after: float) -> None:
        async def read() -> None:
            with trio.move_on_after(after):
                await self.rows.get(job)

        self._run(read)

    @rule(seconds=st.sampled_from((0.0, 0.01, FLUSH_INTERVAL_S, 0.3, WRITE_RETRY_S, 3.0)))
    def advance(self, seconds: float) -> None:
        self._run(trio.sleep, seconds)

    @rule(failing=st.booleans())
    def registry_fails(self, failing: bool) -> None:
        async def switch() -> None:
            if self.registry.failing and not failing:
                self.registry.healthy_since = trio.current_time()
            self.registry.failing = failing

        self._run(switch)

    @rule(latency=st.sampled_from(LATENCIES))
    def registry_latency(self, latency: float) -> None:
        self.registry.latency = latency

    @rule()
    def shutdown_and_restart(self) -> None:
        async def restart() -> None:
            await self._stop_writer()
            await self._start_writer()

        self._run(restart)

    @rule()
    def settle(self) -> None:
        """The registry heals and time passes: every beat taken is in it, without a read."""
        self.registry_fails(False)
        self.advance(WRITE_RETRY_S + FLUSH_INTERVAL_S + 2 * MAX_LATENCY_S + 0.01)
        for job in JOBS:
            want = max([units for _, j, units in self.taken if j == job], default=0)
            assert self.registry.units[job] == want, f"{job}: {self.registry.units[job]} written, {want} taken"
        assert self.beats.pending == 0

    # -- invariants --------------------------------------------------------------------------------------------

    @invariant()
    def every_beat_is_written_in_time(self) -> None:
        """With the registry healthy from when the beat was taken (or from the writer's retry after an outage), it
        is written within the interval plus the write in flight plus its own write."""
        if self.registry.failing:
            return
        now = self.clock.current_time()
        bound = FLUSH_INTERVAL_S + 2 * MAX_LATENCY_S
        for taken_at, job, units in self.taken:
            due = max(taken_at + bound, self.registry.healthy_since + WRITE_RETRY_S + bound)
            if now < due:
                continue
            # The registry's watermark only rises: the first write that reached ``units`` is the one that counts.
            written = [at for at, watermark in self.registry.written_at[job] if watermark >= units]
            assert written and written[0] <= due, f"a beat of {job} ({units}) taken at {taken_at} not written by {due}"


TestHeartbeatWriter = HeartbeatWriterMachine.TestCase
TestHeartbeatWriter.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class _NoWitness:
    def beat(self, job: Job) -> None:
        """No absence tracker hears the beats here."""


@pytest.mark.parametrize("after_read", [True, False])
async def test_a_beat_taken_after_a_read_is_written_by_the_writer_alone(
    autojump_clock: trio.testing.MockClock, after_read: bool
) -> None:
    """The defect ADR 0019 names, as it was met: once a read had written the pending beats while the writer waited, no
    beat was written again until the next read (the read replaced the writer's wake-up ``Event``)."""
    registry = FakeRegistry()
    beats = Heartbeats(registry, _NoWitness())  # type: ignore[arg-type]
    rows = CurrentRows(registry, beats)  # type: ignore[arg-type]
    beats.tokens.remember("a", "t", beats.tokens.generation)

    async def units(n: int) -> None:
        async def body() -> object:
            return {"completed_units": n}

        await take_beat(beats, "a", "t", body)

    async with trio.open_nursery() as nursery:
        await nursery.start(beats.run)
        await units(1)
        await trio.sleep(1)  # written; the writer waits for the next beat
        if after_read:
            assert (await rows.get("a")).completed_units == 1  # a read while the writer waits
        for n in range(2, 12):
            taken = trio.current_time()
            await units(n)
            await trio.sleep(0.1)
            assert registry.units["a"] == n, "a beat taken was not written"
            assert registry.written_at["a"][-1][0] - taken == pytest.approx(FLUSH_INTERVAL_S)
        nursery.cancel_scope.cancel()


class JobTokensMachine(RuleBasedStateMachine):
    """``JobTokens`` between the tasks that share it: the bus (a promotion learns a token, an end or a requeue forgets
    it) and heartbeat lookups that read the generation, await the registry, and then remember what it admitted.
    Invariant: a token is admitted from memory only while its job runs with that token -- never an ended job's, nor a
    resubmitted job's earlier attempt's (the lookup that raced with the end must not bring it back)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = JobTokens()
        self.running: dict[str, str] = {}  # the registry's truth: job -> its current attempt's token
        self.attempts: dict[str, int] = dict.fromkeys(JOBS, 0)
        self.lookups: list[tuple[str, str, int, bool]] = []  # (job, token, generation read, registry admitted)

    def _event(self, job: str, status: JobStatus, token: str | None) -> JobEvent:
        row = dataclasses.replace(
            TEMPLATE, job_id=job, status=status, token_hash=hash_token(token) if token is not None else None
        )
        return JobEvent(EventName.TRANSITION, row, "queued", None, "b")

    @rule(job=st.sampled_from(JOBS))
    def promote(self, job: str) -> None:
        if job in self.running:
            return
        self.attempts[job] += 1
        token = f"{job}-{self.attempts[job]}"
        self.running[job] = token
        self.tokens.on_event(self._event(job, JobStatus.RUNNING, token))

    @rule(job=st.sampled_from(JOBS))
    def adopt(self, job: str) -> None:
        """A job this boot did not promote (a previous boot's, another host's): running, its token never learnt."""
        if job in self.running:
            return
        self.attempts[job] += 1
        self.running[job] = f"{job}-{self.attempts[job]}"

    @rule(job=st.sampled_from(JOBS), status=st.sampled_from([JobStatus.SUCCEEDED, JobStatus.QUEUED]))
    def end_or_requeue(self, job: str, status: JobStatus) -> None:
        self.running.pop(job, None)
        self.tokens.on_event(self._event(job, status, None))

    @rule(job=st.sampled_from(JOBS), attempt=st.integers(1, 3))
    def lookup_begins(self, job: str, attempt: int) -> None:
        """A beat not admitted from memory: the generation is read, then the registry is asked (an await)."""
        token = f"{job}-{attempt}"
        if self.tokens.admits(job, token):
            return
        self.lookups.append((job, token, self.tokens.generation, False))

    @rule(data=st.data())
    def registry_answers(self, data: st.DataObject) -> None:
        if not self.lookups:
            return
        i = data.draw(st.integers(0, len(self.lookups) - 1))
        job, token, generation, _ = self.lookups[i]
        if self.running.get(job) == token:
            self.lookups[i] = (job, token, generation, True)
        else:
            del self.lookups[i]  # a 401: nothing to remember

    @rule(data=st.data())
    def lookup_remembers(self, data: st.DataObject) -> None:
        admitted = [i for i, lookup in enumerate(self.lookups) if lookup[3]]
        if not admitted:
            return
        job, token, generation, _ = self.lookups.pop(data.draw(st.sampled_from(admitted)))
        self.tokens.remember(job, token, generation)

    @invariant()
    def only_a_running_attempts_token_is_admitted(self) -> None:
        for job in JOBS:
            for attempt in range(1, self.attempts[job] + 2):
                token = f"{job}-{attempt}"
                if self.tokens.admits(job, token):
                    assert self.running.get(job) == token, f"{token} admitted while {job} runs {self.running.get(job)}"


TestJobTokens = JobTokensMachine.TestCase
TestJobTokens.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
