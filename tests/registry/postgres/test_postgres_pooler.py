"""The PostgreSQL registry behind pgbouncer in transaction mode (``PODCAST_JOB_DATABASE_POOLER=transaction``;
``scripts/pgbouncer.sh up``, a pool of a few server sessions that every client's transactions share and swap).

The contract suite runs through it too (the ``pgbouncer`` backend of ``registry_helpers.BACKENDS``). Here: what
only a pooler shows. Without the setting, its refusal of the settings a connection starts with is an error that names
the setting; with it, each transaction runs on its own settings (the schema, the idle-in-transaction bound) whatever
server session it gets (promotions never overshoot through it: ``test_postgres_registry.py``), and two real
supervisors make a fleet through it: every job run once, one leader, nothing but JSON lines in their logs. There a
LISTEN needs a session of its own straight to PostgreSQL (``PODCAST_JOB_DATABASE_LISTEN_URL``), or none is made
(the sweeps move the fleet)."""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import trio
import trio_asyncio
from pg_helpers import OpenPg, free_port, sql
from registry_helpers import new_job, pooler_test_url, postgres_test_url

from supervisor.domain import RegistryError
from supervisor.registry import WAKE_QUEUED, PostgresRegistry, Wakeup

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer]

REPO_ROOT = Path(__file__).resolve().parents[3]
LIMIT_S = 60.0  # a backstop for a broken server, never a timing assertion


async def test_without_the_setting_a_poolers_refusal_is_an_error_that_names_the_setting() -> None:
    dsn = pooler_test_url()
    assert dsn is not None
    async with PostgresRegistry.runtime():
        with pytest.raises(RegistryError) as refused:
            await PostgresRegistry.open(dsn, timeout_s=10.0)
    assert "unsupported startup parameter" in str(refused.value)
    assert "PODCAST_JOB_DATABASE_POOLER=transaction" in str(refused.value)


async def test_each_transaction_through_the_pooler_runs_on_its_own_settings_whatever_session_it_gets(
    pg_open: OpenPg,
) -> None:
    dsn = pooler_test_url()
    assert dsn is not None
    reg = await pg_open(pooled=True, timeout_s=3.0, max_connections=8)
    assert reg.schema is not None
    query = "SELECT current_schema(), current_setting('idle_in_transaction_session_timeout'), pg_backend_pid()"

    async def seen(conn: Any) -> tuple[str, str, int]:
        row = await conn.fetchrow(query)
        # Held a moment: the transactions overlap for real, so the pooler serves them on several server sessions.
        await conn.execute("SELECT pg_sleep(0.05)")
        return row[0], row[1], row[2]

    found: list[tuple[str, str, int]] = []

    async def one() -> None:
        found.append(await reg.backend.read(lambda store: seen(store.conn)))

    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            for _ in range(40):
                nursery.start_soon(one)
    assert {(schema, timeout) for schema, timeout, _ in found} == {(reg.schema, "3s")}
    assert len({pid for _, _, pid in found}) > 1  # more than one server session served this one registry
    # Nothing leaks past the transaction: a plain session through the pooler keeps the server's own defaults.
    conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(dsn, timeout=10, statement_cache_size=0)
    try:
        plain = await trio_asyncio.aio_as_trio(conn.fetchrow)(query)
    finally:
        await trio_asyncio.aio_as_trio(conn.close)()
    assert (plain[0], plain[1]) == ("public", "0")


async def test_behind_the_pooler_wake_ups_are_heard_on_a_listen_url_of_their_own_and_none_without_one(
    pg_open: OpenPg,
) -> None:
    """A NOTIFY sent by a transaction through the pooler is the server's, delivered at commit to every session that
    listens: one opened straight to PostgreSQL (``PODCAST_JOB_DATABASE_LISTEN_URL``) hears another host's enqueue."""
    direct = postgres_test_url()
    assert direct is not None
    deaf = await pg_open(pooled=True)
    async with deaf.listen() as nothing:
        assert nothing is None  # no session of its own through the pooler: the sweeps move the fleet
    hearing = await pg_open(pooled=True, schema=deaf.schema, listen_dsn=direct)
    other_host = await pg_open(pooled=True, schema=deaf.schema, boot_id="boot-other")
    with trio.fail_after(LIMIT_S):
        async with hearing.listen() as feed:
            assert feed is not None
            await feed.check()  # it listens, on the server itself
            await other_host.enqueue(new_job())
            assert await feed.receive() == Wakeup(WAKE_QUEUED)


# -- two supervisors through the pooler ------------------------------------------------------------------------


