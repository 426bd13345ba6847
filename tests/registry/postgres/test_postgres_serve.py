"""``supervisor serve`` and ``supervisor migrate`` on PostgreSQL (``PODCAST_JOB_DATABASE_URL``), as real processes:
a job runs to ``succeeded`` and its row is in the database, not in a SQLite file; ``migrate`` migrates."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import trio
import trio_asyncio
from pg_helpers import free_port, sql
from registry_helpers import postgres_test_url
from serve_process import serve_process, stop  # type: ignore[import-not-found]

from supervisor.registry.postgres import SCHEMA_VERSION, migrations

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[3]
LIMIT_S = 30.0  # a backstop for a broken server, never a timing assertion


async def test_serve_on_postgresql_runs_a_job_to_succeeded(tmp_path: Path) -> None:
    dsn = postgres_test_url()
    assert dsn is not None
    schema = f"test_serve_{uuid.uuid4().hex[:16]}"
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(f'[kinds.ok]\nargv = ["{sys.executable}", "-c", "print(42)"]\nparams = {{ }}\n')
    url = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND=url.removeprefix("http://"),
        PODCAST_JOB_KINDS_FILE=str(kinds),
        # The schema goes in the URL, as an operator may put it (asyncpg passes search_path to the server).
        PODCAST_JOB_DATABASE_URL=f"{dsn}?search_path={schema}",
    )
    async with trio_asyncio.open_loop():
        await trio_asyncio.aio_as_trio(sql)(f'CREATE SCHEMA "{schema}"')
        try:
            async with serve_process(env, tmp_path, tmp_path / "serve.log") as process:
                async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                    with trio.fail_after(LIMIT_S):
                        while True:
                            try:
                                if (await client.get("/api/health", timeout=5.0)).status_code == 200:
                                    break
                            except httpx.ConnectError:
                                pass
                            await trio.sleep(0.05)  # polling for the server to come up, under the deadline above
                        answer = await client.post("/api/jobs", json={"kind": "ok", "params": {}}, timeout=5.0)
                        assert answer.status_code == 202, answer.text
                        job_id = answer.json()["job_id"]
                        while True:
                            job = (await client.get(f"/api/jobs/{job_id}", timeout=5.0)).json()
                            if job["status"] not in ("queued", "running"):
                                break
                            await trio.sleep(0.05)  # polling for the job's end, under the deadline above
                assert (job["status"], job["exit_code"]) == ("succeeded", 0), job
                assert await stop(process, LIMIT_S) == 0
            rows = await trio_asyncio.aio_as_trio(sql)(f'SELECT job_id, status FROM "{schema}".jobs')
            assert [(r["job_id"], r["status"]) for r in rows] == [(job_id, "succeeded")]
            assert not (tmp_path / "data" / ".viewer" / "jobs.sqlite3").exists()
        finally:
            with trio.CancelScope(shield=True):
                await trio_asyncio.aio_as_trio(sql)(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def _supervisor_cli(verb: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """``supervisor VERB`` in a process of its own, its output captured, within the test's bound."""
    with trio.fail_after(LIMIT_S):
        return await trio.run_process(
            [sys.executable, "-m", "supervisor", verb],
            env=env,
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def test_supervisor_migrate_brings_a_fresh_schema_up_to_date_and_says_so(tmp_path: Path) -> None:
    dsn = postgres_test_url()
    assert dsn is not None
    schema = f"test_migrate_{uuid.uuid4().hex[:16]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_DATABASE_URL=f"{dsn}?search_path={schema}",
        PODCAST_JOB_DATABASE_AUTO_MIGRATE="false",  # migrate migrates whatever this says
    )
    async with trio_asyncio.open_loop():
        await trio_asyncio.aio_as_trio(sql)(f'CREATE SCHEMA "{schema}"')
        try:
            for _ in range(2):  # the second finds nothing to do
                done = await _supervisor_cli("migrate", env, tmp_path)
                assert done.returncode == 0, done.stderr
                assert done.stdout.decode().strip().endswith(f"schema version {SCHEMA_VERSION}")
            rows = await trio_asyncio.aio_as_trio(sql)(f'SELECT version FROM "{schema}".schema_migrations')
            assert sorted(r["version"] for r in rows) == [m.version for m in migrations()]
        finally:
            with trio.CancelScope(shield=True):
                await trio_asyncio.aio_as_trio(sql)(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize("case", ["unreachable", "wrong_credentials", "newer"])
async def test_a_database_that_cannot_be_opened_ends_serve_in_one_line_with_exit_3(tmp_path: Path, case: str) -> None:
    """Unreachable, refused credentials, or a schema a newer supervisor migrated (a downgrade)."""
    dsn = postgres_test_url()
    assert dsn is not None
    schema = f"test_open_{uuid.uuid4().hex[:16]}"
    url = {
        "unreachable": f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere",
        "wrong_credentials": dsn.replace("postgres@", "nobody_here@", 1),
        "newer": f"{dsn}?search_path={schema}",
    }[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND="127.0.0.1:0",
        PODCAST_JOB_DATABASE_URL=url,
        PODCAST_JOB_DATABASE_TIMEOUT_SECONDS="3",
    )
    async with trio_asyncio.open_loop():
        if case == "newer":
            await trio_asyncio.aio_as_trio(sql)(f'CREATE SCHEMA "{schema}"')
            await trio_asyncio.aio_as_trio(sql)(
                f'CREATE TABLE "{schema}".schema_migrations '
                "(version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL, phase text)"
            )
            # A newer release's contract (docs/fleet.md § Upgrading a fleet): its own exit code, 5.
            future = f"({SCHEMA_VERSION + 1}, 'from_the_future.sql', now(), 'contract')"
            await trio_asyncio.aio_as_trio(sql)(f'INSERT INTO "{schema}".schema_migrations VALUES {future}')
        try:
            done = await _supervisor_cli("serve", env, tmp_path)
            lines = done.stderr.decode().splitlines()
            assert done.returncode == (5 if case == "newer" else 3), done.stderr
            assert len(lines) == 1 and lines[0].startswith("error: "), lines
            said = {
                "unreachable": "cannot connect to registry",
                "wrong_credentials": "nobody_here",
                "newer": "contracted by a newer release",
            }
            assert said[case] in lines[0]
            if case == "newer":  # untouched: no migration ran over it
                rows = await trio_asyncio.aio_as_trio(sql)(f'SELECT version FROM "{schema}".schema_migrations')
                assert [r["version"] for r in rows] == [SCHEMA_VERSION + 1]
        finally:
            if case == "newer":
                with trio.CancelScope(shield=True):
                    await trio_asyncio.aio_as_trio(sql)(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
