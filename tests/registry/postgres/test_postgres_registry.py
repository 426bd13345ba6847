"""The PostgreSQL registry beyond the contract: its migrations, a cancelled call, its bound on every call and the
fault it reports, a server that is not there, and several registries (several supervisors) on one schema."""

from __future__ import annotations

import logging
import secrets
import tomllib
from datetime import timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest
import trio
from pg_helpers import OpenPg, Raw
from registry_helpers import BOOT, WallClock, enqueue, new_job, new_schema, one_running, postgres_test_url, request
from tcp_proxy import TcpProxy

from supervisor.domain import (
    RELEASE,
    Conflict,
    IdempotencyKey,
    JobStatus,
    RegistryError,
    RegistryUnavailable,
    SchemaNotHonoured,
    fingerprint,
)
from supervisor.registry import Ending, NewJob, Outcome, PostgresRegistry
from supervisor.registry.postgres import SCHEMA_VERSION, migrations

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[3]
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


# -- migrations -----------------------------------------------------------------------------------------------


async def test_each_migration_is_recorded_once_in_order(pg_open: OpenPg, raw: Raw) -> None:
    reg = await pg_open()
    assert reg.schema is not None
    await raw.execute(f'SET search_path = "{reg.schema}"')
    rows = await raw.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
    assert [(r["version"], r["name"]) for r in rows] == [(m.version, m.name) for m in migrations()]
    assert rows[-1]["version"] == SCHEMA_VERSION
    # A second registry on the same schema finds it current and applies nothing again.
    await pg_open(schema=reg.schema)
    assert await raw.fetchval("SELECT COUNT(*) FROM schema_migrations") == len(migrations())


async def test_supervisors_starting_at_once_on_a_fresh_schema_take_turns(pg_open: OpenPg, raw: Raw) -> None:
    schema = new_schema()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(lambda: pg_open(schema=schema))
    await raw.execute(f'SET search_path = "{schema}"')
    assert await raw.fetchval("SELECT COUNT(*) FROM schema_migrations") == len(migrations())


@pytest.mark.parametrize("migrate", [True, False])
async def test_a_schema_a_newer_release_contracted_is_refused(pg_open: OpenPg, raw: Raw, migrate: bool) -> None:
    """INV-CONTRACT-AFTER-FLEET: a contract migration this release does not know was applied: it cannot run."""
    reg = await pg_open()
    await raw.execute(
        f'INSERT INTO "{reg.schema}".schema_migrations (version, name, applied_at, phase) '
        "VALUES ($1, $2, now(), 'contract')",
        SCHEMA_VERSION + 1,
        "9999_future.sql",
    )
    with pytest.raises(SchemaNotHonoured, match=f"contracted by a newer release .migration {SCHEMA_VERSION + 1}"):
        await pg_open(schema=reg.schema, migrate=migrate)


async def test_a_schema_a_newer_release_only_expanded_is_used_as_it_is(pg_open: OpenPg, raw: Raw) -> None:
    reg = await pg_open()
    await raw.execute(f'CREATE TABLE "{reg.schema}".from_the_future (x integer)')
    await raw.execute(
        f'INSERT INTO "{reg.schema}".schema_migrations (version, name, applied_at) VALUES ($1, $2, now())',
        SCHEMA_VERSION + 1,
        "9999_future.sql",
    )
    again = await pg_open(schema=reg.schema)
    assert (await again.enqueue(NewJob("k", {}, ["true"]))).job.status is JobStatus.QUEUED


async def test_without_automatic_migration_an_old_schema_is_refused_until_migrated(pg_open: OpenPg) -> None:
    schema = new_schema()
    refused = r"lacks this release's migrations 0001_jobs.sql, .*: run `supervisor migrate` \(automatic migration is"
    with pytest.raises(RegistryError, match=refused):
        await pg_open(schema=schema, migrate=False)
    await pg_open(schema=schema)  # migrates
    reg = await pg_open(schema=schema, migrate=False)
    assert (await reg.counts())["queued"] == 0


