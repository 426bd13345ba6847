"""A key names a request once, against a real ``supervisor serve`` and the CLI as processes: a schedule's tick key
is checked where the CLI reads it (docs/operations.md, "Periodic runs"), and a bulk retry repeated after a kinds
file changed answers what its keys answered the first time (INV-KEY-ONCE)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from api_support import kinds_toml
from test_cli_live import REPO_ROOT, Server, cli, free_port

from supervisor.cli import EXIT_OK, EXIT_USAGE

pytestmark = pytest.mark.e2e

EXIT_WITH = ["{python}", "-c", "import sys; sys.exit(int(sys.argv[1]))"]
CODED = {"argv": [*EXIT_WITH, "{code}"], "params": {"code": "int"}}
# The same kind after a deploy renamed its param: a job made with ``code`` no longer validates.
RENAMED = {"argv": [*EXIT_WITH, "{status}"], "params": {"status": "int"}}


def _server(tmp_path: Path, kinds: dict[str, dict[str, Any]]) -> Server:
    (tmp_path / "kinds.toml").write_text(kinds_toml(kinds))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND=f"127.0.0.1:{port}",
        PODCAST_JOB_URL=f"http://127.0.0.1:{port}",
        PODCAST_JOB_KINDS_FILE=str(tmp_path / "kinds.toml"),
    )
    return Server(f"http://127.0.0.1:{port}", env, tmp_path)


async def test_schedule_arguments_are_checked_in_one_place_and_a_year_one_key_is_zero_padded(tmp_path: Path) -> None:
    server = _server(tmp_path, {"coded": CODED})
    await server.start()
    try:
        # A period that began in year 0, a tick past the calendar's end in UTC, a period past the bound: each one
        # line, exit 2, nothing sent.
        for every, tick, named in [
            ("400d", "0001-01-01T00:00:00+00:00", "tick"),
            ("1h", "9999-12-31T23:59:59-01:00", "tick"),
            ("1d", "0001-01-01T00:00:00+01:00", "tick"),
            ("999999d", "2026-12-07T02:00:00Z", "period"),
            ("1h", "2026-12-07T02:00:00", "offset"),
        ]:
            done = await cli(server, "enqueue", "coded", "-p", "code=0", "--schedule", "t", "--every", every,
                             "--tick", tick)  # fmt: skip
            lines = done.stderr.splitlines()
            assert done.returncode == EXIT_USAGE, (every, tick, done.stderr)
            assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
            assert "Traceback" not in done.stderr and done.stdout == ""
        assert (await server.get("/api/jobs"))["jobs"] == []
        # Year 1 itself, a day's period: a tick of the calendar, its key ISO 8601 with four digits of year.
        done = await cli(server, "enqueue", "coded", "-p", "code=0", "--schedule", "t", "--every", "1d",
                         "--tick", "0001-01-01T05:00:00Z", "--json")  # fmt: skip
        assert done.returncode == EXIT_OK, done.stderr
        job = await server.get(f"/api/jobs/{json.loads(done.stdout)['job_id']}")
        assert job["idempotency_key"] == "schedule/t/0001-01-01T00:00:00Z"
        await server.until(job["job_id"], lambda row: row["status"] == "succeeded")
    finally:
        await server.stop()


async def test_a_bulk_retry_repeated_after_a_kinds_change_answers_the_retries_it_made(tmp_path: Path) -> None:
    server = _server(tmp_path, {"coded": CODED})
    await server.start()
    try:
        failed = [await server.enqueue("coded", code=3) for _ in range(3)]
        for job_id in failed:
            await server.until(job_id, lambda row: row["status"] == "failed")
        dry = await cli(server, "retry", "--all", "--kind", "coded", "--status", "failed", "--dry-run", "--json")
        assert dry.returncode == EXIT_OK, dry.stderr
        selection = json.loads(dry.stdout)["selection"]
        first = await server.post("/api/jobs/bulk", {"action": "retry", "selection": selection})
        assert first["outcomes"] == {"retried": 3} and sorted(first["new_job_ids"]) == sorted(failed)
        for job_id in first["new_job_ids"].values():
            await server.until(job_id, lambda row: row["status"] == "failed")
    finally:
        await server.stop()
    # A deploy renames the kind's param, and the supervisor starts again.
    (tmp_path / "kinds.toml").write_text(kinds_toml({"coded": RENAMED}))
    await server.start()
    try:
        again = await server.post("/api/jobs/bulk", {"action": "retry", "selection": selection})
        assert again["outcomes"] == {"retried": 3}, again["results"]
        assert again["new_job_ids"] == first["new_job_ids"]  # the retries the first act made, none new
        rows = (await server.get("/api/jobs?kind=coded&limit=100"))["jobs"]
        assert len(rows) == 6
    finally:
        await server.stop()
