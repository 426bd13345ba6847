"""``POST /api/jobs/prune``: the finished jobs past the retention go now, with their logs, oldest first;
``dry_run=true`` only lists them. Bad query values are a 422 naming the field."""

from __future__ import annotations

from pathlib import Path

from api_support import Harness, OpenHarness, wait_terminal


async def finished(harness: Harness, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        _, answer = await harness.json("POST", "/api/jobs", json={"kind": "chatty", "params": {"lines": 1}})
        await wait_terminal(harness.supervisor, answer["job_id"])  # one at a time: they end in this order
        ids.append(answer["job_id"])
    return ids


async def test_a_dry_run_lists_what_would_go_and_a_prune_removes_it_with_its_log(open_harness: OpenHarness) -> None:
    async with open_harness(retention_days=None, retention_max_jobs=1) as harness:
        ids = await finished(harness, 3)
        logs = [Path(str((await harness.supervisor.get(job_id)).log_path)) for job_id in ids]
        assert all(log.exists() for log in logs)
        status, body = await harness.json("POST", "/api/jobs/prune?dry_run=true")
        assert status == 200, body
        assert (body["dry_run"], body["pruned"], body["limit_reached"]) == (True, 2, False)
        assert body["retention"] == {"days": None, "max_jobs": 1}
        listed = [(j["job_id"], j["kind"], j["status"]) for j in body["jobs"]]
        assert listed == [(job_id, "chatty", "succeeded") for job_id in ids[:2]]
        assert all(log.exists() for log in logs)
        status, body = await harness.json("POST", "/api/jobs/prune?limit=1")
        assert (status, body["dry_run"], body["pruned"], body["limit_reached"]) == (200, False, 1, True)
        status, body = await harness.json("POST", "/api/jobs/prune")
        assert (status, [j["job_id"] for j in body["jobs"]], body["limit_reached"]) == (200, [ids[1]], False)
        for job_id in ids[:2]:
            assert (await harness.json("GET", f"/api/jobs/{job_id}"))[0] == 404
        assert [log.exists() for log in logs] == [False, False, True]
        assert (await harness.json("GET", f"/api/jobs/{ids[2]}"))[0] == 200


async def test_retention_off_prunes_nothing_and_says_so(open_harness: OpenHarness) -> None:
    async with open_harness(retention_days=None, retention_max_jobs=None) as harness:
        await finished(harness, 1)
        status, body = await harness.json("POST", "/api/jobs/prune")
        assert (status, body["pruned"], body["retention"]) == (200, 0, {"days": None, "max_jobs": None})


async def test_bad_query_values_name_the_field(harness: Harness) -> None:
    for query, field in (
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=x", "limit"),
        ("dry_run=yes", "dry_run"),
        ("dry_run=true&dry_run=false", "dry_run"),
        ("dryrun=true", "dryrun"),
    ):
        status, body = await harness.json("POST", f"/api/jobs/prune?{query}")
        assert (status, body["error"]["field"]) == (422, field), query


async def test_the_prune_route_is_no_job_id(harness: Harness) -> None:
    status, body = await harness.json("GET", "/api/jobs/prune")
    assert status == 405, body