async def test_INV_CONTRACT_AFTER_FLEET_release_1_1_0s_contract_waits_for_every_host_of_1_0_0(
    pg_open: OpenPg, raw: Raw
) -> None:
    """A 1.0.0 schema (migrations to 12) opened by this release gets the expands (13: the column; 14 to 16: the
    indexes, built concurrently and valid), not the contract (17); supervisor migrate refuses it while a host of 1.0.0
    holds a live lease, naming it, and applies it once that host is gone: then a row without its release (1.0.0's
    insert) is refused, and the rows from before say 'before-1.1.0'."""
    reg = await pg_open()
    schema = reg.schema
    await raw.execute(f'SET search_path = "{schema}"')
    # Back to 1.0.0's schema: the three migrations undone.
    await raw.execute("ALTER TABLE jobs DROP COLUMN enqueued_release")  # its index and NOT NULL go with it
    await raw.execute("DROP INDEX jobs_queued_seq")
    await raw.execute("DELETE FROM schema_migrations WHERE version IN (13, 14, 15, 16, 17)")
    await raw.execute("INSERT INTO jobs (job_id, kind, params, argv, status, created_at) VALUES "
                      "('old', 'k', '{}', '[]', 'succeeded', now())")  # fmt: skip
    await raw.execute("INSERT INTO hosts VALUES ('old-host', 'b', now(), now(), now() + interval '1 hour', '1.0.0', 0)")
    again = await pg_open(schema=schema)
    phases = await raw.fetch("SELECT version, phase FROM schema_migrations WHERE version >= 12 ORDER BY version")
    assert [(r["version"], r["phase"]) for r in phases] == [(v, "expand") for v in (12, 13, 14, 15, 16)]
    for index in ("jobs_host", "jobs_queued_seq"):
        assert await raw.fetchval(f"SELECT indisvalid FROM pg_index WHERE indexrelid = '{index}'::regclass")
    with pytest.raises(RegistryError, match=r"0017_enqueued_release_required.sql .* held back by old-host \(release 1"):
        await again.migrate(contracts=True)
    await raw.execute("UPDATE hosts SET lease_expires_at = now() WHERE host_id = 'old-host'")  # stopped
    assert await again.migrate(contracts=True) == SCHEMA_VERSION
    assert await raw.fetchval("SELECT enqueued_release FROM jobs WHERE job_id = 'old'") == "before-1.1.0"
    with pytest.raises(asyncpg.NotNullViolationError):
        await raw.execute("INSERT INTO jobs (job_id, kind, params, argv, status, created_at) VALUES "
                          "('x', 'k', '{}', '[]', 'queued', now())")  # fmt: skip
    added = await again.enqueue(NewJob("k", {}, ["true"]))
    assert await raw.fetchval(f"SELECT enqueued_release FROM jobs WHERE job_id = '{added.job.job_id}'") == RELEASE


def test_the_migrations_ship_with_the_package() -> None:
    with (REPO / "pyproject.toml").open("rb") as fh:
        data = tomllib.load(fh)
    assert data["tool"]["setuptools"]["package-data"]["supervisor.registry.postgres"] == ["migrations/*.sql"]
    # Each number once, in order; one may be missing (another branch's, applied where it is missing when merged).
    versions = [m.version for m in migrations()]
    assert versions == sorted(set(versions)) and versions[:8] == list(range(1, 9)) and versions[-1] == SCHEMA_VERSION


# -- cancellation, bounds, faults -----------------------------------------------------------------------------


async def _lock_row(raw: Raw, schema: str, job_id: str) -> None:
    """Another client takes the row's lock and keeps its transaction open: a write of that row waits for it."""
    await raw.execute("BEGIN")
    await raw.execute(f'SELECT 1 FROM "{schema}".jobs WHERE job_id = $1 FOR UPDATE', job_id)


async def _sessions_in_transaction(raw: Raw) -> int:
    """The registry's sessions on the server that hold a transaction open (any test's: they run one at a time)."""
    return int(
        await raw.fetchval(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'podcast-job-supervisor' "
            "AND datname = current_database() AND xact_start IS NOT NULL"
        )
    )


async def test_a_cancelled_call_leaves_no_transaction_open_and_no_connection_checked_out(
    pg_open: OpenPg, raw: Raw
) -> None:
    # One connection: a call whose connection stayed checked out would make the next one wait out its timeout.
    reg = await pg_open(max_connections=1, timeout_s=5.0)
    assert reg.schema is not None
    job = await one_running(reg)
    await _lock_row(raw, reg.schema, job.job_id)
    with trio.move_on_after(0.3) as waited:
        await reg.finalize(job.job_id, SUCCEEDED)  # waits on the row lock, inside its transaction
    assert waited.cancelled_caught
    await raw.execute("ROLLBACK")
    with trio.fail_after(2):
        assert (await reg.get(job.job_id)).status is JobStatus.RUNNING  # the cancelled write never committed
    # The closed session's transaction ends on the server too: the server's own state, looked at until it does.
    for _ in range(100):
        if not await _sessions_in_transaction(raw):
            break
        await trio.sleep(0.02)
    else:
        pytest.fail("the cancelled call's transaction is still open on the server")
    with trio.fail_after(2):
        change = await reg.finalize(job.job_id, SUCCEEDED)
    assert change.changed and change.job.status is JobStatus.SUCCEEDED


