"""Routes through the quart-trio test client (lifespan running), on a supervisor whose jobs really run."""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta
from typing import Any

import pytest
import structlog
from api_support import (
    Harness,
    OpenHarness,
    assert_error,
    bearer,
    poll_until,
    start_tokened,
    wait_for_job,
    wait_running,
    wait_terminal,
)
from prometheus_client.parser import text_string_to_metric_families

from supervisor.api import MAX_BODY_BYTES, REQUEST_ID_HEADER
from supervisor.domain import RegistryError


def assert_utc(ts: str) -> None:
    parsed = datetime.fromisoformat(ts)
    assert parsed.utcoffset() == timedelta(0), ts


async def test_health(harness: Harness) -> None:
    status, body = await harness.json("GET", "/api/health")
    assert status == 200
    assert body == {
        "status": "ok",
        "boot_id": harness.supervisor.boot_id,
        "exec_mode": "subprocess",
        "paused": False,
        "host_id": harness.supervisor.config.host_id,
        "leader": True,  # no fleet task in the harness: nothing is gated
    }


async def test_enqueue_answers_202_with_position_and_coalesces(harness: Harness) -> None:
    await harness.supervisor.pause()
    status, first = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 1}})
    assert status == 202
    assert set(first) == {"job_id", "status", "queue_position", "coalesced"}
    assert (first["status"], first["queue_position"], first["coalesced"]) == ("queued", 1, False)

    _, tidy = await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    assert (tidy["queue_position"], tidy["coalesced"]) == (2, False)
    status, again = await harness.json("POST", "/api/jobs", json={"kind": "tidy", "params": {}})
    assert status == 202
    assert again == {**tidy, "coalesced": True}


async def test_enqueued_job_runs_and_its_row_is_public(harness: Harness) -> None:
    status, answer = await harness.json("POST", "/api/jobs", json={"kind": "echo", "params": {"text": "hello"}})
    assert status == 202
    await wait_terminal(harness.supervisor, answer["job_id"])

    status, row = await harness.json("GET", f"/api/jobs/{answer['job_id']}")
    assert status == 200
    assert row["status"] == "succeeded"
    assert row["exit_code"] == 0
    assert row["params"] == {"text": "hello"}
    assert "token_hash" not in row and "token" not in row
    assert "queue_position" not in row  # only queued rows carry one
    for key in ("created_at", "started_at", "ended_at"):
        assert_utc(row[key])


async def test_params_arrive_as_strings_and_are_converted_by_the_kind(harness: Harness) -> None:
    await harness.supervisor.pause()
    params = {"n": "3", "ratio": "0.5", "flag": "true", "name": "x"}
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "typed", "params": params})
    _, row = await harness.json("GET", f"/api/jobs/{answer['job_id']}")
    assert row["params"] == {"n": 3, "ratio": 0.5, "flag": True, "name": "x"}
    assert row["queue_position"] == 1


async def test_an_omitted_param_with_a_default_is_stored_and_run_with_it(harness: Harness) -> None:
    await harness.supervisor.pause()
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "paged", "params": {"feed": "a"}})
    _, row = await harness.json("GET", f"/api/jobs/{answer['job_id']}")
    assert row["params"] == {"feed": "a", "limit": 0}
    assert row["argv"][-2:] == ["a", "0"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "nope"}, "kind"),
        ({"kind": 7}, "kind"),
        ({}, "kind"),
        ({"kind": "sleep"}, "params.seconds"),
        ({"kind": "sleep", "params": {}}, "params.seconds"),
        ({"kind": "sleep", "params": {"seconds": "soon"}}, "params.seconds"),
        ({"kind": "sleep", "params": {"seconds": True}}, "params.seconds"),
        ({"kind": "sleep", "params": {"seconds": 1, "extra": 1}}, "params.extra"),
        ({"kind": "sleep", "params": [1]}, "params"),
        ({"kind": "typed", "params": {"n": "1.5", "ratio": 1, "flag": True, "name": "x"}}, "params.n"),
        ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": "yes", "name": "x"}}, "params.flag"),
        ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": True, "name": "-rf"}}, "params.name"),
        ({"kind": "paged", "params": {"limit": 1}}, "params.feed"),
        ({"kind": "paged", "params": {"feed": "a", "limit": "all"}}, "params.limit"),
        ({"kind": "sleep", "params": {"seconds": 1}, "priority": 9}, "priority"),
        ([{"kind": "sleep"}], "body"),
    ],
)
async def test_invalid_enqueue_is_422_naming_the_field_and_stores_nothing(
    harness: Harness, body: Any, field: str
) -> None:
    status, answer = await harness.json("POST", "/api/jobs", json=body)
    assert status == 422
    assert_error(answer, "validation_error", field)
    assert await harness.supervisor.registry.counts() == {s: 0 for s in await harness.supervisor.registry.counts()}