async def test_two_supervisors_through_a_transaction_pooler_run_every_job_once_with_one_leader(tmp_path: Path) -> None:
    dsn = pooler_test_url()
    assert dsn is not None
    schema = f"test_pooled_{uuid.uuid4().hex[:16]}"
    kinds = tmp_path / "kinds.toml"
    journal = tmp_path / "journal"
    kinds.write_text(
        "[kinds.note]\n"
        f'argv = ["{sys.executable}", "-c", "import sys; open(sys.argv[1], \'a\').write(sys.argv[2] + chr(10))", '
        f'"{journal}", "{{n}}"]\n'
        'params = { n = "str" }\n'
    )
    hosts: dict[str, tuple[str, trio.Process, Path]] = {}
    async with trio_asyncio.open_loop():
        await trio_asyncio.aio_as_trio(sql)(f'CREATE SCHEMA "{schema}"')
        try:
            for host_id in ("a", "b"):
                url = f"http://127.0.0.1:{free_port()}"
                env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
                env.update(
                    PYTHONPATH=str(REPO_ROOT),
                    PODCAST_JOB_DATA_DIR=str(tmp_path / host_id),
                    PODCAST_JOB_BIND=url.removeprefix("http://"),
                    PODCAST_JOB_KINDS_FILE=str(kinds),
                    PODCAST_JOB_HOST_ID=host_id,
                    PODCAST_JOB_HOST_LEASE_SECONDS="3",
                    PODCAST_JOB_SWEEP_SECONDS="1",
                    PODCAST_JOB_MAX_CONCURRENT="2",
                    # The schema in the URL, as an operator puts it: each transaction sets it behind the pooler.
                    PODCAST_JOB_DATABASE_URL=f"{dsn}?search_path={schema}",
                    PODCAST_JOB_DATABASE_POOLER="transaction",
                )
                if host_id == "b":  # b listens straight at PostgreSQL; a hears nothing (its sweeps)
                    env["PODCAST_JOB_DATABASE_LISTEN_URL"] = str(postgres_test_url())
                log = tmp_path / f"{host_id}.log"
                with log.open("wb") as out:
                    process = await trio.lowlevel.open_process(
                        [sys.executable, "-m", "supervisor", "serve"], env=env, cwd=tmp_path, stdout=out, stderr=out
                    )
                hosts[host_id] = (url, process, log)
            try:
                async with httpx.AsyncClient(timeout=5.0) as client:
                    with trio.fail_after(LIMIT_S):
                        for url, _, _ in hosts.values():
                            await _until_healthy(client, url)
                        urls = [url for url, _, _ in hosts.values()]
                        ids = []
                        for n in range(20):
                            answer = await client.post(
                                f"{urls[n % 2]}/api/jobs", json={"kind": "note", "params": {"n": str(n)}}
                            )
                            assert answer.status_code == 202, answer.text
                            ids.append(answer.json()["job_id"])
                        ends = [await _until_ended(client, urls[n % 2], job_id) for n, job_id in enumerate(ids)]
                        leaders = [(await client.get(f"{url}/api/health")).json()["leader"] for url in urls]
                        listed = (await client.get(f"{urls[0]}/api/hosts")).json()
                assert {(job["status"], job["exit_code"], job["attempts"]) for job in ends} == {("succeeded", 0, 1)}
                assert sorted(journal.read_text().split()) == sorted(str(n) for n in range(20))  # each ran once
                assert sorted(leaders) == [False, True]
                assert sorted((h["host_id"], h["live"]) for h in listed["hosts"]) == [("a", True), ("b", True)]
                for _, process, _ in hosts.values():
                    process.send_signal(signal.SIGTERM)
                with trio.fail_after(LIMIT_S):
                    for _, process, _ in hosts.values():
                        assert await process.wait() == 0
            finally:
                for _, process, _ in hosts.values():
                    if process.returncode is None:
                        process.kill()
                        with trio.CancelScope(shield=True):
                            await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                await trio_asyncio.aio_as_trio(sql)(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    for host_id, (_, _, log) in hosts.items():
        lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line JSON
        [started] = [e for e in lines if e["event"] == "supervisor_started"]
        assert started["database_pooler"] == "transaction"
        assert (started["database_listen"] is not None) == (host_id == "b")
        loud = [e for e in lines if e["level"] in ("warning", "error", "critical")]
        assert loud == [], loud  # b's session never lost; a tried none


async def _until_healthy(client: httpx.AsyncClient, url: str) -> None:
    while True:
        try:
            if (await client.get(f"{url}/api/health")).status_code == 200:
                return
        except httpx.ConnectError:
            pass
        await trio.sleep(0.05)  # polling for the server to come up, under the caller's deadline


async def _until_ended(client: httpx.AsyncClient, url: str, job_id: str) -> dict[str, Any]:
    while True:
        job: dict[str, Any] = (await client.get(f"{url}/api/jobs/{job_id}")).json()
        if job["status"] not in ("queued", "running"):
            return job
        await trio.sleep(0.05)  # polling for a real job's end, under the caller's deadline


async def test_an_index_built_outside_a_transaction_is_refused_through_the_pooler_once_there_are_rows(
    pg_open: OpenPg,
) -> None:
    """A ``-- transaction: none`` migration (CREATE INDEX CONCURRENTLY) cannot run through a pooler in transaction
    mode (a statement outside a transaction has no schema there): on a schema with rows it is refused, naming it and
    what to do; on a new one it was built in the migration's transaction (the schema above opened through it)."""
    reg = await pg_open(pooled=True)
    await reg.enqueue(new_job(0))
    conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(postgres_test_url(), timeout=10)
    try:
        run = trio_asyncio.aio_as_trio(conn.execute)
        await run(f'DROP INDEX "{reg.schema}".jobs_host')
        await run(f'DELETE FROM "{reg.schema}".schema_migrations WHERE version = 14')
    finally:
        await trio_asyncio.aio_as_trio(conn.close)()
    with pytest.raises(RegistryError, match=r"0014_jobs_host_index\.sql runs outside a transaction.*naming PostgreSQL"):
        await pg_open(schema=reg.schema, pooled=True)
    again = await pg_open(schema=reg.schema)  # PostgreSQL itself: built concurrently
    assert (await again.counts())["queued"] == 1
