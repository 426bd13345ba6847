"""Hostile or careless input: each defect that fuzzing found (every test of one failed on the code before its fix),
and the security rules.
"""

from __future__ import annotations

import hmac
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from api_support import (
    API_TOKEN,
    Harness,
    MakeLive,
    assert_error,
    bearer,
    poll_until,
    start_tokened,
    wait_log_line,
    wait_terminal,
)

from supervisor.domain import hash_token

# -- 1. one request must never wedge the queue ------------------------------------------------------


async def test_a_lone_surrogate_param_is_422_naming_the_field_and_holds_no_slot(harness: Harness) -> None:
    status, body = await harness.json("POST", "/api/jobs", json={"kind": "echo", "params": {"text": "a\ud800b"}})
    assert status == 422
    assert_error(body, "validation_error", "params.text")
    assert await harness.supervisor.registry.running_jobs() == []
    # The queue still moves.
    status, body = await harness.json("POST", "/api/jobs", json={"kind": "echo", "params": {"text": "ok"}})
    assert status == 202
    assert (await wait_terminal(harness.supervisor, body["job_id"])).status == "succeeded"


# -- 2. deeply nested JSON ----------------------------------------------------------------------------


NESTED = "[" * 2000  # past the JSON decoder's recursion limit (about 1,000), well under the 64 KiB body cap


async def test_deeply_nested_json_is_400_not_500(harness: Harness) -> None:
    status, body = await harness.json("POST", "/api/jobs", data=NESTED, headers={"Content-Type": "application/json"})
    assert status == 400
    assert_error(body, "malformed_json", "body")


async def test_nested_json_on_the_heartbeat_is_401_without_the_token_and_400_with_it(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"
    headers = {"Content-Type": "application/json"}
    status, body = await harness.json("POST", path, data=NESTED, headers={**headers, **bearer("wrong")})
    assert status == 401
    assert_error(body, "unauthorized")
    status, body = await harness.json("POST", path, data=NESTED, headers={**headers, **bearer(token)})
    assert status == 400
    assert_error(body, "malformed_json", "body")


# -- 3 and 8. numbers: in range, ASCII digits only ----------------------------------------------------


@pytest.mark.parametrize(
    "cursor", ["99999999999999999999", "-1", "1_0", "\u0661", " 5", "5 ", "+5", "0x10", "", "1e3"]
)
async def test_a_cursor_that_is_not_a_plain_ascii_sequence_number_is_422(harness: Harness, cursor: str) -> None:
    status, body = await harness.json("GET", "/api/jobs", query_string={"cursor": cursor})
    assert status == 422
    assert_error(body, "validation_error", "cursor")


@pytest.mark.parametrize("limit", ["\u0663", "1_0", " 3", "\uff13"])
async def test_non_ascii_digits_in_a_query_number_are_422(harness: Harness, limit: str) -> None:
    status, body = await harness.json("GET", "/api/jobs", query_string={"limit": limit})
    assert status == 422
    assert_error(body, "validation_error", "limit")
    job_id, _ = await start_tokened(harness)
    status, body = await harness.json("GET", f"/api/jobs/{job_id}/log", query_string={"tail_bytes": limit})
    assert status == 422
    assert_error(body, "validation_error", "tail_bytes")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"n": "\u0661", "ratio": 1.0, "flag": True, "name": "x"}, "params.n"),
        ({"n": "1_0", "ratio": 1.0, "flag": True, "name": "x"}, "params.n"),
        ({"n": " 1", "ratio": 1.0, "flag": True, "name": "x"}, "params.n"),
        ({"n": 1, "ratio": "\u0661.\u0665", "flag": True, "name": "x"}, "params.ratio"),
        ({"n": 1, "ratio": "1_0.5", "flag": True, "name": "x"}, "params.ratio"),
        ({"n": 1, "ratio": "infinity", "flag": True, "name": "x"}, "params.ratio"),
        ({"n": 1, "ratio": "nan", "flag": True, "name": "x"}, "params.ratio"),
    ],
)
async def test_numbers_given_as_strings_take_ascii_digits_only(
    harness: Harness, params: dict[str, Any], field: str
) -> None:
    status, body = await harness.json("POST", "/api/jobs", json={"kind": "typed", "params": params})
    assert status == 422, body
    assert_error(body, "validation_error", field)


async def test_plain_ascii_numbers_as_strings_still_pass(harness: Harness) -> None:
    params = {"n": "-12", "ratio": "2.5e-1", "flag": "true", "name": "x"}
    status, body = await harness.json("POST", "/api/jobs", json={"kind": "typed", "params": params})
    assert status == 202, body
    job = await harness.supervisor.get(body["job_id"])
    assert job.params == {"n": -12, "ratio": 0.25, "flag": True, "name": "x"}


# -- 4. the heartbeat checks the job token before it reads the body --------------------------------------


@pytest.mark.parametrize(
    ("data", "content_type"),
    [("{", "application/json"), ("hello", "text/plain"), (NESTED, "application/json"), ("{}", "")],
)
async def test_without_the_job_token_every_heartbeat_body_is_401(
    harness: Harness, data: str, content_type: str
) -> None:
    job_id, token = await start_tokened(harness)
    for path, headers in [
        (f"/api/jobs/{job_id}/heartbeat", bearer(token + "x")),
        (f"/api/jobs/{job_id}/heartbeat", {}),
        ("/api/jobs/no-such-job/heartbeat", bearer(token)),
    ]:
        response = await harness.client.post(path, data=data, headers={"Content-Type": content_type, **headers})
        assert response.status_code == 401, (path, data, content_type)
        assert_error(await response.get_json(), "unauthorized")