@pytest.mark.parametrize("raw", [b"", b"{", b'{"kind": "sleep"', b"\xff\xfe", b'{"kind": "sleep", "params": NaN}'])
async def test_malformed_json_is_400(harness: Harness, raw: bytes) -> None:
    status, body = await harness.json("POST", "/api/jobs", data=raw, headers={"Content-Type": "application/json"})
    assert status == 400
    assert_error(body, "malformed_json", "body")


async def test_body_must_be_json(harness: Harness) -> None:
    status, body = await harness.json(
        "POST", "/api/jobs", data=b'{"kind": "tidy"}', headers={"Content-Type": "text/plain"}
    )
    assert status == 415
    assert_error(body, "unsupported_media_type")
    assert sum((await harness.supervisor.registry.counts()).values()) == 0


async def test_body_too_large_is_413_and_stores_nothing(harness: Harness) -> None:
    big = {"kind": "echo", "params": {"text": "x" * MAX_BODY_BYTES}}
    status, body = await harness.json("POST", "/api/jobs", json=big)
    assert status == 413
    assert_error(body, "body_too_large")
    assert sum((await harness.supervisor.registry.counts()).values()) == 0


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"status": "sleeping"}, "status"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"colour": "red"}, "colour"),
        # The registry's limits, checked at the edge: an int param is 64-bit, a time moves to UTC within the calendar.
        ({"param.n": "9223372036854775808"}, "param.n"),
        ({"kind": "typed", "param.n": "-9223372036854775809"}, "param.n"),
        ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
        ({"until": "9999-12-31T23:59:59-01:00"}, "until"),
        ({"ended_since": "0001-01-01T00:30:00+00:45"}, "ended_since"),
    ],
)
async def test_bad_list_query_is_422_naming_it(harness: Harness, query: dict[str, str], field: str) -> None:
    status, body = await harness.json("GET", "/api/jobs", query_string=query)
    assert status == 422
    assert_error(body, "validation_error", field)


