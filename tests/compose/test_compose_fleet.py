"""The fleet compose file (compose/docker-compose.fleet.yml), run for real on the Docker engine, end to end (ADR 0012).

What runs is the shipped file, unchanged, brought up with ``docker-compose up -d --no-build``, with only its variables
set: a unique project name and ``PODCAST_FLEET`` (the jobs network and the three volumes), free host ports for both
APIs, and ``PODCAST_POSTGRES_IMAGE=podcast-postgres:local`` — the official ``postgres:16`` cannot be pulled on a
machine with no registry, so scripts/postgres-image.sh builds an image of this machine's Debian PostgreSQL with the
same interface (``POSTGRES_PASSWORD``/``_USER``/``_DB``, ``pg_isready``, ``/var/lib/postgresql/data``).

One test-only addition, an override file in tmp_path: a kinds file with a trivial job kind (``nap``: a job container
that sleeps), mounted into both supervisors, a 1 s sweep (a host learns of work enqueued through another at its next
sweep), and a per-host cap of 2 under the fleet-wide limit of 4, so that one host alone cannot take every slot.

What it proves: the supervisors start only after PostgreSQL is healthy and both answer; ``GET /api/hosts`` (through
either) lists the two hosts live, with exactly one leader, and each host's ``/api/health`` agrees about who leads
(INV-ONE-LEADER); jobs enqueued through one host all succeed, and run on both hosts (the rows' ``host_id``), each in a
container; both APIs say the same about every row; ``down -v`` leaves no container, network or volume of the stack.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from compose_helpers import CLI_TIMEOUT_S, ComposeProject, needs  # type: ignore[import-not-found]

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "compose" / "docker-compose.fleet.yml"
POSTGRES_IMAGE = "podcast-postgres:local"
WAIT_S = 60.0  # a backstop for a broken stack, never a timing assertion
LIMIT = 4  # fleet-wide
HOST_CAP = 2  # each host's own: neither host can take every slot
JOBS = 8
NAP_S = 1.5
HOSTS = ("a", "b")
SERVICES = {"a": "supervisor-a", "b": "supervisor-b"}
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "stale"})

KINDS_TOML = """\
[kinds.nap]
argv = ["{python}", "-c", "import sys, time; time.sleep(float(sys.argv[1]))", "{seconds}"]
params = { seconds = "float" }
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ComposeProject]:
    needs(None if shutil.which("docker-compose") else "no docker-compose command (scripts/docker-engine.sh up)")
    image = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "postgres-image.sh"), "check"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )  # fmt: skip
    needs(None if image.returncode == 0 else f"{image.stdout.strip()} (scripts/postgres-image.sh up)")
    project = f"pfleet{secrets.token_hex(4)}"
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS_TOML)
    test_only = {
        "volumes": [f"{kinds}:/etc/podcast/kinds.toml:ro"],
        "environment": {
            "PODCAST_JOB_KINDS_FILE": "/etc/podcast/kinds.toml",
            "PODCAST_JOB_SWEEP_SECONDS": "1",
            "PODCAST_JOB_HOST_MAX_CONCURRENT": str(HOST_CAP),
        },
    }
    override = tmp_path / "fleet-override.yml"
    override.write_text(json.dumps({"version": "3.8", "services": dict.fromkeys(SERVICES.values(), test_only)}))
    token = secrets.token_hex(32)
    env = {
        **os.environ,
        "PODCAST_JOB_API_TOKEN": token,
        "PODCAST_POSTGRES_PASSWORD": secrets.token_hex(16),
        "PODCAST_POSTGRES_IMAGE": POSTGRES_IMAGE,
        "PODCAST_JOB_MAX_CONCURRENT": str(LIMIT),
        "PODCAST_FLEET": project,
        "PODCAST_PORT_A": "",  # a free host port each, chosen by the engine, on 127.0.0.1
        "PODCAST_PORT_B": "",
    }
    volumes = [f"{project}_{name}" for name in ("pgdata", "a_data", "b_data")]
    files = [COMPOSE_FILE, override]
    stack = ComposeProject(project, f"{project}_jobs", volumes, files, token, env, stop_first=list(SERVICES.values()))
    try:
        up = stack.run(stack.compose_argv("up", "-d", "--no-build"))
        assert up.returncode == 0, f"compose up exited {up.returncode}: {up.stderr}"
        yield stack
    finally:
        problems = stack.teardown()
        assert not problems, problems