async def test_with_the_job_token_a_bad_body_gets_its_own_answer(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"
    response = await harness.client.post(path, data="{", headers={"Content-Type": "application/json", **bearer(token)})
    assert response.status_code == 400
    response = await harness.client.post(path, data="{}", headers={"Content-Type": "text/plain", **bearer(token)})
    assert response.status_code == 415


# -- security ---------------------------------------------------------------------------------------------


async def test_job_tokens_are_stored_hashed_and_never_returned(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    status, row = await harness.json("GET", f"/api/jobs/{job_id}")
    assert status == 200
    assert "token_hash" not in row and token not in str(row)
    path = harness.supervisor.config.registry_path
    conn = sqlite3.connect(path)
    try:
        stored = conn.execute("SELECT token_hash FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0]
        dump = "\n".join(conn.iterdump())
    finally:
        conn.close()
    assert stored == hash_token(token) != token
    assert token not in dump


async def test_tokens_are_never_logged(make_live: MakeLive) -> None:
    with structlog.testing.capture_logs() as logs:
        live = await make_live(api_token=API_TOKEN)
        async with httpx.AsyncClient(base_url=live.url, timeout=5) as client:
            answer = await client.post(
                "/api/jobs", json={"kind": "beater", "params": {"units": 3}}, headers=bearer(API_TOKEN), timeout=5
            )
            job = await wait_terminal(live.supervisor, answer.json()["job_id"])
            assert job.status == "succeeded" and job.completed_units == 3  # it heartbeated with its own token
            log_text = (await live.supervisor.read_log(job.job_id)).decode()
            assert (await client.get("/api/jobs", headers=bearer("wrong-token"), timeout=5)).status_code == 401
    assert any(e["event"] == "job_transition" for e in logs)
    text = repr(logs)
    assert API_TOKEN not in text
    assert "wrong-token" not in text
    assert "heartbeat 204" in log_text  # the job did use its token (see the beater kind)


async def test_a_job_token_opens_no_operator_route_and_no_other_job(open_harness: Any) -> None:
    async with open_harness(api_token=API_TOKEN) as h:
        ids = []
        for _ in range(2):
            _, answer = await h.json(
                "POST", "/api/jobs", json={"kind": "tokened", "params": {"seconds": 30}}, headers=bearer(API_TOKEN)
            )
            ids.append(answer["job_id"])
        mine, other = ids
        my_token = await wait_log_line(h.supervisor, mine)
        for method, path in [
            ("POST", f"/api/jobs/{other}/cancel"),
            ("GET", f"/api/jobs/{other}/log"),
            ("GET", f"/api/jobs/{other}"),
            ("POST", f"/api/jobs/{other}/heartbeat"),
            ("POST", f"/api/jobs/{mine}/cancel"),  # not even its own: cancel is an operator's verb
        ]:
            kwargs = {"json": {"completed_units": 1}} if method == "POST" else {}
            status, _ = await h.json(method, path, headers=bearer(my_token), **kwargs)
            assert status == 401, (method, path)
        assert (await h.supervisor.get(other)).last_heartbeat_at is None
        assert (await h.supervisor.get(other)).status == "running"
        assert (await h.supervisor.get(mine)).status == "running"


@pytest.fixture
def compares(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """Every hmac.compare_digest call (the module both the app and the registry call)."""
    calls: list[tuple[Any, Any]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    return calls


async def test_the_api_token_compare_is_constant_time(authed: Harness, compares: list[tuple[Any, Any]]) -> None:
    status, _ = await authed.json("GET", "/api/queue", headers=bearer("guess"))
    assert status == 401
    assert (b"guess", API_TOKEN.encode()) in compares


async def test_the_job_token_compare_is_constant_time(harness: Harness, compares: list[tuple[Any, Any]]) -> None:
    job_id, _ = await start_tokened(harness)
    status, _ = await harness.json(
        "POST", f"/api/jobs/{job_id}/heartbeat", json={"completed_units": 1}, headers=bearer("guess")
    )
    assert status == 401
    stored = (await harness.supervisor.get(job_id)).token_hash
    assert (stored, hash_token("guess")) in compares


# -- the operator token from a file, re-read on SIGHUP ------------------------------------------------------


async def test_token_file_is_reread_on_sighup(make_live: MakeLive, tmp_path: Path) -> None:
    import os
    import signal

    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    live = await make_live(api_token="first-token", api_token_file=token_file)
    async with httpx.AsyncClient(base_url=live.url, timeout=5) as client:
        assert (await client.get("/api/queue", headers=bearer("first-token"), timeout=5)).status_code == 200
        token_file.write_text("second-token\n")
        os.kill(os.getpid(), signal.SIGHUP)

        async def second_token_works() -> bool | None:
            response = await client.get("/api/queue", headers=bearer("second-token"), timeout=5)
            return True if response.status_code == 200 else None

        await poll_until(second_token_works)  # the server's signal task handles it: no event crosses to here
        assert (await client.get("/api/queue", headers=bearer("first-token"), timeout=5)).status_code == 401

        # A broken file keeps the token in force: never an open API.
        token_file.write_text("")
        with structlog.testing.capture_logs() as logs:
            os.kill(os.getpid(), signal.SIGHUP)

            async def reload_failed() -> bool | None:
                return True if any(e["event"] == "api_token_reload_failed" for e in logs) else None

            await poll_until(reload_failed)
        assert (await client.get("/api/queue", headers=bearer("second-token"), timeout=5)).status_code == 200
        assert (await client.get("/api/queue", timeout=5)).status_code == 401

