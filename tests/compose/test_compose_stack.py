"""The local compose stack (compose/docker-compose.yml), run for real on the Docker engine, end to end.

What runs is the shipped file itself, unchanged, brought up with ``docker-compose up -d --no-build`` (the image
``podcast-job-supervisor:local`` is on the engine: scripts/docker-engine.sh builds it; building from the Dockerfile
would need a registry). Only its variables are set, so that this run collides with nothing else on the engine: a
unique project name (``-p``), its own jobs network and corpus volume (``PODCAST_JOBS_NETWORK``,
``PODCAST_CORPUS_VOLUME``, default ``podcast_jobs`` / ``podcast_corpus``) and an ephemeral host port on 127.0.0.1
(``PODCAST_BIND=127.0.0.1:``, read back with ``docker-compose port``).

One test-only addition, an override file in tmp_path: a ``feed`` service (the same local image, serving a static RSS
feed and its enclosures with ``python3 -m http.server``) on the jobs network. The built-in ``pipeline`` kind fetches
only http(s) feeds, and its job container must reach the feed; the service adds nothing to the supervisor's side.

What it proves: the supervisor in its container answers ``/api/health`` with exec_mode docker; a ``pipeline`` job
enqueued over the API runs as a sibling container (the engine's own events: a container labelled with the job's id,
the one the row records, connected to the stack's jobs network); it heartbeats back (progress 3/3 and a heartbeat on
the row) — a job container on that bridge network has no way to the supervisor but ``http://supervisor:8000``, the
service name the compose file gives it; it writes the corpus into the shared volume (read back from inside the
supervisor's container) and ends ``succeeded``; the chained ``enrichment`` job runs over that corpus and succeeds;
the supervisor removes its job containers; and ``down -v`` plus the removal of leftover job containers (by the
``ps.job_id`` label on the stack's network, and by the boot's ``ps.boot_id``) leaves no container, network or volume
behind. The fixture tears the stack down the same way when the test fails.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from compose_helpers import ComposeProject, needs  # type: ignore[import-not-found]

from pipeline_runner import episode_key
from supervisor.execution.docker import LABEL_JOB

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "compose" / "docker-compose.yml"
IMAGE = "podcast-job-supervisor:local"
EPISODES = 3
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "stale"})


def _rss(feed_base: str) -> bytes:
    items = "".join(
        f"<item><title>Episode g{i}</title><guid>g{i}</guid>"
        f'<enclosure url="{feed_base}/a{i}" type="audio/mpeg" length="0"/>'
        "<itunes:duration>1:00</itunes:duration></item>"
        for i in range(EPISODES)
    )
    return (
        '<?xml version="1.0"?><rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd">'
        f"<channel><title>Compose feed</title>{items}</channel></rss>"
    ).encode()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[ComposeProject]:
    missing = "no docker-compose command (scripts/docker-engine.sh up installs it)"
    needs(None if shutil.which("docker-compose") else missing)
    project = f"pstest{secrets.token_hex(4)}"
    feed_dir = tmp_path / "feed"
    feed_dir.mkdir()
    (feed_dir / "feed.xml").write_bytes(_rss("http://feed:8080"))
    for i in range(EPISODES):
        (feed_dir / f"a{i}").write_bytes(b"A" * 2000)
    override = {
        "version": "3.8",
        "services": {
            "feed": {
                "image": IMAGE,
                "command": ["python3", "-m", "http.server", "8080", "--directory", "/feed"],
                "init": True,  # a Python PID 1 ignores SIGTERM: `down` would wait its full timeout
                "volumes": [f"{feed_dir}:/feed:ro"],
                "networks": ["jobs"],
            }
        },
    }
    override_file = tmp_path / "feed-override.yml"
    override_file.write_text(json.dumps(override, indent=2))  # JSON is YAML
    token = secrets.token_hex(32)
    env = {
        **os.environ,
        "PODCAST_JOB_API_TOKEN": token,
        "PODCAST_JOB_MAX_CONCURRENT": "1",
        "PODCAST_JOBS_NETWORK": f"{project}_jobs",
        "PODCAST_CORPUS_VOLUME": f"{project}_corpus",
        "PODCAST_BIND": "127.0.0.1:",  # "127.0.0.1::8000": a free host port, chosen by the engine
    }
    s = ComposeProject(project, f"{project}_jobs", [f"{project}_corpus"], [COMPOSE_FILE, override_file], token, env)
    try:
        up = s.run(s.compose_argv("up", "-d", "--no-build"))
        assert up.returncode == 0, f"compose up exited {up.returncode}: {up.stderr}"
        yield s
    finally:
        problems = s.teardown()
        assert not problems, problems


async def _poll_job(client: httpx.AsyncClient, url: str, *, timeout_s: float = 60) -> dict[str, Any]:
    """Poll a job until it is terminal: it runs in another container, there is no event to wait on."""
    with trio.fail_after(timeout_s):
        while (row := (await client.get(url, timeout=10)).json())["status"] not in TERMINAL:  # noqa: ASYNC110
            await trio.sleep(0.1)
        return row  # type: ignore[no-any-return]


async def test_the_local_compose_stack_runs_a_pipeline_job_as_a_sibling_container_end_to_end(
    stack: ComposeProject,
) -> None:
    published = (await stack.cli(stack.compose_argv("port", "supervisor", "8000"))).strip()
    assert published.startswith("127.0.0.1:"), published  # loopback only, as the file says
    base = f"http://{published}"
    headers = {"Authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as client:
        # The container is up; the server in it answers once it has opened its registry.
        with trio.fail_after(30):
            while True:
                try:
                    health = await client.get("/api/health", timeout=5)
                    if health.status_code == 200:
                        break
                except httpx.TransportError:
                    pass  # not listening yet
                await trio.sleep(0.1)
        assert health.json()["exec_mode"] == "docker", health.json()
        stack.boot_ids.add(health.json()["boot_id"])

        answer = await client.post(
            "/api/jobs",
            json={"kind": "pipeline", "params": {"feed": "http://feed:8080/feed.xml", "max_episodes": EPISODES}},
            timeout=10,
        )
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job_id"]
        job = await _poll_job(client, f"/api/jobs/{job_id}")
        log = (await client.get(f"/api/jobs/{job_id}/log", timeout=10)).text
        assert (job["status"], job["error_reason"], job["exit_code"]) == ("succeeded", None, 0), log
        # Heartbeats reached the supervisor from the job container, by the service name (the only way there).
        assert (job["completed_units"], job["total_units"]) == (EPISODES, EPISODES)
        assert job["last_heartbeat_at"] is not None and job["last_progress_at"] is not None
        assert job["pid"] is None and job["container_id"], job  # a container, never a pid

        # A sibling container on the same engine: the engine started a container labelled with the job's id (the
        # row's container), and connected it to this stack's jobs network.
        until = f"{time.time():.6f}"
        events = ["docker", "events", "--since", f"{stack.since:.6f}", "--until", until]
        started = await stack.cli([*events, "--filter", "type=container", "--filter", "event=start",
             "--filter", f"label={LABEL_JOB}={job_id}", "--format", "{{.Actor.ID}}"],
        )
        assert started.split() == [job["container_id"]], started
        connected = await stack.cli([*events, "--filter", "type=network", "--filter", "event=connect",
             "--filter", f"network={stack.network}", "--format", "{{.Actor.Attributes.container}}"],
        )
        assert job["container_id"] in connected.split(), connected

        # It wrote the corpus into the shared volume: the supervisor's container sees it at /data.
        listing = await stack.cli(stack.compose_argv(
                "exec", "-T", "supervisor", "python3", "-c",
                "import glob; print('\\n'.join(glob.glob('/data/corpus/episodes/*/COMPLETE')))",
            ),
        )
        keys = {Path(line).parent.name for line in listing.split()}
        assert keys == {episode_key(f"g{i}") for i in range(EPISODES)}, listing

        # The chained enrichment job runs over that corpus, in its own container, and succeeds.
        with trio.fail_after(30):
            while not (listed := (await client.get("/api/jobs?kind=enrichment", timeout=10)).json()["jobs"]):  # noqa: ASYNC110
                await trio.sleep(0.1)
        enrichment = await _poll_job(client, f"/api/jobs/{listed[0]['job_id']}")
        assert enrichment["status"] == "succeeded", enrichment

        # The supervisor removes a job's container once its row is final (it only lingers for that moment).
        with trio.fail_after(15):
            while await stack.cli(["docker", "ps", "-aq", "--filter", f"label={LABEL_JOB}={job_id}"]):  # noqa: ASYNC110
                await trio.sleep(0.1)

    # Torn down: no container, network or volume of this stack is left (the fixture repeats this, idempotently,
    # when the test fails before here).
    assert await trio.to_thread.run_sync(stack.teardown) == []
    assert await trio.to_thread.run_sync(stack.leftovers) == []
