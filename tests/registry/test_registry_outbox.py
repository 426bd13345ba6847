"""The transactional outbox: an event is written in the same transaction as the change it reports, and only then."""

from __future__ import annotations

import json

import pytest

from supervisor import SqliteRegistry
from supervisor.domain import Job, JobStatus


def _events(registry: SqliteRegistry) -> list[tuple[str, str, str | None, str | None]]:
    out = []
    for item in registry.outbox_pending(1000):
        body = json.loads(item.body)
        assert (body["event_id"], body["event"], body["job"]["job_id"]) == (item.event_id, item.event, item.job_id)
        out.append((item.event, body["job"]["status"], body["previous_status"], body["reason"]))
    return out


def _running(registry: SqliteRegistry) -> Job:
    job = registry.enqueue("k", {}, ["x"]).job
    promoted = registry.promote_queued(5, boot_id="b", token_hashes=["h"])
    assert [p.job_id for p in promoted] == [job.job_id]
    return promoted[0]


def test_each_status_change_writes_one_event_with_the_row_as_of_the_change(registry: SqliteRegistry) -> None:
    registry.boot_id = "boot-1"
    job = _running(registry)
    registry.finalize(job.job_id, JobStatus.FAILED, reason="exit_code_3", exit_code=3)
    queued = registry.enqueue("k", {}, ["y"]).job
    registry.request_cancel(queued.job_id)
    assert _events(registry) == [
        ("job.transition", "queued", None, "enqueued"),
        ("job.transition", "running", "queued", "promoted"),
        ("job.transition", "failed", "running", "exit_code_3"),
        ("job.transition", "queued", None, "enqueued"),
        ("job.transition", "cancelled", "queued", "cancelled_before_start"),
    ]
    bodies = [json.loads(item.body) for item in registry.outbox_pending(10)]
    assert {b["boot_id"] for b in bodies} == {"boot-1"}
    assert bodies[2]["job"]["exit_code"] == 3 and "token_hash" not in bodies[2]["job"]


def test_a_change_that_changes_nothing_writes_nothing(registry: SqliteRegistry) -> None:
    job = _running(registry)
    registry.finalize(job.job_id, JobStatus.SUCCEEDED)
    before = registry.outbox_depth()
    assert not registry.finalize(job.job_id, JobStatus.FAILED).changed  # already terminal
    assert not registry.request_cancel(job.job_id).changed
    registry.enqueue("c", {}, ["x"], coalesce_key="key")
    registry.enqueue("c", {}, ["x"], coalesce_key="key")  # coalesced into the first
    assert registry.outbox_depth() == before + 1


def test_a_cancel_request_on_a_running_row_is_not_a_status_change(registry: SqliteRegistry) -> None:
    job = _running(registry)
    before = registry.outbox_depth()
    assert registry.request_cancel(job.job_id).changed
    assert registry.outbox_depth() == before


def test_a_rolled_back_change_leaves_no_event(registry: SqliteRegistry) -> None:
    job = _running(registry)
    before = registry.outbox_depth()

    def decide(current: Job) -> tuple[JobStatus, str | None]:
        raise RuntimeError("the decision failed inside the transaction")

    with pytest.raises(RuntimeError):
        registry.finalize(job.job_id, decide)
    assert registry.outbox_depth() == before
    assert registry.get(job.job_id).status is JobStatus.RUNNING


def test_absence_flags_and_their_events_commit_together_and_only_on_a_change(registry: SqliteRegistry) -> None:
    job = _running(registry)
    before = registry.outbox_depth()
    result = registry.set_absence(job.job_id, stalled=True, silent=False, events=[("job.stalled", "progress_stalled")])
    assert result.changed and result.job.stalled and result.job.stalled_since is not None
    assert not registry.set_absence(job.job_id, stalled=True, silent=False, events=[("job.stalled", "x")]).changed
    assert registry.outbox_depth() == before + 1
    recovered = [("job.recovered", "absence_cleared")]
    cleared = registry.set_absence(job.job_id, stalled=False, silent=False, events=recovered)
    assert (cleared.job.stalled, cleared.job.stalled_since) == (False, None)
    assert _events(registry)[-2:] == [
        ("job.stalled", "running", "running", "progress_stalled"),
        ("job.recovered", "running", "running", "absence_cleared"),
    ]
    registry.finalize(job.job_id, JobStatus.SUCCEEDED)
    assert not registry.set_absence(job.job_id, stalled=True, silent=True, events=[("job.stalled", "x")]).changed


def test_a_registry_without_an_outbox_writes_no_event(registry: SqliteRegistry) -> None:
    registry.outbox_enabled = False
    job = _running(registry)
    registry.finalize(job.job_id, JobStatus.SUCCEEDED)
    assert registry.outbox_depth() == 0


def test_delete_forgets_only_what_was_delivered(registry: SqliteRegistry) -> None:
    for _ in range(3):
        registry.enqueue("k", {}, ["x"])
    first, *rest = registry.outbox_pending(10)
    registry.outbox_delete([first.seq])
    assert [e.seq for e in registry.outbox_pending(10)] == [e.seq for e in rest]
