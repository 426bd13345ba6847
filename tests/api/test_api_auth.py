"""Authentication: with an API token configured, every route but the public ones answers 401 without it.

The protected routes are found by walking the app's route map, so a route added later is covered without editing
this file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from api_support import API_TOKEN, Harness, OpenHarness, wait_for_job, wait_log_line
from werkzeug.routing import Rule

from supervisor.api import PUBLIC_ENDPOINTS

IGNORED_METHODS = {"HEAD", "OPTIONS"}  # added by the framework to every route


def routes(harness: Harness, job_id: str) -> Iterator[tuple[Rule, str, str]]:
    """(rule, method, concrete path) for every route of the app, path arguments filled with ``job_id``."""
    for rule in harness.app.url_map.iter_rules():
        path = re.sub(r"<[^>]+>", job_id, rule.rule)
        for method in sorted((rule.methods or set()) - IGNORED_METHODS):
            yield rule, method, path


def test_the_public_routes_are_exactly_the_probes_and_the_heartbeat() -> None:
    assert {"health", "metrics", "heartbeat"} == PUBLIC_ENDPOINTS


async def test_every_protected_route_is_401_without_the_token_and_changes_nothing(open_harness: OpenHarness) -> None:
    async with open_harness(api_token=API_TOKEN, max_concurrent=1) as authed:
        # One job holds the only slot, one waits: unpaused, so a leaked pause, cancel or enqueue would show.
        holder = (await authed.supervisor.enqueue("sleep", {"seconds": 30})).job
        await wait_for_job(authed.supervisor, holder.job_id, lambda job: job.status == "running")
        waiting = (await authed.supervisor.enqueue("tidy", {})).job
        assert waiting.status == "queued"
        await check_all_protected_routes_refuse(authed, waiting.job_id)
        assert await authed.supervisor.get(waiting.job_id) == waiting  # not cancelled
        assert not await authed.supervisor.is_paused()
        counts = await authed.supervisor.registry.counts()
        assert (counts["running"], counts["queued"], sum(counts.values())) == (1, 1, 2)  # nothing enqueued


async def check_all_protected_routes_refuse(authed: Harness, job_id: str) -> None:
    wrong = [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {API_TOKEN}x"},
        {"Authorization": f"Basic {API_TOKEN}"},
        {"Authorization": API_TOKEN},
        {"Authorization": "Bearer"},
    ]
    protected = [
        (rule, method, path) for rule, method, path in routes(authed, job_id) if rule.endpoint not in PUBLIC_ENDPOINTS
    ]
    assert len(protected) >= 10
    for _, method, path in protected:
        for headers in wrong:
            status, body = await authed.json(method, path, headers=headers, json={"kind": "tidy"})
            assert status == 401, (method, path, headers)
            assert body["error"]["code"] == "unauthorized"


async def test_the_right_token_opens_every_protected_route(authed: Harness) -> None:
    await authed.supervisor.pause()
    good = {"Authorization": f"bearer {API_TOKEN}"}  # the scheme is case-insensitive
    _, answer = await authed.json("POST", "/api/jobs", json={"kind": "tidy"}, headers=good)
    # A silent host named like the path argument, for the route that forgets one (a lease that ended at once).
    await authed.supervisor.registry.renew_lease(answer["job_id"], "gone-boot", lease_s=0, lead=False)
    await authed.supervisor.cancel(answer["job_id"])  # finished: the retry route takes it
    for rule, method, path in routes(authed, answer["job_id"]):
        if rule.endpoint in PUBLIC_ENDPOINTS:
            continue
        body: dict[str, object] = {"jobs": [{"kind": "tidy"}]} if path.endswith("/batch") else {"kind": "tidy"}
        if path.endswith("/bulk"):
            body = {"action": "retry", "filter": {"kind": "tidy"}, "dry_run": True}
        if path == "/api/events":
            path += "?follow=false"  # the stream that ends (this client reads a whole answer)
        if path.endswith(("/drain", "/undrain")):  # the host again, whichever came first: its forget or these
            await authed.supervisor.registry.renew_lease(answer["job_id"], "next-boot", lease_s=0, lead=False)
        response = await authed.client.open(path, method=method, headers=good, json=body)
        assert response.status_code < 400, (method, path, await response.get_data())


async def test_public_routes_need_no_api_token(authed: Harness) -> None:
    for path in ["/api/health", "/metrics"]:
        assert (await authed.client.get(path)).status_code == 200


async def test_heartbeat_takes_the_job_token_not_the_api_token(authed: Harness) -> None:
    good = {"Authorization": f"Bearer {API_TOKEN}"}
    _, answer = await authed.json(
        "POST", "/api/jobs", json={"kind": "tokened", "params": {"seconds": 30}}, headers=good
    )
    job_token = await wait_log_line(authed.supervisor, answer["job_id"])
    path = f"/api/jobs/{answer['job_id']}/heartbeat"
    status, body = await authed.json("POST", path, json={"completed_units": 1}, headers=good)
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    response = await authed.client.post(
        path, json={"completed_units": 1}, headers={"Authorization": f"Bearer {job_token}"}
    )
    assert response.status_code == 204


async def test_without_a_token_configured_no_header_is_needed(open_harness: OpenHarness) -> None:
    async with open_harness(api_token=None) as harness:
        await harness.supervisor.pause()
        for path in ["/api/jobs", "/api/queue", "/api/openapi.json"]:
            assert (await harness.client.get(path)).status_code == 200


async def test_state_changing_requests_from_a_web_page_are_refused(harness: Harness) -> None:
    # No token configured: a browser's bodyless cross-site POST needs no preflight, so Origin is the only tell.
    for path in ["/api/queue/pause", "/api/jobs/reconcile"]:
        status, body = await harness.json("POST", path, headers={"Origin": "https://evil.example"})
        assert (status, body["error"]["code"]) == (403, "cross_origin")
    assert not await harness.supervisor.is_paused()
    # Reads stay open (the browser's same-origin policy keeps their answers from the page).
    assert (await harness.client.get("/api/health", headers={"Origin": "https://evil.example"})).status_code == 200
