"""A fleet of supervisors on one registry (ADR 0012), on virtual time: two hosts, each with its own
"machine" (an in-memory executor that only it can see), one shared in-memory registry.

- no host judges a process it cannot see: another host's running rows are never finalized by this one's sweeps;
- INV-ONE-LEADER: the lead passes only after the leader's lease has expired, and a leader that cannot renew stops
  leading before that; never two leaders at one instant;
- a silent host's jobs stay as they are (ERROR naming the host) until the operator forgets it; forgetting a live
  host is refused;
- INV-SILENT-HOST-ENDS-BY-PROOF: the leader ends a silent host's job only on proof of its end that it can reach (here
  one "machine" shared by two hosts, as an engine both reach), with its true outcome and the kind's resubmission; no
  proof (running, lost, the engine unreachable), a live lease, or not leading: untouched; the owner and the leader
  at once: one end;
- a cancel through a host that does not own the job is carried out by the owner, and the row ends ``cancelled``
  only once the job is gone.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
import trio
import trio.testing
from core_executors import PROGRAMS  # type: ignore[import-not-found]

from supervisor import Config, Conflict, Supervisor, load_kinds
from supervisor.domain import JobStatus, SteadyWallClock
from supervisor.execution.memory import MemoryExecutor
from supervisor.registry import Lease, MemoryRegistry, PromoteRequest, Promotion, Registry

NOW = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
LEASE_S = 15.0
KINDS = """
[kinds.sleep]
argv = ["{python}", "-c", "pass", "{seconds}"]
params = { seconds = "float" }

