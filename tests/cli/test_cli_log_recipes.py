"""The log-reading recipes of ``docs/operations.md`` ("Reading the logs") run against the log of a real ``supervisor
serve`` that did a small workload: a job that succeeds, one that fails and is retried by a named token, requests
refused for their credentials (none, unknown, too small a scope). Each recipe is read from the page's code block
marked ``<!-- recipe: NAME -->``: its ``journalctl`` part is replaced by the log the server wrote (``-o cat``: the
lines themselves; ``-o json``: each line as the journal's JSON entry, ``MESSAGE`` and ``_HOSTNAME``), and its ``jq``
part is run as written, by the real jq. What it prints is compared with what the same question asked in Python of
the same lines answers, and with what the workload did. So no recipe can rot, nor the page lose one."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from serve_process import serve_process, stop  # type: ignore[import-not-found]
from test_cli_serve import START_LIMIT_S, cli_env, free_port

from supervisor.cli import EXIT_OK, main
from supervisor.domain import hash_token
from supervisor.observe import LOG_EVENTS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations.md"
RECIPE = re.compile(r"<!-- recipe: ([\w-]+) -->\n```sh\n(.*?)\n```", re.S)
WAIT_LIMIT_S = 30.0
JQ_LIMIT_S = 30.0
KINDS = """
[kinds.ok]
argv = ["{python}", "-c", "pass"]

[kinds.bad]
argv = ["{python}", "-c", "import sys; sys.exit(3)"]
"""
WRONG_TOKEN = "pjs_not-a-token-of-this-server"
TERMINAL = {"succeeded", "failed", "cancelled", "stale"}


def recipes() -> dict[str, str]:
    """The page's recipes by name, each one command (its continuation lines joined)."""
    section = PAGE.read_text().split("## Reading the logs", 1)[1].split("\n## ", 1)[0]
    found = {name: body.replace("\\\n", " ") for name, body in RECIPE.findall(section)}
    assert len(found) == len(RECIPE.findall(section)), "two recipes of one name"
    return found


@dataclass
class Workload:
    alpha: Path  # the log of the server that did the work
    beta: Path  # the log of a second host that only started and stopped
    ok_job: str
    bad_job: str
    retried_job: str
    retry_request_id: str
    since: str  # after the first refusal, before the others

    def lines(self, path: Path | None = None) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (path or self.alpha).read_text().splitlines()]