async def test_list_filters_and_limits(harness: Harness) -> None:
    await harness.supervisor.pause()
    ids = [
        (await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": i}}))[1]["job_id"]
        for i in range(3)
    ]
    await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    status, page = await harness.json("GET", "/api/jobs", query_string={"kind": "sleep", "status": "queued"})
    assert status == 200
    assert [job["job_id"] for job in page["jobs"]] == ids[::-1]  # newest first
    assert [job["queue_position"] for job in page["jobs"]] == [3, 2, 1]
    assert page["next_cursor"] is None
    _, capped = await harness.json("GET", "/api/jobs", query_string={"limit": "1000"})
    assert len(capped["jobs"]) == 4
    _, none = await harness.json("GET", "/api/jobs", query_string={"status": "failed"})
    assert none == {"jobs": [], "next_cursor": None}


async def test_pagination_is_stable_while_rows_are_added(harness: Harness) -> None:
    await harness.supervisor.pause()

    async def add(n: int) -> list[str]:
        return [
            (await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": i}}))[1]["job_id"]
            for i in range(n)
        ]

    first_batch = await add(5)
    seen: list[str] = []
    cursor: str | None = None
    while True:
        query = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        _, page = await harness.json("GET", "/api/jobs", query_string=query)
        seen.extend(job["job_id"] for job in page["jobs"])
        await add(1)  # a new row between pages must neither shift nor repeat what follows
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == first_batch[::-1]


async def test_unknown_job_is_404_on_every_job_route(harness: Harness) -> None:
    for method, path in [
        ("GET", "/api/jobs/nope"),
        ("POST", "/api/jobs/nope/cancel"),
        ("GET", "/api/jobs/nope/log"),
    ]:
        status, body = await harness.json(method, path)
        assert status == 404, path
        assert_error(body, "not_found", "job_id")
    status, body = await harness.json("GET", "/api/nothing-here")
    assert status == 404
    assert_error(body, "not_found")


async def test_wrong_method_is_405_with_allow(harness: Harness) -> None:
    response = await harness.client.delete("/api/queue")
    assert response.status_code == 405
    assert "GET" in response.headers["Allow"]
    assert_error(await response.get_json(), "method_not_allowed")


async def test_cancel_queued_then_again_is_idempotent(harness: Harness) -> None:
    await harness.supervisor.pause()
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
    path = f"/api/jobs/{answer['job_id']}/cancel"
    status, row = await harness.json("POST", path)
    assert (status, row["status"]) == (200, "cancelled")
    status, again = await harness.json("POST", path)
    assert (status, again) == (200, row)


async def test_cancel_running_job_stops_it(harness: Harness) -> None:
    status, answer = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
    assert (status, answer["status"]) == (202, "queued")  # stored; the drainer spawns it without the caller waiting
    await wait_running(harness.supervisor, answer["job_id"])
    status, row = await harness.json("POST", f"/api/jobs/{answer['job_id']}/cancel")
    assert status == 200
    assert row["cancel_requested"] is True
    job = await wait_terminal(harness.supervisor, answer["job_id"])
    assert job.status == "cancelled"


def counts(state: dict[str, object]) -> dict[str, object]:
    """The queue state's counts (the rest is the queue's watch, as of the last sweep)."""
    return {k: state[k] for k in ("paused", "running", "queued", "max_concurrent")}


async def test_pause_and_resume_drive_promotion(harness: Harness) -> None:
    status, state = await harness.json("POST", "/api/queue/pause")
    assert (status, counts(state)) == (200, {"paused": True, "running": 0, "queued": 0, "max_concurrent": 2})
    assert (await harness.supervisor.registry.pause_state()).by == "operator"  # registry state, not a file
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
    assert answer["status"] == "queued"
    _, health = await harness.json("GET", "/api/health")
    assert health["paused"] is True
    assert (await harness.json("GET", "/api/queue"))[1]["queued"] == 1

    status, state = await harness.json("POST", "/api/queue/resume")
    assert (status, counts(state)) == (200, {"paused": False, "running": 1, "queued": 0, "max_concurrent": 2})
    assert set(state) >= {"oldest_queued_age_s", "last_promotion_at", "held", "stuck"}  # the queue's watch
    assert not (await harness.supervisor.registry.pause_state()).paused


async def test_reconcile_reports_each_running_row(harness: Harness) -> None:
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
    await wait_running(harness.supervisor, answer["job_id"])
    status, report = await harness.json("POST", "/api/jobs/reconcile")
    assert status == 200
    assert report == {
        "updated": 0,
        "details": [
            {
                "job_id": answer["job_id"],
                "action": "keep",
                "reason": "alive",
                "liveness": "alive",
                "prior_boot": False,
                "still_running": False,
            }
        ],
    }


async def test_operator_reconcile_marks_a_live_job_past_the_window_stale(open_harness: OpenHarness) -> None:
    # Any running job is past a one-microsecond window; only the operator route may evict it (sweeps only warn).
    async with open_harness(stale_after_s=1e-6) as harness:
        _, answer = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
        await wait_running(harness.supervisor, answer["job_id"])
        status, report = await harness.json("POST", "/api/jobs/reconcile")
        assert status == 200
        assert report["updated"] == 1
        assert (report["details"][0]["action"], report["details"][0]["still_running"]) == ("stale", True)
        job = await harness.supervisor.get(answer["job_id"])
        assert (job.status, job.error_reason) == ("stale", "wall_clock_stale")
        # A stale verdict sends no signal: the process is ours to stop, then its monitor reaps it.
        assert job.identity is not None
        os.kill(job.identity.fields["pid"], signal.SIGKILL)  # type: ignore[arg-type]

        async def monitor_done() -> bool | None:
            return True if answer["job_id"] not in harness.supervisor.boot.ledger else None

        await poll_until(monitor_done)


async def test_log_whole_tail_and_offset(harness: Harness) -> None:
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "echo", "params": {"text": "hello world"}})
    await wait_terminal(harness.supervisor, answer["job_id"])
    path = f"/api/jobs/{answer['job_id']}/log"

    response = await harness.client.get(path)
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert await response.get_data() == b"hello world\n"
    tail = await harness.client.get(path, query_string={"tail_bytes": "6"})
    assert await tail.get_data() == b"world\n"
    rest = await harness.client.get(path, query_string={"offset": "6"})
    assert await rest.get_data() == b"world\n"
    past = await harness.client.get(path, query_string={"offset": "1000"})
    assert await past.get_data() == b""

    for query, field in [
        ({"tail_bytes": "-1"}, "tail_bytes"),
        ({"offset": "x"}, "offset"),
        ({"tail_bytes": "1", "offset": "1"}, "offset"),
    ]:
        status, body = await harness.json("GET", path, query_string=query)
        assert status == 422
        assert_error(body, "validation_error", field)