async def _healthy(client: httpx.AsyncClient) -> dict[str, Any]:
    """``/api/health`` once the server in the container answers (it opens the registry first)."""
    with trio.fail_after(WAIT_S):
        while True:
            try:
                health = await client.get("/api/health", timeout=5)
                if health.status_code == 200:
                    return health.json()  # type: ignore[no-any-return]
            except httpx.TransportError:
                pass  # not listening yet
            await trio.sleep(0.1)


async def test_the_fleet_compose_file_runs_two_supervisors_on_one_postgres_one_leader_jobs_on_both(
    fleet: ComposeProject,
) -> None:
    clients: dict[str, httpx.AsyncClient] = {}
    headers = {"Authorization": f"Bearer {fleet.token}"}
    for host in HOSTS:
        published = (await fleet.cli(fleet.compose_argv("port", SERVICES[host], "8000"))).strip()
        assert published.startswith("127.0.0.1:"), published  # loopback only, as the file says
        clients[host] = httpx.AsyncClient(base_url=f"http://{published}", headers=headers, timeout=10)
    try:
        health = {host: await _healthy(clients[host]) for host in HOSTS}
        assert {host: h["host_id"] for host, h in health.items()} == {"a": "a", "b": "b"}
        assert {h["exec_mode"] for h in health.values()} == {"docker"}

        # INV-ONE-LEADER: both hosts live in the registry, exactly one leads, and each host's own word agrees.
        with trio.fail_after(WAIT_S):
            while True:
                listed = {host: (await clients[host].get("/api/hosts")).json() for host in HOSTS}
                leads = {host: (await clients[host].get("/api/health")).json()["leader"] for host in HOSTS}
                if listed["a"]["leader"] is not None and listed["a"]["leader"] == listed["b"]["leader"]:
                    break
                await trio.sleep(0.1)
        for view in listed.values():
            assert sorted((h["host_id"], h["live"]) for h in view["hosts"]) == [("a", True), ("b", True)], view
            assert [h["host_id"] for h in view["hosts"] if h["leader"]] == [view["leader"]], view
        assert sum(leads.values()) == 1 and leads[listed["a"]["leader"]], (leads, listed)

        # Jobs enqueued through one host run on both (each host may hold only HOST_CAP of the LIMIT slots).
        ids = []
        for _ in range(JOBS):
            answer = await clients["a"].post("/api/jobs", json={"kind": "nap", "params": {"seconds": NAP_S}})
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["job_id"])
        rows: dict[str, dict[str, Any]] = {}
        with trio.fail_after(WAIT_S):
            for job_id in ids:
                while (row := (await clients["b"].get(f"/api/jobs/{job_id}")).json())["status"] not in TERMINAL:  # noqa: ASYNC110
                    await trio.sleep(0.1)
                rows[job_id] = row
        assert {(r["status"], r["exit_code"], r["attempts"]) for r in rows.values()} == {("succeeded", 0, 1)}, rows
        assert {r["host_id"] for r in rows.values()} == set(HOSTS), [r["host_id"] for r in rows.values()]
        assert all(r["container_id"] and r["pid"] is None for r in rows.values()), rows  # containers, never pids
        for job_id, row in rows.items():  # both hosts' APIs say the same about every row
            assert (await clients["a"].get(f"/api/jobs/{job_id}")).json() == row
    finally:
        for client in clients.values():
            await client.aclose()

    # Torn down: no container, network or volume of this stack is left (the fixture repeats this, idempotently, when
    # the test fails before here).
    assert await trio.to_thread.run_sync(fleet.teardown) == []
    assert await trio.to_thread.run_sync(fleet.leftovers) == []