def _now() -> str:
    """Now, as the log's ``timestamp`` writes it (structlog's ISO format, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


async def _run_workload(tmp_path: Path) -> Workload:
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(
        tmp_path, PODCAST_JOB_BIND=url.removeprefix("http://"), PODCAST_JOB_API_TOKEN="op-token",
        PODCAST_JOB_KINDS_FILE=str(kinds), PODCAST_JOB_HOST_ID="alpha",
    )  # fmt: skip
    tokens = {}
    for name, scope in (("dashboard", "read"), ("ops-alice", "operator")):
        out, err = io.StringIO(), io.StringIO()
        assert main(["token", "add", name, "--scope", scope], environ=env, stdout=out, stderr=err) == EXIT_OK, err
        tokens[name] = out.getvalue().strip()
    op = {"Authorization": "Bearer op-token"}
    alpha = tmp_path / "alpha.log"
    async with serve_process(env, tmp_path, alpha) as process, httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        await _until_serving(http)

        async def enqueue(kind: str) -> str:
            answer = await http.post("/api/jobs", json={"kind": kind}, headers=op)
            assert answer.status_code == 202, answer.text
            return str(answer.json()["job_id"])

        async def ended(job_id: str) -> None:
            with trio.fail_after(WAIT_LIMIT_S):
                while True:
                    if (await http.get(f"/api/jobs/{job_id}", headers=op)).json()["status"] in TERMINAL:
                        return
                    await trio.sleep(0.05)  # polling a real server for the job's end, under the deadline above

        assert (await http.get("/api/queue")).status_code == 401  # no token: before SINCE
        await trio.sleep(0.01)  # the clock moves past that line's timestamp
        since = _now()
        ok_job, bad_job = await enqueue("ok"), await enqueue("bad")
        await ended(ok_job)
        await ended(bad_job)
        wrong = {"Authorization": f"Bearer {WRONG_TOKEN}"}
        assert (await http.get(f"/api/jobs/{bad_job}", headers=wrong)).status_code == 401
        assert (await http.get("/api/queue")).status_code == 401
        dashboard = {"Authorization": f"Bearer {tokens['dashboard']}"}
        assert (await http.post("/api/jobs", json={"kind": "ok"}, headers=dashboard)).status_code == 403
        alice = {"Authorization": f"Bearer {tokens['ops-alice']}"}
        retry = await http.post(f"/api/jobs/{bad_job}/retry", headers=alice)
        assert retry.status_code == 202, retry.text
        retried_job = str(retry.json()["job_id"])
        await ended(retried_job)
        assert await stop(process, WAIT_LIMIT_S) == 0

    # A second host of the fleet, for the side-by-side view: it starts and stops.
    url_b = f"http://127.0.0.1:{free_port()}"
    env_b = cli_env(
        tmp_path / "b", PODCAST_JOB_BIND=url_b.removeprefix("http://"), PODCAST_JOB_API_TOKEN="op-token",
        PODCAST_JOB_HOST_ID="beta",
    )  # fmt: skip
    (tmp_path / "b").mkdir()
    beta = tmp_path / "beta.log"
    client_b = httpx.AsyncClient(base_url=url_b, timeout=5.0)
    async with serve_process(env_b, tmp_path / "b", beta) as process, client_b as http:
        await _until_serving(http)
        assert await stop(process, WAIT_LIMIT_S) == 0
    return Workload(alpha, beta, ok_job, bad_job, retried_job, retry.headers["X-Request-Id"], since)


async def _until_serving(http: httpx.AsyncClient) -> None:
    with trio.fail_after(START_LIMIT_S):
        while True:
            try:
                if (await http.get("/api/health")).status_code == 200:
                    return
            except httpx.ConnectError:
                pass
            await trio.sleep(0.05)  # polling for the server to listen, under the deadline above


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Workload:
    if shutil.which("jq") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no jq on PATH (.ci/run installs Debian's jq)", pytrace=False)
        pytest.skip("no jq on PATH (apt-get install jq)")
    return trio.run(_run_workload, tmp_path_factory.mktemp("log-recipes"))


def run_recipe(name: str, work: Workload, **variables: str) -> str:
    """The recipe's jq part, as written, on the log in place of its journalctl part."""
    command = recipes()[name]
    source, sep, rest = command.partition("| jq ")
    assert sep and source.startswith("journalctl "), f"{name}: not `journalctl ... | jq ...`: {command}"
    if "-o json" in source:  # the journal's own entries: our line is the MESSAGE
        feed = "".join(
            json.dumps({"MESSAGE": line, "_HOSTNAME": host, "_SYSTEMD_UNIT": "podcast-supervisor.service"}) + "\n"
            for host, path in (("alpha", work.alpha), ("beta", work.beta))
            for line in path.read_text().splitlines()
        )
    else:
        assert "-o cat" in source, f"{name}: journalctl prints our lines with -o cat (or entries with -o json)"
        feed = work.alpha.read_text()
    done = subprocess.run(
        ["bash", "-c", "jq " + rest], input=feed.encode(), capture_output=True, timeout=JQ_LIMIT_S, check=False,
        env={"PATH": os.environ["PATH"], **variables},
    )  # fmt: skip
    assert done.returncode == 0, f"{name}: {done.stderr.decode()}"
    return done.stdout.decode()


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


WARNING_UP = ("warning", "error", "critical")


def test_the_page_has_exactly_the_recipes_the_suite_runs() -> None:
    assert sorted(recipes()) == sorted(CHECKS)


def test_one_jobs_story(workload: Workload) -> None:
    story = _json_lines(run_recipe("job-story", workload, JOB=workload.bad_job))
    job = workload.bad_job
    assert story == [e for e in workload.lines() if job in (e.get("job_id"), e.get("retry_of"), e.get("follow_up"))]
    transitions = [e["to"] for e in story if e["event"] == "job_transition"]
    assert transitions == ["queued", "running", "failed"]
    events = [e["event"] for e in story]
    assert {"job_spawned", "api_request_refused", "api_request", "job_retried"} <= set(events)
    assert events.index("job_transition") < events.index("job_spawned") < events.index("job_retried")
    [retried] = [e for e in story if e["event"] == "job_retried"]
    assert retried["job_id"] == workload.retried_job and retried["by"] == "ops-alice"