async def test_log_of_a_queued_job_is_empty(harness: Harness) -> None:
    await harness.supervisor.pause()
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    response = await harness.client.get(f"/api/jobs/{answer['job_id']}/log")
    assert (response.status_code, await response.get_data()) == (200, b"")


async def test_heartbeat_records_progress_as_a_watermark(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"

    response = await harness.client.post(
        path, json={"completed_units": 3, "total_units": 10, "stage": "fetch"}, headers=bearer(token)
    )
    assert response.status_code == 204
    assert await response.get_data() == b""
    first = await harness.supervisor.get(job_id)
    assert (first.completed_units, first.total_units, first.stage) == (3, 10, "fetch")
    assert first.last_progress_at is not None

    # A lower count is a liveness beat only: the watermark and last_progress_at stay.
    response = await harness.client.post(path, json={"completed_units": 2}, headers=bearer(token))
    assert response.status_code == 204
    second = await harness.supervisor.get(job_id)
    assert second.completed_units == 3
    assert second.last_progress_at == first.last_progress_at
    assert second.last_heartbeat_at is not None and first.last_heartbeat_at is not None
    assert second.last_heartbeat_at >= first.last_heartbeat_at


async def test_heartbeat_rejects_other_tokens_and_bad_bodies(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    _, other_token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"

    for headers in [{}, bearer(other_token), {"Authorization": f"Basic {token}"}, bearer(token + "x")]:
        status, body = await harness.json("POST", path, json={"completed_units": 1}, headers=headers)
        assert status == 401, headers
        assert_error(body, "unauthorized")
    assert (await harness.supervisor.get(job_id)).last_heartbeat_at is None

    for bad, field in [
        ({"completed_units": -1}, "completed_units"),
        ({"completed_units": "1"}, "completed_units"),
        ({}, "completed_units"),
        ({"completed_units": 1, "total_units": True}, "total_units"),
        ({"completed_units": 1, "stage": "x" * 201}, "stage"),
        ({"completed_units": 1, "eta": 5}, "eta"),
        ([1], "body"),
    ]:
        status, body = await harness.json("POST", path, json=bad, headers=bearer(token))
        assert status == 422, bad
        assert_error(body, "validation_error", field)
    # Without the job's token a caller learns nothing: an unknown id and a bad body are both 401 first.
    status, body = await harness.json(
        "POST", "/api/jobs/nope/heartbeat", json={"completed_units": 1}, headers=bearer(token)
    )
    assert status == 401
    status, body = await harness.json("POST", path, json={"completed_units": -1}, headers=bearer(other_token))
    assert status == 401


async def test_a_job_token_stops_working_when_the_job_ends(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    await harness.json("POST", f"/api/jobs/{job_id}/cancel")
    ended = await wait_terminal(harness.supervisor, job_id)
    assert ended.token_hash is None  # nothing left to match
    status, body = await harness.json(
        "POST", f"/api/jobs/{job_id}/heartbeat", json={"completed_units": 1}, headers=bearer(token)
    )
    # The same answer as a wrong token or an unknown job: a late (or stolen) token tells nothing.
    assert status == 401
    assert_error(body, "unauthorized")


async def test_unexpected_error_is_500_without_traceback_and_logged_with_the_request_id(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> Any:
        raise RuntimeError("secret internal detail")

    with monkeypatch.context() as patch, structlog.testing.capture_logs() as logs:
        patch.setattr(harness.supervisor, "queue_state", broken)
        response = await harness.client.get("/api/queue")
    assert response.status_code == 500
    text = (await response.get_data()).decode()
    assert "secret internal detail" not in text and "Traceback" not in text and "RuntimeError" not in text
    body = await response.get_json()
    assert_error(body, "internal_error")
    request_id = response.headers[REQUEST_ID_HEADER]
    assert body["error"]["request_id"] == request_id
    assert request_id in body["error"]["message"]
    [entry] = [e for e in logs if e["event"] == "request_failed"]
    assert entry["request_id"] == request_id
    assert entry["log_level"] == "error"
    assert entry["exc_info"] is True


async def test_registry_unavailable_is_503(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    async def busy(*args: Any) -> Any:
        raise RegistryError("registry lock not acquired: database is locked")

    with monkeypatch.context() as patch:
        patch.setattr(harness.supervisor, "list_jobs", busy)
        status, body = await harness.json("GET", "/api/jobs")
    assert status == 503
    assert_error(body, "unavailable")
    assert "database is locked" not in body["error"]["message"]


async def test_every_answer_carries_a_request_id(harness: Harness) -> None:
    ids = set()
    for path in ["/api/health", "/api/jobs", "/api/jobs/nope", "/metrics", "/nowhere"]:
        response = await harness.client.get(path)
        ids.add(response.headers[REQUEST_ID_HEADER])
    assert len(ids) == 5


async def test_metrics_count_jobs_by_status_and_the_pause(harness: Harness) -> None:
    await harness.supervisor.pause()
    for _ in range(2):
        await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 1}})
    response = await harness.client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    families = {f.name: f for f in text_string_to_metric_families((await response.get_data()).decode())}
    by_status = {s.labels["status"]: s.value for s in families["podcast_jobs"].samples}
    assert by_status == {"queued": 2, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0, "stale": 0}
    assert families["podcast_queue_paused"].samples[0].value == 1
    assert families["podcast_max_concurrent"].samples[0].value == 2
    # Every name is under podcast_ (the supervisor_* gauges were renamed).
    assert all(name.startswith("podcast_") for name in families)


async def _scrape(harness: Harness) -> dict[str, Any]:
    response = await harness.client.get("/metrics")
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families((await response.get_data()).decode())}


def _per_job(families: dict[str, Any], job_id: str) -> dict[str, float]:
    """Every sample that carries this job's id, by sample name."""
    return {
        sample.name: sample.value
        for family in families.values()
        for sample in family.samples
        if sample.labels.get("job_id") == job_id
    }


async def test_metrics_carry_per_job_series_while_the_job_runs_and_not_after(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    code, _ = await harness.json(
        "POST", f"/api/jobs/{job_id}/heartbeat", json={"completed_units": 4}, headers=bearer(token)
    )
    assert code == 204
    await harness.supervisor.sweeper.sweep()
    row = await harness.supervisor.get(job_id)
    assert row.last_progress_at is not None and row.last_heartbeat_at is not None
    series = _per_job(await _scrape(harness), job_id)
    assert series == {
        "podcast_job_running": 1,
        "podcast_job_last_progress_timestamp_seconds": row.last_progress_at.timestamp(),
        "podcast_job_last_heartbeat_timestamp_seconds": row.last_heartbeat_at.timestamp(),
        "podcast_job_completed_units": 4,
        "podcast_job_stalled": 0,
        "podcast_job_silent": 0,
    }
    await harness.supervisor.cancel(job_id)
    await wait_terminal(harness.supervisor, job_id)
    families = await _scrape(harness)
    assert _per_job(families, job_id) == {}  # gone with the job
    transitions = {
        (s.labels["to"], s.labels["reason"]): s.value
        for s in families["podcast_job_transitions"].samples
        if s.name.endswith("_total")
    }
    assert transitions == {("queued", "enqueued"): 1, ("running", "promoted"): 1, ("cancelled", "cancelled"): 1}
    assert {s.labels["outcome"]: s.value for s in families["podcast_webhook_deliveries"].samples} == {
        "delivered": 0,
        "failed": 0,
        "dropped": 0,
    }
    assert families["podcast_webhook_outbox_depth"].samples[0].value == 0  # no webhook: no outbox rows
    sweeps = {s.name: s.value for s in families["podcast_sweep_duration_seconds"].samples}
    assert sweeps["podcast_sweep_duration_seconds_count"] == 1
    assert families["podcast_liveness_unknown"].samples[0].value == 0


async def test_a_resubmission_shows_on_the_row_and_in_the_metrics(harness: Harness) -> None:
    code, body = await harness.json("POST", "/api/jobs", json={"kind": "flaky"})
    assert code == 202
    final = await wait_terminal(harness.supervisor, body["job_id"])
    code, row = await harness.json("GET", f"/api/jobs/{body['job_id']}")
    assert code == 200 and (row["status"], row["error_reason"], row["attempts"]) == ("failed", "exit_code_75", 2)
    assert (row["max_attempts"], row["next_attempt_at"]) == (2, None)
    [attempt] = row["history"]
    assert (attempt["attempt"], attempt["status"], attempt["reason"], attempt["exit_code"]) == (
        1,
        "failed",
        "exit_code_75",
        75,
    )
    assert attempt["started_at"] is not None and attempt["ended_at"] <= row["started_at"]
    assert final.history[0].ended_at is not None
    families = await _scrape(harness)
    resubmits = {
        s.labels["why"]: s.value for s in families["podcast_job_resubmits"].samples if s.name.endswith("_total")
    }
    assert resubmits == {"exit_code_75": 1}
    transitions = {
        (s.labels["to"], s.labels["reason"]): s.value
        for s in families["podcast_job_transitions"].samples
        if s.name.endswith("_total")
    }
    assert transitions[("queued", "resubmitted")] == 1 and transitions[("running", "promoted")] == 2


async def test_a_job_that_never_progressed_is_aged_from_its_start(harness: Harness) -> None:
    job_id, _ = await start_tokened(harness)
    row = await harness.supervisor.get(job_id)
    assert row.started_at is not None and row.last_progress_at is None
    series = _per_job(await _scrape(harness), job_id)
    # The alert's progress age is time() - this: the start, until the watermark first rises.
    assert series["podcast_job_last_progress_timestamp_seconds"] == row.started_at.timestamp()
    assert "podcast_job_last_heartbeat_timestamp_seconds" not in series


async def test_two_apps_have_separate_metric_registries(open_harness: OpenHarness) -> None:
    # Building a second app must not collide with the first's metrics (no process-global registry).
    async with open_harness() as one, open_harness() as two:
        assert (
            one.app.extensions["supervisor.metrics_registry"] is not two.app.extensions["supervisor.metrics_registry"]
        )
        for h in (one, two):
            assert (await h.client.get("/metrics")).status_code == 200


async def test_failed_job_row_names_the_reason(harness: Harness) -> None:
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "fail"})
    job = await wait_for_job(harness.supervisor, answer["job_id"], lambda j: j.status.is_terminal)
    _, row = await harness.json("GET", f"/api/jobs/{job.job_id}")
    assert (row["status"], row["exit_code"], row["error_reason"]) == ("failed", 3, "exit_code_3")


