"""PostgreSQL stopped and restarted under a fleet's load (ADR 0012), end to end.

Two real ``supervisor serve`` hosts on a PRIVATE cluster (``scripts/postgres.sh up`` on a port of its own, never the
shared one the other tests use: this test stops it), leases of 3 s, a database timeout of 1 s. Four gated jobs run,
two on each host (a host cap of 2), and a client enqueues short jobs through both hosts all along. The server is
stopped (``pg_ctl stop -m fast``: every session ended, as an operator's restart does), kept down longer than the
lease, and started again. What is proved:

- while it is down: a write answers 503 with the JSON error and ``Retry-After``, health answers (degraded), no
  supervisor exits, the running jobs run on, and neither host leads once its lease may have expired;
- each host says the fault once (``registry_writes_failing`` ERROR, ``wakeups_lost`` WARNING, ``host_lease_stale``)
  and once that it is over (``registry_writes_recovered``, ``wakeups_back``, ``host_lease_renewed``): no flood;
- once it is back: both hosts renew on new connections and listen again, exactly one leads (INV-ONE-LEADER: never
  two at any sample, all along), the jobs that ended during the outage are recorded ``succeeded`` by their own
  host, new enqueues run; every acknowledged (202) job reaches ``succeeded``, each ran once (the jobs' own journal),
  and both hosts' APIs agree on every row.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from test_core_fleet_postgres import (  # type: ignore[import-not-found]
    Fleet,
    Host,
    alive,
    leaders,
    logged_at,
    open_fleet,
    processes_naming,
    until,
)

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "postgres.sh"
SHARED_PORT = 54329  # the shared cluster's: never this one
LEASE_S = 3.0  # test_core_fleet_postgres's
DATABASE_TIMEOUT_S = 1.0
HOST_CAP = 3  # six gated jobs fill both hosts: three on each, deterministically
FLEET_LIMIT = 2 * HOST_CAP
WORK_S = 0.5  # the client's jobs
ENQUEUE_EVERY_S = 0.3
DOWN_S = LEASE_S + 1.5  # longer than the lease: every lease expires, the leader question arises


# -- a private cluster ---------------------------------------------------------------------------------------------


@dataclass
class Cluster:
    """A cluster made by ``scripts/postgres.sh up`` on a port of its own; ``stop``/``start`` keep its data."""

    work: Path
    port: int
    dsn: str

    def script(self, verb: str) -> str:
        env = dict(os.environ, PG_WORK=str(self.work), PG_PORT=str(self.port))
        done = subprocess.run(
            ["bash", str(SCRIPT), verb], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"postgres.sh {verb}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    def stop(self) -> None:
        self.script("stop")

    def start(self) -> None:
        self.script("start")


def free_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != SHARED_PORT:
            return port


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        problem = "PostgreSQL is not installed (scripts/postgres.sh up installs Debian's postgresql as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {problem}", pytrace=False)
        pytest.skip(problem)
    made = Cluster(Path(tempfile.mkdtemp(prefix="pgstop-", dir="/tmp")), free_port(), "")
    try:
        made.dsn = made.script("up")
        yield made
    finally:
        with contextlib.suppress(AssertionError):
            made.script("down")
        shutil.rmtree(made.work, ignore_errors=True)


# -- the client's load: enqueues through both hosts all along -----------------------------------------------------


@dataclass
class Load:
    acked: dict[str, float] = field(default_factory=dict)  # job id -> when its 202 came
    refused: list[float] = field(default_factory=list)  # when each 503 came

    async def run(self, fleet: Fleet, hosts: list[Host], *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        turn = 0
        while True:
            host = hosts[turn % len(hosts)]
            turn += 1
            answer = await fleet.client.post(
                f"{host.url}/api/jobs", json={"kind": "work", "params": {"seconds": WORK_S}}
            )
            if answer.status_code == 202:
                self.acked[answer.json()["job_id"]] = time.time()
            else:
                assert_unavailable(answer)
                self.refused.append(time.time())
            await trio.sleep(ENQUEUE_EVERY_S)  # the client's pace, not a wait for anything


def assert_unavailable(answer: httpx.Response) -> None:
    """A 503 with the JSON error body and Retry-After: the registry cannot take it now, nothing was changed."""
    assert answer.status_code == 503, (answer.status_code, answer.text)
    assert answer.headers["Retry-After"] == "5", answer.headers
    assert answer.json()["error"]["code"] == "unavailable", answer.text


# -- the test --------------------------------------------------------------------------------------------------------


class SideTasks:
    """The client and the sampler: started in the test's nursery, each in a cancel scope of its own, so that they
    can be stopped while the test goes on (cancelling the nursery would cancel the test's own body too)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.scopes: list[trio.CancelScope] = []

    async def start(self, fn: Any, *args: Any) -> None:
        scope = trio.CancelScope()
        self.scopes.append(scope)

        async def scoped(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await fn(*args, task_status=task_status)

        await self.nursery.start(scoped)

    def stop(self) -> None:
        for scope in self.scopes:
            scope.cancel()


def events_between(host: Host, since: float, until_at: float) -> collections.Counter[tuple[str, str]]:
    """(event, level) -> how many lines ``host`` logged in [since, until_at]."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in host.log.read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if since <= logged_at(entry) <= until_at:
                counts[(entry["event"], entry.get("level", ""))] += 1
    return counts


async def test_INV_ONE_LEADER_postgresql_stopped_and_restarted_under_load(cluster: Cluster, tmp_path: Path) -> None:
    async with open_fleet(tmp_path, cluster.dsn) as fleet:
        # A connection per request: no sample races a server's keep-alive timeout (see the partition test).
        fleet.client = httpx.AsyncClient(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0))
        try:
            async with fleet.client, trio.open_nursery() as background:
                await run_the_outage(fleet, cluster, tmp_path, SideTasks(background))
                background.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(cluster.start)  # a failed test leaves it running (the schema's drop)


async def run_the_outage(fleet: Fleet, cluster: Cluster, tmp_path: Path, background: SideTasks) -> None:
    settings = {
        "PODCAST_JOB_DATABASE_TIMEOUT_SECONDS": str(DATABASE_TIMEOUT_S),
        "PODCAST_JOB_MAX_CONCURRENT": str(FLEET_LIMIT),
        "PODCAST_JOB_HOST_MAX_CONCURRENT": str(HOST_CAP),
    }
    h1 = await fleet.start("h1", env_extra=settings)
    h2 = await fleet.start("h2", env_extra=settings)
    hosts = [h1, h2]
    supervisors = {host.host_id: fleet.supervisor_pids(host) for host in hosts}

    # Never two leaders, sampled all along (each host's own word).
    samples: list[tuple[float, dict[str, bool]]] = []

    async def sample_leaders(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            said = await leaders(fleet, hosts)
            samples.append((time.time(), said))
            assert sum(said.values()) <= 1, f"two leaders at once: {said}"
            await trio.sleep(0.05)

    await background.start(sample_leaders)

    # Six gated jobs: three on each host (its cap). One of each host's ends now (a slot for the client's jobs), one
    # while the database is down, one after it is back.
    gates = tmp_path / "gates"
    gates.mkdir()
    gated = {name: await fleet.enqueue(h1, "journaled_gate", gate=str(gates / name)) for name in "abcdef"}

    async def all_running() -> dict[str, str] | None:
        rows = {name: await fleet.job(h1, job_id) for name, job_id in gated.items()}
        if any(row["status"] != "running" for row in rows.values()):
            return None
        if not all(processes_naming(str(gates / name)) for name in gated):
            return None
        return {name: row["host_id"] for name, row in rows.items()}

    ran_on = await until(all_running, what="the six gated jobs running")
    assert sorted(ran_on.values()) == ["h1"] * HOST_CAP + ["h2"] * HOST_CAP, ran_on
    by_host = {host.host_id: sorted(n for n in gated if ran_on[n] == host.host_id) for host in hosts}
    ends_now = {names[0] for names in by_host.values()}
    ends_down = {names[1] for names in by_host.values()}
    ends_after = set(gated) - ends_now - ends_down
    for name in ends_now:
        (gates / name).touch()

    load = Load()
    await background.start(load.run, fleet, hosts)

    async def some_work_done() -> bool:
        done = [job_id for job_id in list(load.acked) if (await fleet.job(h2, job_id))["status"] == "succeeded"]
        return len(done) >= 2

    await until(some_work_done, what="the client's first jobs to run")

    # -- the stop ---------------------------------------------------------------------------------------------------
    stopped_at = time.time()
    await trio.to_thread.run_sync(cluster.stop)
    acked_before_stop = dict(load.acked)
    down_at = time.time()

    # A write: 503, the JSON error, Retry-After. Health answers (within the client's 5 s: never a hang), degraded.
    for host in hosts:
        answer = await fleet.client.post(f"{host.url}/api/jobs", json={"kind": "work", "params": {"seconds": WORK_S}})
        assert_unavailable(answer)
        health = await fleet.get(host, "/api/health")
        assert health["status"] == "degraded" and "registry_reads" in health["degraded"], health

    # The gated jobs run on; one on each host ends now, while nobody can record it.
    for name in ends_down | ends_after:
        assert processes_naming(str(gates / name)), f"{name}'s program is gone"
    for name in ends_down:
        (gates / name).touch()
    for name in ends_down:
        await until(
            lambda name=name: trio.to_thread.run_sync(lambda: not processes_naming(str(gates / name))),
            what=f"{name}'s end",
        )

    # Both hosts let go of promotion (and the leader of the lead) before their leases could expire.
    async def stale(host: Host) -> bool:
        return bool(host.lines("host_lease_stale"))

    for host in hosts:
        await until(functools.partial(stale, host), what=f"{host.host_id}'s lease stale")
    # Down longer than the lease: every lease has expired at the database's clock.
    await trio.sleep(max(0.0, down_at + DOWN_S - time.time()))  # keeping it down, not waiting for anything
    for host in hosts:
        assert host.proc.returncode is None, f"{host.host_id} exited {host.proc.returncode}"
        assert all(map(alive, supervisors[host.host_id])), f"{host.host_id}'s supervisor is gone"
        health = await fleet.get(host, "/api/health")
        assert health["status"] == "degraded" and health["leader"] is False, health
        assert "registry" in health["degraded"], health  # its writes (the lease renewals) fail
    for name in ends_after:
        assert processes_naming(str(gates / name)), f"{name}'s program is gone"
    refused_while_down = [at for at in load.refused if at >= down_at]
    assert refused_while_down, "the client saw no 503 while the database was down"
    assert not [at for at in load.acked.values() if at >= down_at], "a 202 while the database was down"

    # -- the start ---------------------------------------------------------------------------------------------------
    starting_at = time.time()  # the hosts may reconnect before the script returns: recovery is counted from here
    await trio.to_thread.run_sync(cluster.start)
    back_at = time.time()

    async def renewed_and_listening(host: Host) -> bool:
        return bool(host.lines("host_lease_renewed") and host.lines("wakeups_back"))

    for host in hosts:
        await until(functools.partial(renewed_and_listening, host), what=f"{host.host_id} back")

    async def one_leader() -> str | None:
        said = await leaders(fleet, hosts)
        return next((host_id for host_id, leads in said.items() if leads), None)

    leader = await until(one_leader, what="a leader again")
    # Recovery, by the hosts' own lines: the lead taken, each lease renewed, each host listening again.
    led_s = logged_at(fleet.hosts[leader].lines("fleet_leader")[-1]) - starting_at
    renewed_s = max(logged_at(host.lines("host_lease_renewed")[-1]) for host in hosts) - starting_at
    listening_s = max(logged_at(host.lines("wakeups_back")[-1]) for host in hosts) - starting_at

    # The jobs that ended during the outage: their true outcome, recorded by their own host.
    async def recorded(name: str) -> dict[str, Any] | None:
        row = await fleet.job(h1, gated[name])
        return row if row["status"] != "running" else None

    for name in sorted(ends_down):
        row = await until(functools.partial(recorded, name), what=f"{name}'s outcome")
        assert (row["status"], row["exit_code"], row["attempts"], row["host_id"]) == (
            "succeeded",
            0,
            1,
            ran_on[name],
        ), row
    recorded_s = (
        max(  # by the line its own host logged when it recorded it
            logged_at(line)
            for name in ends_down
            for line in fleet.hosts[ran_on[name]].lines("job_transition")
            if line["job_id"] == gated[name] and line["to"] == "succeeded"
        )
        - starting_at
    )

    # New enqueues are taken and run.
    async def new_work_ran() -> float | None:
        after = [job_id for job_id, at in list(load.acked.items()) if at >= back_at]
        for job_id in after:
            if (await fleet.job(h1, job_id))["status"] == "succeeded":
                return load.acked[job_id]
        return None

    first_ack = await until(new_work_ran, what="a job enqueued after the restart to run")
    first_ack_s = first_ack - starting_at
    for name in ends_after:
        (gates / name).touch()
    with trio.move_on_after(LEASE_S):  # a lease's worth of load after the restart, sampled throughout
        await trio.sleep_forever()
    background.stop()  # the client and the sampler stop here
    ended_at = time.time()

    async def all_ended() -> dict[str, dict[str, Any]] | None:
        rows = await fleet.rows(h1)
        return rows if all(row["status"] not in ("queued", "running") for row in rows.values()) else None

    rows = await until(all_ended, what="every job to end")
    acked = set(load.acked) | set(gated.values())
    # Nothing acknowledged lost; everything acknowledged ran once and succeeded.
    assert set(acked_before_stop) <= set(rows) and acked <= set(rows), acked - set(rows)
    for job_id in acked:
        assert (rows[job_id]["status"], rows[job_id]["attempts"]) == ("succeeded", 1), rows[job_id]
    starts = collections.Counter(
        line.split()[1] for line in fleet.journal.read_text().splitlines() if line.startswith("start")
    )
    twice = [job_id for job_id, n in starts.items() if n > 1]
    assert not twice, f"run twice: {twice}"
    assert set(starts) >= acked, acked - set(starts)
    assert await fleet.rows(h2) == rows, "h2 disagrees with h1"
    # Never two leaders, at any sample; a leader before, none while down (after the step-down), one after.
    assert all(sum(said.values()) <= 1 for _, said in samples)
    assert any(said[leader] for at, said in samples if at >= back_at)

    # Each host said the fault once and its end once: no flood (a line per failed call, per task, per second), and
    # nothing but its JSON lines (a library's traceback through the standard logging is a flood of its own).
    for host in hosts:
        other = [line for line in host.log.read_text().splitlines() if not line.startswith("{")]
        assert not other, "\n".join(other[:40])
        during = events_between(host, stopped_at, ended_at)
        loud = {key: n for key, n in during.items() if key[1] in ("warning", "error")}
        print(host.host_id, dict(during))
        assert during[("registry_writes_failing", "error")] == 1, during
        assert during[("registry_writes_recovered", "info")] == 1, during
        assert during[("wakeups_lost", "warning")] == 1, during
        assert during[("wakeups_back", "info")] == 1, during
        assert during[("host_lease_stale", "warning")] == 1, during
        assert during[("host_lease_renewed", "info")] == 1, during
        assert all(n == 1 for n in loud.values()), loud
        if during[("webhook_outbox_unreachable", "warning")]:  # said by the leader of the moment the server stopped
            ended = during[("webhook_outbox_reachable", "info")] + during[("webhook_outbox_left_to_leader", "info")]
            assert ended == 1, during
    errors = {line["event"] for line in fleet.errors()}
    assert errors <= {"registry_writes_failing"}, errors
    print(
        f"postgres restart: down {starting_at - down_at:.2f} s ({len(refused_while_down)} 503s to the client); after "
        f"the start: a leader ({leader}) in {led_s:.2f} s, both leases renewed in {renewed_s:.2f} s, both listening in "
        f"{listening_s:.2f} s, the outage's ends recorded in {recorded_s:.2f} s, the first new enqueue acknowledged "
        f"{first_ack_s:.2f} s after; {len(acked)} jobs acknowledged, each ran once"
    )
