"""A kind's max_running, end to end (INV-KIND-LIMIT-IS-A-COUNT): the production tree in virtual time, and a real
supervisor with real processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from core_helpers import kinds_file_with, wait_running, wait_status  # type: ignore[import-not-found]

from supervisor import JobStatus, Supervisor
from supervisor.testing import Scenario


async def test_a_kind_at_its_limit_waits_while_another_kind_starts_at_once(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(
        kinds={"a": sc.script(run_for=60, max_running=1), "b": sc.script(run_for=60)}, max_concurrent=3
    )
    a = [await sc.enqueue("a") for _ in range(3)]
    b = [await sc.enqueue("b") for _ in range(2)]
    peak = 0
    for _ in range(4 * 60):
        statuses = [(await sc.job(job_id)).status for job_id in a]
        peak = max(peak, statuses.count("running"))
        await sc.advance(1)
    assert peak == 1  # never two a's at once
    jobs = [await sc.job(job_id) for job_id in a + b]
    assert all(job.status == "succeeded" for job in jobs)
    started = {job.job_id: job.started_at for job in jobs}
    assert started[b[0]] == started[b[1]] == started[a[0]]  # both b's started with the first a, not behind the a's
    assert [started[job_id] for job_id in a] == sorted(started[job_id] for job_id in a)  # the a's in order, FIFO


LIMITED = """
[kinds.one_at_a_time]
argv = ["sleep", "{seconds}"]
params = { seconds = "float" }
max_running = 1
"""


async def test_a_real_supervisor_keeps_a_kinds_limit(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    kinds = kinds_file_with(tmp_path, LIMITED)
    sup = make_supervisor(kinds_file=kinds, max_concurrent=3)
    first = (await sup.enqueue("one_at_a_time", {"seconds": 30})).job.job_id
    second = (await sup.enqueue("one_at_a_time", {"seconds": 30})).job.job_id
    other = (await sup.enqueue("sleep", {"seconds": 30})).job.job_id
    await wait_running(sup, first)
    await wait_running(sup, other)  # behind the waiting one_at_a_time, yet started
    assert (await sup.get(second)).status is JobStatus.QUEUED
    await sup.cancel(first)
    await wait_running(sup, second)  # the slot of its kind is free again
    for job_id in (second, other):
        await sup.cancel(job_id)
        await wait_status(sup, job_id, {JobStatus.CANCELLED})


async def test_jobs_waiting_on_their_full_kind_are_a_busy_queue_never_stuck(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"a": sc.script(run_for=3600, max_running=1)}, max_concurrent=3, queue_stuck_s=60)
    for _ in range(3):
        await sc.enqueue("a")
    await sc.advance(30 * 60)  # two slots free for half an hour, and two a's waiting: on their kind, not the queue
    assert sc.supervisor is not None
    state = await sc.supervisor.queue_state()
    assert state.stuck is None and state.oldest_queued_age_s == 0
    assert state.kinds == {"a": {"running": 1, "queued": 2, "max_running": 1}}
    assert "queue.stuck" not in [hook["event"] for hook in sc.webhooks()]
    metrics = (await sc.supervisor.render_metrics()).decode()
    assert 'podcast_queue_jobs{kind="a",status="queued"} 2.0' in metrics
    assert 'podcast_queue_kind_max_running{kind="a"} 1.0' in metrics