def test_warnings_since_a_time(workload: Workload) -> None:
    found = _json_lines(run_recipe("warnings-since", workload, SINCE=workload.since))
    expected = [e for e in workload.lines() if e["timestamp"] >= workload.since and e["level"] in WARNING_UP]
    assert found == expected
    refusals = [e for e in workload.lines() if e["event"] == "api_request_refused"]
    assert len(refusals) == 4 and refusals[0] not in found  # the first came before SINCE
    assert refusals[1:] == [e for e in found if e["event"] == "api_request_refused"]


def test_warnings_counted_by_event(workload: Workload) -> None:
    counted = json.loads(run_recipe("warnings-counted", workload, SINCE=workload.since))
    since = [e for e in workload.lines() if e["timestamp"] >= workload.since and e["level"] in WARNING_UP]
    assert {c["event"]: c["count"] for c in counted} == {
        name: sum(1 for e in since if e["event"] == name) for name in {e["event"] for e in since}
    }
    assert {"event": "api_request_refused", "level": "warning", "count": 3} in [
        {k: c[k] for k in ("event", "level", "count")} for c in counted
    ]


def test_refusals_by_token(workload: Workload) -> None:
    groups = json.loads(run_recipe("refusals-by-token", workload))
    by_token = {g["token"]: (g["statuses"], g["count"]) for g in groups}
    unknown = hash_token(WRONG_TOKEN)[:12]
    # No token twice; a token this server does not know, by its digest; one of too small a scope, by its name.
    assert by_token == {"none": ([401], 2), unknown: ([401], 1), "dashboard": ([403], 1)}
    assert WRONG_TOKEN not in workload.alpha.read_text()


def test_one_request(workload: Workload) -> None:
    lines = _json_lines(run_recipe("one-request", workload, REQUEST_ID=workload.retry_request_id))
    assert {e["request_id"] for e in lines} == {workload.retry_request_id}
    assert {"api_request", "job_retried"} <= {e["event"] for e in lines}
    assert {e["by"] for e in lines} == {"ops-alice"}  # the core's line too: it was written while the request was served
    # The retried job ran in the drainer's and its monitor's tasks: its lines name no request.
    ended = [e for e in workload.lines() if e.get("job_id") == workload.retried_job and e.get("to") == "failed"]
    assert len(ended) == 1 and "request_id" not in ended[0]


def test_a_fleets_hosts_side_by_side(workload: Workload) -> None:
    rows = [row.split("\t") for row in run_recipe("fleet-timeline", workload).splitlines()]
    both = [e for path in (workload.alpha, workload.beta) for e in workload.lines(path) if e["level"] != "debug"]
    assert [r[0] for r in rows] == sorted(e["timestamp"] for e in both)
    assert len(rows) == len(both)
    started = {(r[1], r[3]) for r in rows if r[3] == "supervisor_started"}
    assert started == {("alpha", "supervisor_started"), ("beta", "supervisor_started")}
    assert {r[1] for r in rows if r[4] == workload.ok_job} == {"alpha"}


def test_every_line_the_server_wrote_is_a_declared_event_and_a_job_line_names_its_job(workload: Workload) -> None:
    declared = {e.name: e for e in LOG_EVENTS}
    for line in workload.lines() + workload.lines(workload.beta):
        if "logger" in line:
            continue  # a library's line (docs/log-events.md): named by its logger, not declared
        event = declared.get(line["event"])
        assert event is not None, line
        assert line["level"] in event.levels, line
        if line["event"].startswith("api_request"):
            continue  # a request names a job only when its route is about one
        for key in ("job_id", "job_ids"):
            if key in event.field_names and key not in line:
                pytest.fail(f"a line about a job without its {key}: {line}")


CHECKS: dict[str, Callable[[Workload], None]] = {
    "job-story": test_one_jobs_story,
    "warnings-since": test_warnings_since_a_time,
    "warnings-counted": test_warnings_counted_by_event,
    "refusals-by-token": test_refusals_by_token,
    "one-request": test_one_request,
    "fleet-timeline": test_a_fleets_hosts_side_by_side,
}
