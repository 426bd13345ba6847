"""Bulk actions: a dry run's selection is exactly what is acted on, each job once, whatever arrives
meanwhile, however often the action is repeated, and when it was cut off halfway."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel

from supervisor.domain import BulkRequest, JobFilter, JobStatus, PageRequest, SelectionNotFound, ValidationError
from supervisor.testing import Scenario

FAILED = JobFilter(status=JobStatus.FAILED, kind="flaky")


async def failed_jobs(sc: Scenario, n: int) -> list[str]:
    ids = [await sc.enqueue("flaky") for _ in range(n)]
    await sc.advance(20)
    assert [(await sc.job(job_id)).status for job_id in ids] == ["failed"] * n
    return ids


async def test_a_retry_acts_on_the_dry_runs_selection_once_whatever_arrives_meanwhile(
    supervisor_scenario: Scenario,
) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"flaky": sc.script(run_for=1, exit_code=3)}, max_concurrent=10)
    ids = await failed_jobs(sc, 4)
    assert sc.supervisor is not None
    dry = await sc.supervisor.bulk_action(BulkRequest("retry", FAILED, dry_run=True), by="ops")
    assert (dry.count, sorted(dry.job_ids), dry.results) == (4, sorted(ids), {})
    late = await failed_jobs(sc, 1)  # matches the filter now, but was not selected
    act = BulkRequest("retry", selection=dry.selection)
    done = await sc.supervisor.bulk_action(act, by="ops")
    assert done.outcomes == {"retried": 4} and set(done.results) == set(ids) and late[0] not in done.results
    again = await sc.supervisor.bulk_action(act, by="ops")  # a repeat after a lost answer: the same jobs, no new
    assert again.new_job_ids == done.new_job_ids
    retries, _ = await sc.supervisor.list_jobs(PageRequest(JobFilter(kind="flaky", created_since=sc.now())))
    assert sorted(job.retry_of or "" for job in retries) == sorted(ids)  # one retry each, none of the late job
    audit = [line for line in sc.log() if line["event"] == "bulk_action"]
    assert [(line["by"], line["count"], line["retried"]) for line in audit] == [("ops", 4, 4), ("ops", 4, 4)]


async def test_an_action_cut_off_halfway_is_finished_by_its_repeat(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"flaky": sc.script(run_for=1, exit_code=3)}, max_concurrent=10)
    ids = await failed_jobs(sc, 6)
    assert sc.supervisor is not None
    supervisor = sc.supervisor
    dry = await supervisor.bulk_action(BulkRequest("retry", FAILED, dry_run=True))
    act = BulkRequest("retry", selection=dry.selection)

    async def retries() -> int:
        jobs, _ = await supervisor.list_jobs(PageRequest(JobFilter(kind="flaky")))
        return len([job for job in jobs if job.retry_of is not None])

    with trio.CancelScope() as cut:  # the supervisor dies between two of its retries

        async def cut_after_two() -> None:
            while await retries() < 2:
                await trio.lowlevel.checkpoint()
            cut.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_after_two)
            await supervisor.bulk_action(act)
    assert 2 <= await retries() < 6
    finished = await supervisor.bulk_action(act)  # the repeat finishes the rest
    assert finished.outcomes == {"retried": 6}
    jobs, _ = await supervisor.list_jobs(PageRequest(JobFilter(kind="flaky"), 100))
    assert sorted(job.retry_of for job in jobs if job.retry_of) == sorted(ids)  # each once


async def test_a_cancel_acts_on_its_selection_and_its_repeat_changes_nothing(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"long": sc.script()}, max_concurrent=2)
    ids = [await sc.enqueue("long") for _ in range(4)]  # two run, two wait
    await sc.advance(1)
    assert sc.supervisor is not None
    dry = await sc.supervisor.bulk_action(BulkRequest("cancel", JobFilter(kind="long"), dry_run=True))
    done = await sc.supervisor.bulk_action(BulkRequest("cancel", selection=dry.selection))
    assert sorted(done.results.values()) == ["cancel_requested"] * 2 + ["cancelled"] * 2
    await sc.advance(60)
    assert [(await sc.job(job_id)).status for job_id in ids] == ["cancelled"] * 4
    again = await sc.supervisor.bulk_action(BulkRequest("cancel", selection=dry.selection))
    assert again.outcomes == {"already_ended": 4}


async def test_a_selection_is_for_its_own_action_and_expires(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"flaky": sc.script(run_for=1, exit_code=3)})
    await failed_jobs(sc, 1)
    assert sc.supervisor is not None
    dry = await sc.supervisor.bulk_action(BulkRequest("retry", FAILED, dry_run=True))
    with pytest.raises(ValidationError, match="made for retry"):
        await sc.supervisor.bulk_action(BulkRequest("cancel", selection=dry.selection))
    await sc.advance(3601)
    with pytest.raises(SelectionNotFound, match="expired or was never made"):
        await sc.supervisor.bulk_action(BulkRequest("retry", selection=dry.selection))
    with pytest.raises(ValidationError, match="dry run's selection"):
        BulkRequest("retry", FAILED)  # acting needs a selection: the dry run comes first
