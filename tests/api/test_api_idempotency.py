"""Idempotency-Key on POST /api/jobs and /api/jobs/batch (ADR 0016): the same key with the same request answers what
the first was answered, with ``Idempotent-Replayed: true``, and makes no job; with another request it is a 422 naming
the key; a key that is no key is a 400 naming the header; GET /api/jobs?idempotency_key= finds what a key made."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import API_TOKEN, Harness, assert_error, bearer, wait_terminal
from werkzeug.datastructures import Headers

KEY = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"


async def post(harness: Harness, path: str, body: Any, headers: Any) -> tuple[int, Any, Headers]:
    response = await harness.client.open(path, method="POST", json=body, headers=headers)
    return response.status_code, await response.get_json(), response.headers


async def test_a_retry_with_the_key_answers_the_first_answer_and_makes_no_job(harness: Harness) -> None:
    await harness.supervisor.pause()  # the answers stay comparable: nothing runs
    body = {"kind": "sleep", "params": {"seconds": 5}}
    status, first, head = await post(harness, "/api/jobs", body, {KEY: "order-42"})
    assert (status, REPLAYED in head) == (202, False)
    again_status, again, again_head = await post(harness, "/api/jobs", body, {KEY: "order-42"})
    assert (again_status, again, again_head[REPLAYED]) == (202, first, "true")
    # The same arguments under another key are another request: a second job.
    _, other, _ = await post(harness, "/api/jobs", body, {KEY: "order-43"})
    assert other["job_id"] != first["job_id"]
    _, listed = await harness.json("GET", "/api/jobs")
    assert len(listed["jobs"]) == 2
    _, row = await harness.json("GET", f"/api/jobs/{first['job_id']}")
    assert row["idempotency_key"] == "order-42"
    _, found = await harness.json("GET", "/api/jobs?idempotency_key=order-42")
    assert [j["job_id"] for j in found["jobs"]] == [first["job_id"]]


async def test_a_replay_answers_as_first_answered_after_the_job_ran(harness: Harness) -> None:
    body = {"kind": "echo", "params": {"text": "hi"}}
    _, first, _ = await post(harness, "/api/jobs", body, {KEY: "k"})
    assert first["status"] == "queued"
    assert (await wait_terminal(harness.supervisor, first["job_id"])).status.value == "succeeded"
    _, again, head = await post(harness, "/api/jobs", body, {KEY: "k"})
    assert again == first and head[REPLAYED] == "true"


async def test_the_key_with_another_request_is_422_and_makes_nothing(harness: Harness) -> None:
    await harness.supervisor.pause()
    await post(harness, "/api/jobs", {"kind": "sleep", "params": {"seconds": 5}}, {KEY: "k"})
    status, body, _ = await post(harness, "/api/jobs", {"kind": "sleep", "params": {"seconds": 6}}, {KEY: "k"})
    assert status == 422
    assert_error(body, "idempotency_key_reused", KEY)
    status, body, _ = await post(harness, "/api/jobs/batch", {"jobs": [{"kind": "sleep", "params": {"seconds": 5}}]},
                                 {KEY: "k"})  # fmt: skip
    assert status == 422  # a batch of the very same job is another request
    _, listed = await harness.json("GET", "/api/jobs")
    assert len(listed["jobs"]) == 1


async def test_a_batch_key_covers_the_batch(harness: Harness) -> None:
    await harness.supervisor.pause()
    body = {"jobs": [{"kind": "sleep", "params": {"seconds": n}} for n in range(1, 4)]}
    status, first, head = await post(harness, "/api/jobs/batch", body, {KEY: "batch-1"})
    assert (status, REPLAYED in head) == (202, False)
    status, again, head = await post(harness, "/api/jobs/batch", body, {KEY: "batch-1"})
    assert (status, again, head[REPLAYED]) == (202, first, "true")
    _, found = await harness.json("GET", "/api/jobs?idempotency_key=batch-1")
    assert sorted(j["job_id"] for j in found["jobs"]) == sorted(j["job_id"] for j in first["jobs"])


async def test_a_keyed_request_that_coalesces_answers_the_waiting_job_again(harness: Harness) -> None:
    await harness.supervisor.pause()
    _, waiting = await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    _, first, _ = await post(harness, "/api/jobs", {"kind": "tidy"}, {KEY: "t"})
    _, again, head = await post(harness, "/api/jobs", {"kind": "tidy"}, {KEY: "t"})
    assert first["job_id"] == again["job_id"] == waiting["job_id"]
    assert first["coalesced"] and again == first and head[REPLAYED] == "true"


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ([(KEY, "")], "empty"),
        ([(KEY, "x" * 256)], "too long"),
        ([(KEY, "caf\u00e9")], "not ASCII"),
        ([(KEY, "a\tb")], "a control character"),
        ([(KEY, "a"), (KEY, "b")], "sent twice"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_a_key_that_is_no_key_is_400_naming_the_header(harness: Harness, headers: Any, why: str) -> None:
    for path, body in (("/api/jobs", {"kind": "tidy"}), ("/api/jobs/batch", {"jobs": [{"kind": "tidy"}]})):
        status, answer, _ = await post(harness, path, body, Headers(headers))
        assert status == 400, why
        assert_error(answer, "invalid_header", KEY)
    _, listed = await harness.json("GET", "/api/jobs")
    assert listed["jobs"] == []


async def test_the_longest_key_is_taken(harness: Harness) -> None:
    status, _, _ = await post(harness, "/api/jobs", {"kind": "tidy"}, {KEY: "~" * 255})
    assert status == 202


async def test_listing_by_a_bad_key_is_422_naming_it(harness: Harness) -> None:
    status, body = await harness.json("GET", "/api/jobs?idempotency_key=")
    assert status == 422
    assert_error(body, "validation_error", "idempotency_key")


async def test_a_replay_with_a_wrong_token_is_401_like_any_request(authed: Harness) -> None:
    body = {"kind": "tidy"}
    status, first, _ = await post(authed, "/api/jobs", body, {KEY: "k", **bearer(API_TOKEN)})
    assert status == 202
    status, answer, _ = await post(authed, "/api/jobs", body, {KEY: "k", **bearer("wrong")})
    assert status == 401 and "job_id" not in answer
    status, again, _ = await post(authed, "/api/jobs", body, {KEY: "k", **bearer(API_TOKEN)})
    assert (status, again) == (202, first)