async def test_batch_enqueue_answers_in_order_and_a_bad_element_stores_nothing(harness: Harness) -> None:
    await harness.supervisor.pause()
    jobs = [{"kind": "sleep", "params": {"seconds": 1}} for _ in range(5)] + [{"kind": "tidy"}, {"kind": "tidy"}]
    status, body = await harness.json("POST", "/api/jobs/batch", json={"jobs": jobs})
    assert status == 202
    assert [(a["status"], a["coalesced"]) for a in body["jobs"]] == [("queued", False)] * 6 + [("queued", True)]
    listed, _ = await harness.supervisor.list_jobs()
    assert [j.job_id for j in reversed(listed)] == [a["job_id"] for a in body["jobs"][:6]]

    bad = [*jobs[:3], {"kind": "sleep", "params": {"seconds": "soon"}}]
    status, body = await harness.json("POST", "/api/jobs/batch", json={"jobs": bad})
    assert status == 422
    assert_error(body, "validation_error", "jobs[3].params.seconds")
    for envelope, field in [({}, "jobs"), ({"jobs": []}, "jobs"), ({"jobs": [{"kind": "tidy"}], "x": 1}, "x")]:
        status, body = await harness.json("POST", "/api/jobs/batch", json=envelope)
        assert status == 422
        assert_error(body, "validation_error", field)
    assert len((await harness.supervisor.list_jobs())[0]) == 6  # nothing more stored