async def test_a_call_that_outlives_its_bound_is_unavailable_and_a_fault_until_a_write_succeeds(
    pg_open: OpenPg, raw: Raw
) -> None:
    reg = await pg_open(timeout_s=0.4)
    assert reg.schema is not None
    job = await one_running(reg)
    assert reg.fault() is None
    await _lock_row(raw, reg.schema, job.job_id)
    with trio.fail_after(3), pytest.raises(RegistryUnavailable, match=r"no answer within 0\.4 s"):
        await reg.finalize(job.job_id, SUCCEEDED)
    fault = reg.fault()
    assert fault is not None and fault.failed_writes == 1 and "no answer within" in fault.reason
    # Reads still answer meanwhile (the lock holds writers of that row only), and a read never clears a fault.
    assert (await reg.get(job.job_id)).status is JobStatus.RUNNING
    assert reg.fault() is not None
    await raw.execute("ROLLBACK")
    change = await reg.finalize(job.job_id, SUCCEEDED)
    assert change.changed
    assert reg.fault() is None


async def test_a_server_that_is_not_there_is_unavailable_not_a_hang() -> None:
    async with PostgresRegistry.runtime():
        with trio.fail_after(10), pytest.raises(RegistryUnavailable, match="cannot connect to registry"):
            # Port 1 on loopback: nothing listens there, the connection is refused at once.
            await PostgresRegistry.open("postgresql://postgres@127.0.0.1:1/none", timeout_s=2.0)


async def test_a_closed_session_is_unavailable_once_and_the_pool_connects_again(pg_open: OpenPg, raw: Raw) -> None:
    # A name of its own: only this registry's session is ended, never those of other runs sharing the server.
    name = f"podcast-job-supervisor-test-{secrets.token_hex(6)}"
    reg = await pg_open(max_connections=1, application_name=name)
    [job_id] = await enqueue(reg, 1)
    # The server ends the registry's session (an administrator, a restart, a failover).
    ended = await raw.fetch(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 "
        "AND datname = current_database()",
        name,
    )
    assert len(ended) == 1  # its one pooled session
    with trio.fail_after(5):
        try:
            await reg.get(job_id)
        except RegistryUnavailable:
            pass  # the dead connection is found by the call that uses it, and replaced
        assert (await reg.get(job_id)).job_id == job_id


class ServerGoesAway(TcpProxy):
    """A TCP proxy in front of the test server. ``away()`` is the server stopping: every connection through it is
    closed and new ones are closed as soon as they are accepted (no PostgreSQL answers); ``back()`` forwards again."""

    here = True

    def away(self) -> None:
        self.here = False
        self.drop_all()

    def back(self) -> None:
        self.here = True

    async def admit(self) -> bool:
        return self.here


