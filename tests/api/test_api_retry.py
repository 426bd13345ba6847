"""``POST /api/jobs/{job_id}/retry``: an operator's explicit second try of a finished job is a new job of
the same kind and params whose ``retry_of`` names the old one, and the old one's row lists it (``retried_by``). Only
a finished job; a kind that left the kinds file is named."""

from __future__ import annotations

from api_support import Harness, wait_running, wait_terminal

from supervisor.registry import NewJob


async def test_a_finished_job_is_retried_as_a_new_job_that_names_it(harness: Harness) -> None:
    params = {"n": 3, "ratio": "0.5", "flag": True, "name": "x"}
    _, enqueued = await harness.json("POST", "/api/jobs", json={"kind": "typed", "params": params})
    old = enqueued["job_id"]
    await wait_terminal(harness.supervisor, old)
    await harness.supervisor.pause()
    status, answer = await harness.json("POST", f"/api/jobs/{old}/retry")
    assert status == 202, answer
    assert set(answer) == {"job_id", "status", "queue_position", "coalesced"}  # as an enqueue answers
    assert (answer["status"], answer["queue_position"], answer["coalesced"]) == ("queued", 1, False)
    new = answer["job_id"]
    assert new != old
    _, row = await harness.json("GET", f"/api/jobs/{new}")
    _, old_row = await harness.json("GET", f"/api/jobs/{old}")
    assert (row["kind"], row["params"], row["argv"]) == (old_row["kind"], old_row["params"], old_row["argv"])
    assert (row["retry_of"], row["retried_by"]) == (old, [])
    assert (old_row["retry_of"], old_row["retried_by"]) == (None, [new])
    _, again = await harness.json("POST", f"/api/jobs/{old}/retry")
    _, old_row = await harness.json("GET", f"/api/jobs/{old}")
    assert old_row["retried_by"] == [new, again["job_id"]]  # oldest first
    _, page = await harness.json("GET", "/api/jobs")
    assert {job["job_id"]: job["retry_of"] for job in page["jobs"]}[again["job_id"]] == old


async def test_a_queued_or_running_job_is_not_retried_and_the_answer_names_its_state(harness: Harness) -> None:
    _, running = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
    await wait_running(harness.supervisor, running["job_id"])
    await harness.supervisor.pause()
    _, queued = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
    for job_id, state in ((running["job_id"], "running"), (queued["job_id"], "queued")):
        status, body = await harness.json("POST", f"/api/jobs/{job_id}/retry")
        assert status == 409, body
        assert (body["error"]["code"], body["error"]["field"]) == ("conflict", "job_id")
        assert f"is {state}" in body["error"]["message"]
    _, counts = await harness.json("GET", "/api/queue")
    assert (counts["running"], counts["queued"]) == (1, 1)  # nothing was enqueued


async def test_an_unknown_job_is_not_found(harness: Harness) -> None:
    status, body = await harness.json("POST", "/api/jobs/no-such-job/retry")
    assert (status, body["error"]["code"], body["error"]["field"]) == (404, "not_found", "job_id")


async def test_a_job_whose_kind_left_the_kinds_file_is_not_retried_and_the_answer_names_the_kind(
    harness: Harness,
) -> None:
    await harness.supervisor.pause()
    result = await harness.supervisor.registry.enqueue(NewJob("retired", {}, ["true"]))
    await harness.supervisor.cancel(result.job.job_id)  # finished: cancelled before it started
    status, body = await harness.json("POST", f"/api/jobs/{result.job.job_id}/retry")
    assert status == 409, body
    assert body["error"]["field"] == "kind"
    assert "'retired'" in body["error"]["message"]
    assert (await harness.supervisor.registry.retries_of(result.job.job_id)) == []


async def test_a_retry_of_a_coalescing_kind_returns_the_identical_queued_job(harness: Harness) -> None:
    _, first = await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    await wait_terminal(harness.supervisor, first["job_id"])
    await harness.supervisor.pause()
    _, queued = await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    status, answer = await harness.json("POST", f"/api/jobs/{first['job_id']}/retry")
    assert (status, answer["job_id"], answer["coalesced"]) == (202, queued["job_id"], True)