async def test_a_batch_may_be_larger_than_one_job_request_but_not_unbounded(harness: Harness) -> None:
    from supervisor.api import MAX_BATCH_BODY_BYTES

    await harness.supervisor.pause()
    # 1,000 jobs with 100-character params: over the 64 KiB of a single request, under the batch's 1 MiB.
    jobs = [{"kind": "echo", "params": {"text": f"{i:03d}" + "x" * 97}} for i in range(1000)]
    status, body = await harness.json("POST", "/api/jobs/batch", json={"jobs": jobs})
    assert status == 202 and len(body["jobs"]) == 1000
    status, body = await harness.json("POST", "/api/jobs/batch", json={"jobs": [*jobs, jobs[0]]})
    assert status == 422
    assert_error(body, "validation_error", "jobs")
    huge = [{"kind": "echo", "params": {"text": "x" * 4000}} for _ in range(MAX_BATCH_BODY_BYTES // 4000 + 1)]
    status, body = await harness.json("POST", "/api/jobs/batch", json={"jobs": huge})
    assert status == 413
    assert_error(body, "body_too_large")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "delete", "filter": {}, "dry_run": True}, "action"),
        ({"action": "retry", "filter": {"colour": "red"}, "dry_run": True}, "filter.colour"),
        ({"action": "retry", "filter": {"since": "yesterday"}, "dry_run": True}, "filter.since"),
        ({"action": "retry", "filter": {"status": "failed"}}, "selection"),  # acting needs a dry run's selection
        ({"action": "retry", "selection": "not-one-of-ours!"}, "selection"),
        ({"action": "retry", "dry_run": True}, "filter"),
        ({"action": "retry", "filter": {}, "dry_run": True, "extra": 1}, "extra"),
        ({"action": "retry", "filter": {"param.n": 9223372036854775808}, "dry_run": True}, "filter.param.n"),
        ({"action": "retry", "filter": {"until": "9999-12-31T23:59:59-01:00"}, "dry_run": True}, "filter.until"),
    ],
)
async def test_a_bad_bulk_request_is_a_422_naming_the_field(
    harness: Harness, body: dict[str, object], field: str
) -> None:
    status, answer = await harness.json("POST", "/api/jobs/bulk", json=body)
    assert (status, answer["error"]["field"]) == (422, field), answer


async def test_an_unknown_or_expired_selection_is_a_404(harness: Harness) -> None:
    status, answer = await harness.json("POST", "/api/jobs/bulk", json={"action": "retry", "selection": "a" * 32})
    assert (status, answer["error"]["field"]) == (404, "selection")


async def test_a_bulk_dry_run_and_its_action_through_http(harness: Harness) -> None:
    _, queued = await harness.json("POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}})
    status, dry = await harness.json(
        "POST", "/api/jobs/bulk", json={"action": "cancel", "filter": {"kind": "sleep"}, "dry_run": True}
    )
    assert (status, dry["count"], dry["job_ids"], dry["dry_run"]) == (200, 1, [queued["job_id"]], True)
    act = {"action": "cancel", "selection": dry["selection"]}
    status, done = await harness.json("POST", "/api/jobs/bulk", json=act)
    assert status == 200 and done["results"][queued["job_id"]] in ("cancelled", "cancel_requested")
    await wait_terminal(harness.supervisor, queued["job_id"])