async def test_a_server_that_goes_away_is_unavailable_and_nothing_reconnects_behind_the_calls_back(
    pg_open: OpenPg, clock: WallClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by the PostgreSQL restart test (ADR 0012): asyncpg's pool kept a floor of one connection by reconnecting
    # in a task of its own while the server was down, outside every call's bound, and logged each failed attempt
    # with a traceback through the standard logging -- lines that are not the supervisor's JSON.
    database = httpx.URL(postgres_test_url() or "")
    proxy = ServerGoesAway(database.host, database.port or 5432)
    caplog.set_level(logging.DEBUG, logger="asyncpg")
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        dsn = str(database.copy_with(port=proxy.port))
        reg = await PostgresRegistry.open(dsn, schema=new_schema(), clock=clock, boot_id=BOOT, timeout_s=2.0)
        try:
            [job_id] = await enqueue(reg, 1)
            proxy.away()
            with trio.fail_after(10):
                for _ in range(5):  # the session lost, then each connect refused: each call says so, at once
                    with pytest.raises(RegistryUnavailable):
                        await reg.get(job_id)
            proxy.back()
            with trio.fail_after(10):
                assert (await reg.get(job_id)).job_id == job_id  # the next call connects again
        finally:
            await reg.aclose()
        nursery.cancel_scope.cancel()
    assert [r for r in caplog.records if r.name.startswith("asyncpg")] == []


def test_the_registry_refuses_what_is_no_postgresql_url_or_bound() -> None:
    with pytest.raises(ValueError, match="postgresql:// URL"):
        PostgresRegistry("sqlite:///x")
    with pytest.raises(ValueError, match="timeout_s"):
        PostgresRegistry("postgresql://h/db", timeout_s=float("nan"))
    with pytest.raises(ValueError, match="at least one connection"):
        PostgresRegistry("postgresql://h/db", max_connections=0)


def test_a_password_never_shows_in_what_the_registry_says_where_it_is() -> None:
    reg = PostgresRegistry("postgresql://app:s3cret@db.example:5432/jobs")
    assert "s3cret" not in reg.where and "app:***@db.example:5432" in reg.where


# -- several supervisors on one schema ------------------------------------------------------------------------


@pytest.mark.parametrize("pooled", [False, pytest.param(True, marks=pytest.mark.pgbouncer, id="pgbouncer")])
async def test_promotions_from_several_registries_never_overshoot_INV_PROMOTION_NEVER_OVERSHOOTS(
    pg_open: OpenPg, pooled: bool
) -> None:
    """``pgbouncer``: through a pooler in transaction mode, where each transaction meets any server session: the
    advisory lock is the transaction's, so the bound holds the same."""
    first = await pg_open(pooled=pooled)
    others = [await pg_open(pooled=pooled, schema=first.schema, boot_id=f"boot-{i}") for i in range(2)]
    await enqueue(first, 30)
    promoted: list[str] = []

    async def promote(reg: PostgresRegistry, n: int) -> None:
        promotion = await reg.promote(request(3, *[f"t{n}-{i}" for i in range(3)], boot_id=BOOT))
        promoted.extend(j.job_id for j in promotion.jobs)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for n in range(24):
                nursery.start_soon(promote, [first, *others][n % 3], n)
    assert len(promoted) == len(set(promoted)) == 3
    assert (await first.counts())["running"] == 3


async def test_a_key_enqueued_by_several_registries_at_once_makes_one_queued_row(pg_open: OpenPg) -> None:
    first = await pg_open()
    regs = [first, *[await pg_open(schema=first.schema) for _ in range(2)]]
    ids: list[str] = []

    async def enqueue_key(n: int) -> None:
        result = await regs[n % 3].enqueue(new_job(n, key="same-key"))
        ids.append(result.job.job_id)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(enqueue_key, n)
    assert len(set(ids)) == 1
    assert (await first.counts())["queued"] == 1


async def test_INV_KEY_ONCE_one_idempotency_key_sent_to_several_hosts_at_once_makes_one_row(pg_open: OpenPg) -> None:
    """INV-KEY-ONCE fleet-wide: three registries on one schema (three hosts), twelve requests with one key at once (a
    client that switches host at each retry). One row; every answer names it; the key's lock makes the others wait
    for the first transaction and replay it."""
    first = await pg_open()
    regs = [first, *[await pg_open(schema=first.schema) for _ in range(2)]]
    job = new_job(1)
    key = IdempotencyKey("fleet-key", fingerprint("enqueue", [(job.kind, job.params)]), 3600.0)
    answers: list[tuple[str, bool]] = []

    async def send(n: int) -> None:
        result = await regs[n % 3].enqueue(job, key=key)
        answers.append((result.receipt.job_id, result.replayed is None))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(send, n)
    assert len({job_id for job_id, _ in answers}) == 1
    assert sum(made for _, made in answers) == 1
    assert sum((await first.counts()).values()) == 1


async def test_INV_LEASE_ON_REGISTRY_CLOCK_hosts_whose_clocks_disagree_by_hours_agree_on_whose_lease_holds(
    pg_open: OpenPg, raw: Raw
) -> None:
    """Two supervisors whose own clocks are two hours apart, leases on the server's clock (production's default).
    Judged by each host's clock, the fast host would find the slow one's fresh lease long expired: it would take the
    lead from a live leader and could forget a live host. Judged by the server's, neither happens, and the lead
    passes only once the holder's lease has run out there."""
    server_now = await raw.fetchval("SELECT clock_timestamp()")
    slow = await pg_open(clock=lambda: server_now - timedelta(hours=1), lease_clock=None)
    fast = await pg_open(schema=slow.schema, clock=lambda: server_now + timedelta(hours=1), lease_clock=None)
    a = await slow.renew_lease("a", "boot-a", lease_s=15.0, lead=True)
    assert a.leading
    # Counted from the server's clock, not the slow host's hour-old one.
    assert abs((a.host.last_seen_at - server_now).total_seconds()) < 60
    assert a.host.lease_expires_at - a.host.last_seen_at == timedelta(seconds=15)
    b = await fast.renew_lease("b", "boot-b", lease_s=15.0, lead=True)
    assert not b.leading and b.leader is not None and (b.leader.host_id, b.leader.live) == ("a", True)
    assert {h.host_id: h.live for h in await fast.hosts()} == {"a": True, "b": True}
    with pytest.raises(Conflict, match="live lease"):
        await fast.forget_host("a")
    # A short lease that runs out at the server's clock: the lead passes then, and not before.
    a = await slow.renew_lease("a", "boot-a", lease_s=0.2, lead=True)
    assert a.leading

    with trio.fail_after(10):
        # Time must pass on the server's clock: there is no event to wait on.
        while not (b := await fast.renew_lease("b", "boot-b", lease_s=15.0, lead=True)).leading:  # noqa: ASYNC110
            await trio.sleep(0.02)
    assert b.leader is not None and b.leader.started_at >= a.host.lease_expires_at