[kinds.retried_sleep]
argv = ["{python}", "-c", "pass", "{seconds}"]
params = { seconds = "float" }
max_attempts = 2
retry_backoff_seconds = 30
"""


class Partitionable:
    """The shared registry as one host reaches it: ``cut`` makes every lease renewal of that host hang (a host
    partitioned from the database), while the other host's view works; ``dead`` makes every call of it hang (a host
    SIGKILLed: nothing it would write lands); ``hold_finalize``, while set and not yet open, holds its finalizes
    back (an end on its way). Not a subclass: every other attribute, its state included, is the shared registry's
    own."""

    def __init__(self, shared: MemoryRegistry) -> None:  # a view: every call goes to ``shared``
        self.__dict__["_shared"] = shared
        self.__dict__["cut"] = False
        self.__dict__["dead"] = False
        self.__dict__["hold_finalize"] = None
        self.__dict__["promote_delay_s"] = 0.0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.__dict__["_shared"], name)
        if not inspect.iscoroutinefunction(found):
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.__dict__["dead"]:
                await trio.sleep_forever()
            gate = self.__dict__["hold_finalize"]
            if name == "finalize" and gate is not None:
                await gate.wait()
            return await found(*args, **kwargs)

        return call

    async def renew_lease(
        self, host_id: str, boot_id: str, *, lease_s: float, lead: bool, succeeds: str | None = None
    ) -> Lease:
        if self.__dict__["cut"] or self.__dict__["dead"]:
            await trio.sleep_forever()  # the hang a partition gives: no answer, no error
        shared = self.__dict__["_shared"]
        result: Lease = await shared.renew_lease(host_id, boot_id, lease_s=lease_s, lead=lead, succeeds=succeeds)
        return result

    async def promote(self, request: PromoteRequest) -> Promotion:
        """A promotion whose answer takes ``promote_delay_s`` to come back (committed first, answered late)."""
        if self.__dict__["dead"]:
            await trio.sleep_forever()
        result: Promotion = await self.__dict__["_shared"].promote(request)
        await trio.sleep(self.__dict__["promote_delay_s"])
        return result


@dataclass
class Host:
    sup: Supervisor
    machine: MemoryExecutor
    view: Partitionable


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)  # see test_core_clock: thread hops finish first


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Callable[..., Host]]:
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    clock = SteadyWallClock(wall=lambda: NOW + timedelta(seconds=trio.current_time()), monotonic=trio.current_time)
    shared = MemoryRegistry(clock=clock)
    async with trio.open_nursery() as machines, trio.open_nursery() as nursery:

        def make(
            host_id: str,
            *,
            fleet_task: bool = True,
            max_concurrent: int = 4,
            machine: MemoryExecutor | None = None,
            kinds_text: str = KINDS,
        ) -> Host:
            """A host; ``machine``: another host's, shared (one engine that both reach), else one of its own;
            ``kinds_text``: its kinds file's (the fleet's by default)."""
            own_kinds = kinds if kinds_text == KINDS else tmp_path / f"kinds-{host_id}.toml"
            own_kinds.write_text(kinds_text)
            config = Config(
                data_dir=tmp_path / host_id,
                bind_port=0,
                kinds_file=own_kinds,
                max_concurrent=max_concurrent,
                sweep_interval_s=86400.0,
                host_id=host_id,
                host_lease_s=LEASE_S,
            )
            machine = machine if machine is not None else MemoryExecutor(PROGRAMS, machines)
            view = Partitionable(shared)
            registry = cast(Registry, view)
            sup = Supervisor(
                config,
                load_kinds(own_kinds),
                registry,
                boot_id=f"boot-{host_id}",
                executor=machine,
                wall_clock=clock,
                standalone=not fleet_task,  # a host without its fleet task promotes without a lease
            )
            sup.attach(nursery)
            nursery.start_soon(sup.drainer.run)
            if fleet_task:
                nursery.start_soon(sup.fleet.run)
            return Host(sup, machine, view)

        yield make
        nursery.cancel_scope.cancel()
        machines.cancel_scope.cancel()


async def _running(host: Host, job_id: str) -> None:
    while (await host.sup.get(job_id)).status is not JobStatus.RUNNING:  # noqa: ASYNC110 - virtual time
        await trio.sleep(0.1)


async def test_no_host_judges_a_process_it_cannot_see(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a, b = fleet("a"), fleet("b")
    job = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    row = await a.sup.get(job.job_id)
    assert row.host_id == "a" and job.job_id in a.machine.jobs and job.job_id not in b.machine.jobs
    # b's machine has no such process: judged by b, it would be a dead orphan. b leaves it alone.
    for _ in range(3):
        await b.sup.sweeper.sweep()
        await b.sup.operator_reconcile()
    assert (await b.sup.get(job.job_id)).status is JobStatus.RUNNING
    # Its own host sees it end and records the true outcome.
    a.machine.kill(job.job_id)
    while (await a.sup.get(job.job_id)).status is JobStatus.RUNNING:  # noqa: ASYNC110 - virtual time
        await trio.sleep(0.1)
    assert (await a.sup.get(job.job_id)).error_reason == "killed_by_SIGKILL"


async def test_INV_ONE_LEADER_a_partitioned_leader_steps_down_before_another_takes_the_lead(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a = fleet("a")
    await trio.sleep(1)
    b = fleet("b")
    await trio.sleep(1)
    assert a.sup.fleet.leading and not b.sup.fleet.leading
    both: list[float] = []
    a_stopped: list[float] = []
    b_started: list[float] = []

    async def watch() -> None:
        while not b_started:
            await trio.sleep(0.25)
            now = trio.current_time()
            if a.sup.fleet.leading and b.sup.fleet.leading:
                both.append(now)
            if not a.sup.fleet.leading and not a_stopped:
                a_stopped.append(now)
            if b.sup.fleet.leading:
                b_started.append(now)

    cut_at = trio.current_time()
    a.view.cut = True  # a's renewals hang from now on: the database is unreachable from a
    with trio.fail_after(10 * LEASE_S):
        await watch()
    assert both == []  # never two leaders at once
    # a let go within its lease (less the margin) of its last renewal; b took over only after a's lease expired.
    assert a_stopped[0] - cut_at <= LEASE_S
    assert b_started[0] > a_stopped[0]
    assert b_started[0] - cut_at <= LEASE_S + LEASE_S / 3 + 1  # failover within a renewal period of the expiry
    assert (await a.sup.health()).leader is False


async def test_INV_NO_PROMOTION_WITHOUT_LEASE_a_host_that_cannot_renew_stops_promoting_before_its_lease_can_expire(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a = fleet("a")
    await trio.sleep(1)  # renewed at 0: fresh (and leading) until 0 + LEASE_S * 0.8
    stale_at = LEASE_S * 0.8
    a.view.cut = True  # its renewals hang from now on; its other calls still reach the registry
    first = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    await _running(a, first.job_id)  # while the lease is fresh, it promotes
    with structlog.testing.capture_logs() as logs:
        await trio.sleep_until(stale_at - 0.01)
        assert a.sup.fleet.may_promote()
        await trio.sleep_until(stale_at)
        assert not a.sup.fleet.may_promote() and not a.sup.fleet.leading
        await trio.sleep(0.001)  # the fleet's own wake at that same instant
        # Said when it happens (within a millisecond), not at the next failed renewal.
        assert [e["event"] for e in logs if e["event"] in ("host_lease_stale", "fleet_leader_stepped_down")] == [
            "fleet_leader_stepped_down",
            "host_lease_stale",
        ]
        second = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
        assert await a.sup.drainer.drain() == []
        await trio.sleep(LEASE_S)  # its lease expired long ago, its drainer was woken: the job still waits
        assert (await a.sup.get(second.job_id)).status is JobStatus.QUEUED
        assert [e["why"] for e in logs if e["event"] == "drain_held"] == [
            "host lease not fresh: no promotion until it is renewed"
        ]
        a.view.cut = False  # the partition heals: the next renewal succeeds and the held queue moves at once
        await _running(a, second.job_id)
    assert [e["event"] for e in logs if e["event"] in ("host_lease_renewed", "drain_resumed")] == [
        "host_lease_renewed",
        "drain_resumed",
    ]
    assert (await a.sup.get(second.job_id)).host_id == "a"


async def test_INV_NO_PROMOTION_WITHOUT_LEASE_a_promotion_answered_after_the_lease_went_stale_is_put_back(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a = fleet("a")
    await trio.sleep(1)
    a.view.cut = True
    stale_at = LEASE_S * 0.8
    await trio.sleep_until(stale_at - 1)
    a.view.promote_delay_s = 2.0  # asked while fresh, answered once stale
    job = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    with structlog.testing.capture_logs() as logs:
        await trio.sleep_until(stale_at + 2)
    row = await a.sup.get(job.job_id)
    assert (row.status, row.attempts) == (JobStatus.QUEUED, 0), row  # back at the head, the start not counted
    assert job.job_id not in a.machine.jobs  # never started
    assert [e["reason"] for e in logs if e["event"] == "job_transition" and e["to"] == "queued"] == [
        "host_lease_not_fresh"
    ]


async def test_a_silent_hosts_jobs_stay_until_the_operator_forgets_it(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a, b = fleet("a"), fleet("b", fleet_task=False)
    await b.sup.fleet.renew()  # b registered, not leading: a leads
    job = (await a.sup.enqueue("retried_sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    with pytest.raises(Conflict, match="live lease"):
        await b.sup.forget_host("a")  # a is alive: its jobs may be running
    a.view.cut = True  # a goes silent (its process may still run the job: nobody here can tell)
    with structlog.testing.capture_logs() as logs:
        await trio.sleep(LEASE_S * 3)
        await b.sup.fleet.renew()  # b takes the lead, and its watch sees the silence
        await b.sup.fleet.watch_silent_hosts({"a"})
        await b.sup.fleet.watch_silent_hosts({"a"})
    assert [e["host_id"] for e in logs if e["event"] == "host_silent"] == ["a"]  # once, naming the host
    assert (await b.sup.get(job.job_id)).status is JobStatus.RUNNING  # UNKNOWN keeps the slot
    answer = await b.sup.forget_host("a")
    assert answer["jobs_ended"] == [job.job_id]
    row = await b.sup.get(job.job_id)
    # Ended as lost by the operator's word, and resubmitted under the crash rules (it may run again, anywhere).
    assert (row.status, row.history[-1].reason) == (JobStatus.QUEUED, "orphan_host_forgotten")
    assert [h.host_id for h in await b.sup.boot.registry.hosts()] == ["b"]


async def test_INV_FORGET_IS_FENCED_a_forgotten_host_that_comes_back_stops_its_jobs_and_records_none_of_them(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a, b = fleet("a"), fleet("b", fleet_task=False)
    await b.sup.fleet.renew()
    job = (await a.sup.enqueue("retried_sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    a.view.cut = True  # a partition: a's process and its job run on, unseen
    await trio.sleep(LEASE_S * 2)
    assert (await b.sup.forget_host("a"))["jobs_ended"] == [job.job_id]
    with structlog.testing.capture_logs() as logs:
        a.view.cut = False  # the partition heals: a's next renewal is refused, its boot fenced
        await trio.sleep(LEASE_S)
    [said] = [e for e in logs if e["log_level"] == "error"]  # and no monitor_failed: its end is refused quietly
    assert (said["event"], said["host_id"], said["boot_id"]) == ("host_forgotten_by_operator", "a", "boot-a")
    assert a.sup.fleet.forgotten and not a.sup.fleet.may_promote() and not a.sup.fleet.leading
    assert a.machine.jobs[job.job_id].status is not None  # its orphaned process was stopped
    row = await b.sup.get(job.job_id)
    # Still the operator's ending: queued for its retry (backoff 30 s), never finalized as a's cancel or end.
    assert (row.status, row.host_id) == (JobStatus.QUEUED, None), row
    assert [(h.status, h.reason) for h in row.history] == [(JobStatus.FAILED, "orphan_host_forgotten")]
    assert [h.host_id for h in await b.sup.boot.registry.hosts()] == ["b"]  # a's old boot never registered again


async def test_a_cancel_through_another_host_is_carried_out_by_the_owner(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a, b = fleet("a"), fleet("b")
    job = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    row = await b.sup.cancel(job.job_id)
    # Asked through b: recorded; the job still runs (b cannot see it, and never signals blindly).
    assert (row.status, row.cancel_requested) == (JobStatus.RUNNING, True)
    assert a.machine.jobs[job.job_id].status is None
    await a.sup.sweeper.sweep()  # the owner's next sweep (or, on PostgreSQL, its NOTIFY wake)
    while (await a.sup.get(job.job_id)).status is JobStatus.RUNNING:  # noqa: ASYNC110 - virtual time
        await trio.sleep(0.1)
    final = await a.sup.get(job.job_id)
    assert final.status is JobStatus.CANCELLED and a.machine.jobs[job.job_id].status is not None


async def test_a_pause_file_on_one_host_is_ended_only_by_that_hosts_file(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host], tmp_path: Path
) -> None:
    a, b = fleet("a"), fleet("b")
    flag = trio.Path(a.sup.pause_file.path)
    await flag.parent.mkdir(parents=True, exist_ok=True)
    await flag.touch()
    await a.sup.sweeper.sweep()
    assert await a.sup.is_paused()
    await b.sup.sweeper.sweep()  # b has no pause file of its own: the fleet's pause is not b's to end
    assert await b.sup.is_paused()
    await flag.unlink()
    await a.sup.sweeper.sweep()
    assert not await b.sup.is_paused()


async def test_a_host_that_disagrees_on_the_fleet_limit_says_so_and_promotes_under_the_fleets(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    a = fleet("a")  # alone: records its max_concurrent (4)
    await trio.sleep(1)
    with structlog.testing.capture_logs() as logs:
        b = fleet("b", max_concurrent=9)
        await trio.sleep(1)
    [said] = [e for e in logs if e["event"] == "fleet_setting_disagrees"]
    assert (said["log_level"], said["here"], said["fleet"], said["recorded_by"]) == ("error", 9, 4, "a")
    assert b.sup.boot.max_concurrent == 4 and a.sup.boot.max_concurrent == 4
    for _ in range(6):
        await b.sup.enqueue("sleep", {"seconds": 3600})
    await b.sup.drainer.drain()
    assert (await b.sup.queue_state()).running == 4  # the fleet's limit, not b's 9


async def test_a_host_whose_kinds_differ_from_the_fleets_says_so_at_start(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    """A job's command is made where it is enqueued and its end judged where it runs: hosts with different kinds run
    one kind two ways. The first host records the kinds' fingerprint; one that differs says so (the layout of the
    file, its comments, do not count)."""
    with structlog.testing.capture_logs() as logs:
        fleet("a")  # alone: records its kinds
        await trio.sleep(1)
        first, second = KINDS.split("[kinds.retried_sleep]")
        fleet("b", kinds_text=f"# the same kinds, in another order\n[kinds.retried_sleep]{second}\n{first}")
        await trio.sleep(1)
        c = fleet("c", kinds_text=KINDS + '\n[kinds.extra]\nargv = ["true"]\n')
        await trio.sleep(1)
    [said] = [e for e in logs if e["event"] == "fleet_setting_disagrees"]
    assert (said["log_level"], said["setting"], said["recorded_by"]) == ("error", "PODCAST_JOB_KINDS_FILE", "a")
    assert said["here"] == c.sup.boot.kinds.fingerprint() != said["fleet"]
    assert "extra" in c.sup.boot.kinds  # it keeps its own


async def test_after_a_database_outage_the_first_host_to_lead_again_names_no_live_host_silent(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    # Found by the PostgreSQL restart test (ADR 0012): every lease expires while the database is down; the first host
    # to renew and lead again named the other, whose renewal was a moment behind, silent (an ERROR and a forget
    # suggested for a live host), then back.
    a, b = fleet("a"), fleet("b")
    await trio.sleep(1)
    job = (await b.sup.enqueue("sleep", {"seconds": 3600})).job
    await _running(b, job.job_id)
    assert (await b.sup.get(job.job_id)).host_id == "b"  # a running job of b's: the leader's watch looks at b
    a.view.cut = b.view.cut = True  # the database is down for both: no renewal answers
    await trio.sleep(2 * LEASE_S)
    assert not a.sup.fleet.leading and not b.sup.fleet.leading
    with structlog.testing.capture_logs() as logs:
        a.view.cut = False  # back: a renews first and leads at once
        while not a.sup.fleet.leading:  # noqa: ASYNC110 - virtual time
            await trio.sleep(0.1)
        b.view.cut = False  # b renews at its next turn, within a renewal period
        await trio.sleep(2 * LEASE_S)  # the leader's watch runs at each of its renewals
    assert a.sup.fleet.leading and not b.sup.fleet.leading
    assert [e for e in logs if e["event"] in ("host_silent", "host_back")] == []


# -- INV-SILENT-HOST-ENDS-BY-PROOF: a silent host's jobs, judged by the ground truth the leader can reach -------------


async def _ended(host: Host, job_id: str) -> None:
    # Every virtual second: each look lets the autojumping clock idle for its threshold in real time.
    while (await host.sup.get(job_id)).status is JobStatus.RUNNING:  # noqa: ASYNC110 - virtual time
        await trio.sleep(1)


def _said(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == event]


async def test_INV_SILENT_HOST_ENDS_BY_PROOF_the_leader_records_a_dead_hosts_ended_jobs_with_their_true_outcome(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    b = fleet("b")  # leads (the first to renew)
    await trio.sleep(1)
    a = fleet("a", machine=b.machine)  # one engine that both hosts reach
    await trio.sleep(0.001)
    crashed = (await a.sup.enqueue("retried_sleep", {"seconds": 3600})).job
    finishing = (await a.sup.enqueue("sleep", {"seconds": 30})).job
    running = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    for job in (crashed, finishing, running):
        await _running(a, job.job_id)
        assert (await a.sup.get(job.job_id)).host_id == "a"
    assert b.sup.fleet.leading and not a.sup.fleet.leading
    renewed_at = 1.0  # a's last renewal that lands: its lease expires at 16
    with structlog.testing.capture_logs() as logs:
        a.view.dead = True  # SIGKILLed: nothing a would write lands any more; its jobs run on, on the shared engine
        await trio.sleep(1)
        b.machine.kill(crashed.job_id)  # proof on the shared engine from now on
        await trio.sleep_until(renewed_at + LEASE_S - 0.5)
        # a's lease is live: its jobs are a's to judge, whatever b's engine shows.
        assert (await b.sup.get(crashed.job_id)).status is JobStatus.RUNNING
        with trio.fail_after(LEASE_S / 3 + 1):
            await _ended(b, crashed.job_id)
        # The true outcome, resubmitted under the kind's crash rules, through the owner's own path.
        row = await b.sup.get(crashed.job_id)
        assert row.status is JobStatus.QUEUED, row
        assert [(h.status, h.reason) for h in row.history] == [(JobStatus.FAILED, "killed_by_SIGKILL")]
        with trio.fail_after(30 + LEASE_S / 3 + 1):
            await _ended(b, finishing.job_id)
        row = await b.sup.get(finishing.job_id)
        assert (row.status, row.error_reason, row.exit_code, row.host_id) == (JobStatus.SUCCEEDED, None, 0, "a")
        await trio.sleep(LEASE_S)
    # No proof of its end: the running one keeps its row and slot.
    assert (await b.sup.get(running.job_id)).status is JobStatus.RUNNING
    ended = [(e["host_id"], e["job_id"], e["outcome"], e["evidence"]) for e in _said(logs, "silent_host_job_ended")]
    assert ended == [
        ("a", crashed.job_id, "failed/killed_by_SIGKILL (resubmitted)", f"memory job {crashed.job_id} ended"),
        ("a", finishing.job_id, "succeeded", f"memory job {finishing.job_id} ended"),
    ]
    assert [e["log_level"] for e in _said(logs, "silent_host_job_ended")] == ["info", "info"]
    # One ERROR for the silence, naming the host and how many of its jobs still hold slots then.
    [silent] = _said(logs, "host_silent")
    assert (silent["log_level"], silent["host_id"], silent["running_jobs"]) == ("error", "a", 2)


async def test_INV_SILENT_HOST_ENDS_BY_PROOF_no_proof_leaves_a_silent_hosts_rows_running(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    b = fleet("b", fleet_task=False)
    await b.sup.fleet.renew()  # leads
    a = fleet("a", machine=b.machine)
    await trio.sleep(0.001)
    jobs = [(await a.sup.enqueue("sleep", {"seconds": 3600})).job for _ in range(3)]
    _running_one, lost, killed = jobs  # the first runs on
    for job in jobs:
        await _running(a, job.job_id)
    a.view.dead = True
    b.machine.lose(lost.job_id)  # gone with no record of how (a removed container): not found is no proof
    b.machine.kill(killed.job_id)
    b.machine.unreachable()  # the engine does not answer: UNKNOWN is no proof
    await trio.sleep(LEASE_S * 2)
    await b.sup.fleet.renew()
    assert b.sup.fleet.leading
    with structlog.testing.capture_logs() as logs:
        await b.sup.fleet.sweep_silent_hosts()
        assert [(await b.sup.get(j.job_id)).status for j in jobs] == [JobStatus.RUNNING] * 3
        b.machine.reachable()
        await b.sup.fleet.sweep_silent_hosts()
    # Running, and lost: still RUNNING with their slots; only the proven end is recorded.
    assert [(await b.sup.get(j.job_id)).status for j in jobs] == [JobStatus.RUNNING, JobStatus.RUNNING,
                                                                   JobStatus.FAILED]
    assert (await b.sup.get(killed.job_id)).error_reason == "killed_by_SIGKILL"
    assert [e["job_id"] for e in _said(logs, "silent_host_job_ended")] == [killed.job_id]
    assert [(e["host_id"], e["running_jobs"]) for e in _said(logs, "host_silent")] == [("a", 3)]


async def test_INV_SILENT_HOST_ENDS_BY_PROOF_only_the_leader_ends_a_silent_hosts_jobs_and_never_while_its_lease_lives(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    b = fleet("b", fleet_task=False)
    await b.sup.fleet.renew()  # leads
    a = fleet("a", machine=b.machine)
    c = fleet("c", fleet_task=False, machine=b.machine)
    await c.sup.fleet.renew()  # a live host of the fleet, not the leader
    await trio.sleep(0.001)
    job = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    a.view.hold_finalize = trio.Event()  # a's own end of it is on its way, not landed yet
    b.machine.kill(job.job_id)
    await trio.sleep(1)
    await b.sup.fleet.sweep_silent_hosts()  # a's lease is live: a's job is a's to judge, proof or not
    assert (await b.sup.get(job.job_id)).status is JobStatus.RUNNING
    a.view.dead = True  # a dies with its end unrecorded
    await trio.sleep(LEASE_S * 2)
    await b.sup.fleet.renew()
    await c.sup.fleet.renew()
    assert b.sup.fleet.leading and not c.sup.fleet.leading
    await c.sup.fleet.sweep_silent_hosts()  # not the leader: nothing (INV-ONE-LEADER)
    assert (await c.sup.get(job.job_id)).status is JobStatus.RUNNING
    await b.sup.fleet.sweep_silent_hosts()
    row = await b.sup.get(job.job_id)
    assert (row.status, row.error_reason) == (JobStatus.FAILED, "killed_by_SIGKILL")


async def test_INV_SILENT_HOST_ENDS_BY_PROOF_the_owner_and_the_leader_at_once_record_exactly_one_end(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    b = fleet("b", fleet_task=False)
    await b.sup.fleet.renew()
    a = fleet("a", machine=b.machine)
    await trio.sleep(0.001)
    job = (await a.sup.enqueue("retried_sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    a.view.cut = True  # partitioned: a runs on, its lease expires
    a.view.hold_finalize = trio.Event()
    with structlog.testing.capture_logs() as logs:
        b.machine.kill(job.job_id)  # a's monitor sees the end at once; its write is held back
        await trio.sleep(LEASE_S * 2)
        await b.sup.fleet.renew()
        await b.sup.fleet.sweep_silent_hosts()  # the leader records it first
        a.view.hold_finalize.set()  # then a's end lands: guarded by the identity it watched, it changes nothing
        a.view.cut = False  # and a is back
        await trio.sleep(LEASE_S)
    row = await b.sup.get(job.job_id)
    # One end: one attempt in the history, one resubmission, a's late end refused quietly (no error, no second end).
    assert [(h.status, h.reason) for h in row.history] == [(JobStatus.FAILED, "killed_by_SIGKILL")], row
    assert [e["job_id"] for e in _said(logs, "silent_host_job_ended")] == [job.job_id]
    resubmitted = [e for e in _said(logs, "job_transition") if e.get("job_id") == job.job_id and e["to"] == "queued"]
    assert len(resubmitted) == 1
    assert [e for e in logs if e["log_level"] == "error" and e["event"] != "host_silent"] == []


async def test_INV_ONE_LEADER_a_proof_read_that_hangs_never_holds_back_the_leaders_renewals(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    """The leader's round over silent hosts is bounded by a renewal period: a proof whose read never returns (an exit
    record on a hung shared volume) is given up, said once per round, and the leader keeps renewing and leading."""
    b = fleet("b")
    await trio.sleep(1)
    a = fleet("a", machine=b.machine)
    job = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    hung = threading.Event()

    def never_returns(jobs: Any) -> list[Any]:
        hung.wait()  # until the test ends: a read stuck on a hung volume
        return [None for _ in jobs]

    b.machine.proof_of_end = never_returns  # type: ignore[method-assign]
    try:
        with structlog.testing.capture_logs() as logs:
            a.view.dead = True  # silent from now on: its lease expires at 16
            leading: list[bool] = []
            for _ in range(int(4 * LEASE_S)):
                await trio.sleep(1)
                leading.append(b.sup.fleet.leading)
        assert all(leading), leading  # never a lapse: the renewals went on while the proof read hung
        assert _said(logs, "silent_hosts_round_cut_short")
        assert [e["host_id"] for e in _said(logs, "host_silent")] == []  # the round never got as far as naming it
        assert (await b.sup.get(job.job_id)).status is JobStatus.RUNNING
    finally:
        hung.set()


async def test_a_host_that_renews_while_the_leader_reads_proofs_is_not_named_silent(
    jump_clock: trio.testing.MockClock, fleet: Callable[..., Host]
) -> None:
    """The leader's round reads the hosts, then the proofs (up to a renewal period). A host that renewed meanwhile is
    judged on a read after the proofs: never named ``host_silent``, an ERROR that points the operator at a forget of
    a live host (the forget would be refused, but the page was sent)."""
    b = fleet("b", fleet_task=False)
    await b.sup.fleet.renew()  # leads
    a = fleet("a", machine=b.machine, fleet_task=False)
    await a.sup.fleet.renew()
    job = (await a.sup.enqueue("sleep", {"seconds": 3600})).job
    await _running(a, job.job_id)
    await trio.sleep(LEASE_S * 2)  # a renews no more: its lease has expired
    await b.sup.fleet.renew()
    assert b.sup.fleet.leading

    def back_meanwhile(jobs: Any) -> list[Any]:
        trio.from_thread.run(a.sup.fleet.renew)  # a is back while the proofs are read
        return [None for _ in jobs]  # and no proof of an end: its job runs

    b.machine.proof_of_end = back_meanwhile  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        await b.sup.fleet.sweep_silent_hosts()
    assert _said(logs, "host_silent") == []
    assert (await b.sup.get(job.job_id)).status is JobStatus.RUNNING
