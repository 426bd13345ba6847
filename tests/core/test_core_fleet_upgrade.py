"""A fleet upgraded host by host under load, by the runbook of docs/fleet.md § Upgrading a fleet, on PostgreSQL.

Three hosts of the previous release -- a real earlier commit of this repository (``releases.toml``), installed in a
venv of its own (``previous_release``) -- run a steady load: jobs with a follow-up (``then``), a kind with
``max_running = 1``, cancels of queued and running jobs. Each host in turn is drained (``supervisor hosts drain``),
waited for (``supervisor hosts wait-drained``), stopped (SIGTERM), started on this tree's code with the same host id
and data dir, and undrained. The first new host applies this release's expands while the old hosts run on them; with
one old host left, ``supervisor migrate`` refuses the contract naming it; once all are upgraded it applies it, and
then the old release refuses to start in one line, exit 5.

Checked against the jobs' own journal, the registry and the hosts' logs: one terminal state per job, none lost, none
run twice (one start per job), attempts unchanged (every job ran once: a drain fails nothing and charges nothing),
the fleet-wide limit and the solo kind's limit never exceeded, and one leader at every instant (each host's leading
spans, from its own log, never overlap). INV-DRAIN-STOPS-PROMOTION, INV-DRAINED-HANDS-OVER, INV-CONTRACT-AFTER-FLEET.

A small size runs in ``make test``; ``pytest --longrun`` runs the full one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from previous_release import install, previous_release  # type: ignore[import-not-found]
from test_core_fleet_postgres import (  # type: ignore[import-not-found]
    NOTE,
    REPO_ROOT,
    TEST_DATABASE_URL_VAR,
    Fleet,
    Host,
    _fetch,
    iso_at,
    logged_at,
    max_overlap,
    open_fleet,
    until,
)

from supervisor.domain import RELEASE

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

LIMIT = 4  # the fleet-wide PODCAST_JOB_MAX_CONCURRENT of the test module it borrows its fleet from

# Notes its start, runs argv[1] seconds, notes its end: a job's own journal (one start per run).
TIMED_JOB = NOTE + 'note("start")\ntime.sleep(float(sys.argv[1]))\nnote("end")\n'


def upgrade_kinds(journal: Path) -> str:
    def kind(name: str, extra: str = "") -> str:
        argv = ["{python}", "-c", TIMED_JOB, "{seconds}", str(journal)]
        return f'[kinds.{name}]\nargv = {json.dumps(argv)}\nparams = {{ seconds = "float" }}\n{extra}\n'

    return kind("work") + kind("solo", "max_running = 1\n") + kind("chain", 'then = "work"\n')


class Load:
    """A steady load through whichever hosts serve: jobs of each kind, a cancel of every fifth (queued or running)."""

    def __init__(self, fleet: Fleet, *, seconds: tuple[float, float], every_s: float, seed: int) -> None:
        self.fleet = fleet
        self.seconds = seconds
        self.every_s = every_s
        self.random = random.Random(seed)
        self.serving: dict[str, Host] = {}
        self.enqueued: list[str] = []
        self.cancelled: list[str] = []

    def through(self) -> Host:
        return self.random.choice(sorted(self.serving.values(), key=lambda h: h.host_id))

    async def run(self, done: trio.Event) -> None:
        n = 0
        while not done.is_set():
            kind = ("work", "solo", "chain")[n % 3]
            seconds = round(self.random.uniform(*self.seconds), 3)
            try:
                job_id = await self.fleet.enqueue(self.through(), kind, seconds=seconds)
            except (httpx.TransportError, AssertionError):
                # The host chosen was being stopped (the runbook's own step): enqueue through another.
                await trio.sleep(0.05)
                continue
            self.enqueued.append(job_id)
            if n % 5 == 4:
                await trio.sleep(self.random.uniform(0, 0.3))
                await self.fleet.post(self.through(), f"/api/jobs/{job_id}/cancel")
                self.cancelled.append(job_id)
            n += 1
            await trio.sleep(self.every_s)


async def cli(host: Host | None, *args: str, env_extra: dict[str, str] | None = None) -> trio.CompletedProcess[bytes]:
    """``supervisor ARGS`` of this tree, as an operator runs it (against ``host``'s API when given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if host is not None:
        env["PODCAST_JOB_URL"] = host.url
    env.update(env_extra or {})
    return await trio.run_process(
        [sys.executable, "-m", "supervisor", *args], env=env, capture_stdout=True, capture_stderr=True, check=False
    )


async def stop(host: Host) -> None:
    """The runbook's stop: SIGTERM (as systemctl stop), and wait for the process to end."""
    host.proc.send_signal(signal.SIGTERM)
    with trio.fail_after(30):
        await host.proc.wait()
    assert host.proc.returncode == 0, host.log.read_text()[-2000:]


def leading_spans(fleet: Fleet) -> list[tuple[float, float, str]]:
    """Each boot's spans as leader, from its own log: from ``fleet_leader`` to the line that ends it (or its end)."""
    spans = []
    for log in sorted(fleet.root.glob("*-boot*.log")):
        lines = [json.loads(text) for text in log.read_text().splitlines() if text.startswith("{")]
        since: float | None = None
        for line in lines:
            if line["event"] == "fleet_leader":
                since = logged_at(line)
            elif line["event"] in ("fleet_leader_handed_over", "fleet_leader_stepped_down") and since is not None:
                spans.append((since, logged_at(line), log.name))
                since = None
        if since is not None:
            spans.append((since, logged_at(lines[-1]) if lines else since, log.name))
    return sorted(spans)


async def upgrade_under_load(fleet: Fleet, *, seconds: tuple[float, float], every_s: float, settle_s: float) -> None:
    old = await trio.to_thread.run_sync(install, previous_release(RELEASE))
    fleet.kinds.write_text(upgrade_kinds(fleet.journal))
    hosts = [await fleet.start(host_id, python=old) for host_id in ("h1", "h2", "h3")]
    releases = {h["host_id"]: h["release"] for h in (await fleet.get(hosts[0], "/api/hosts"))["hosts"]}
    old_release = releases["h1"]
    assert old_release != RELEASE and set(releases.values()) == {old_release}
    load = Load(fleet, seconds=seconds, every_s=every_s, seed=66)
    load.serving = {host.host_id: host for host in hosts}
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(load.run, done)
        await trio.sleep(settle_s)  # the load under way on the old release
        for n, host_id in enumerate(("h1", "h2", "h3")):
            host = fleet.hosts[host_id]
            other = next(h for h in load.serving.values() if h.host_id != host_id)
            drained = await cli(other, "hosts", "drain", host_id)
            assert drained.returncode == 0, drained.stderr
            waited = await cli(other, "hosts", "wait-drained", host_id, "--timeout", "60")
            assert waited.returncode == 0, waited.stderr
            del load.serving[host_id]
            await stop(host)
            upgraded = await fleet.start(host_id)
            undrained = await cli(upgraded, "hosts", "undrain", host_id)
            assert undrained.returncode == 0, undrained.stderr
            load.serving[host_id] = upgraded
            view = {h["host_id"]: h for h in (await fleet.get(upgraded, "/api/hosts"))["hosts"]}
            assert (view[host_id]["release"], view[host_id]["drain"]) == (RELEASE, None)
            if n == 1:
                # h3 still runs the old release: the contract is refused, naming it (INV-CONTRACT-AFTER-FLEET).
                refused = await cli(None, "migrate", env_extra={"PODCAST_JOB_DATABASE_URL": fleet.database_url})
                assert refused.returncode == 1, refused.stdout
                said = refused.stderr.decode().splitlines()
                [line] = [text for text in said if text.startswith("error: ")] or [said]
                assert f"held back by h3 (release {old_release}, live)" in line, line
            await trio.sleep(settle_s)  # mixed releases under load
        migrated = await cli(None, "migrate", env_extra={"PODCAST_JOB_DATABASE_URL": fleet.database_url})
        assert migrated.returncode == 0, migrated.stderr
        await trio.sleep(settle_s)  # the contracted schema under load
        done.set()

    # Every job ends, once.
    survivor = fleet.hosts["h1"]

    async def all_ended() -> dict[str, dict[str, Any]] | None:
        rows = await fleet.rows(survivor)
        return rows if all(row["status"] not in ("queued", "running") for row in rows.values()) else None

    rows = await until(all_ended, what="every job to end", limit_s=120)
    assert set(load.enqueued) <= set(rows), "a job was lost"
    statuses = {row["status"] for row in rows.values()}
    assert statuses <= {"succeeded", "cancelled"}, statuses
    for job_id, row in rows.items():
        expected = "cancelled" if job_id in load.cancelled else "succeeded"
        if job_id in load.cancelled and row["status"] == "succeeded":
            expected = "succeeded"  # it ended before the cancel came
        assert row["status"] == expected, row
        assert row["attempts"] <= 1 and (row["attempts"] == 1 or row["status"] == "cancelled"), row
    follow_ups = set(rows) - set(load.enqueued)
    chains = [j for j in load.enqueued if rows[j]["kind"] == "chain" and rows[j]["status"] == "succeeded"]
    assert len(follow_ups) == len(chains) and {rows[j]["kind"] for j in follow_ups} <= {"work"}

    # The jobs' own journal: one start per job (none ran twice), an end for each that succeeded, the limits held.
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for text in fleet.journal.read_text().splitlines():
        what, job_id, at = text.split()
        book = starts if what == "start" else ends
        assert job_id not in book, f"{job_id} {what}ed twice"
        book[job_id] = float(at)
    succeeded = {j for j, row in rows.items() if row["status"] == "succeeded"}
    assert succeeded <= set(ends) and set(ends) <= set(starts) <= set(rows)

    def span(job_id: str) -> tuple[float, float]:
        end = ends.get(job_id)
        if end is None:  # cancelled while it ran: its row says when it ended
            end = iso_at(rows[job_id]["ended_at"])
        return starts[job_id], end

    most = max_overlap([span(j) for j in starts])
    assert most <= LIMIT, f"{most} jobs ran at once under a fleet-wide limit of {LIMIT}"
    solo = max_overlap([span(j) for j in starts if rows[j]["kind"] == "solo"])
    assert solo <= 1, f"{solo} solo jobs ran at once (max_running = 1)"

    # One leader at every instant: the leading spans of every boot, from their own logs, never overlap.
    spans = leading_spans(fleet)
    assert spans, "nobody led"
    for (_, end, who), (start, _, next_who) in itertools.pairwise(spans):
        assert start >= end, f"{who} and {next_who} led at once"

    # The schema is contracted now: the old release refuses to start on it, in one line, exit 5.
    home = fleet.root / "h4"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PODCAST_", "PYTHONPATH"))}
    env.update(PODCAST_JOB_DATA_DIR=str(home / "data"), PODCAST_JOB_DATABASE_URL=fleet.database_url,
               PODCAST_JOB_BIND="127.0.0.1:0", PODCAST_JOB_HOST_ID="h4")  # fmt: skip
    refused = await trio.run_process(
        [str(old), "-m", "supervisor", "serve"], env=env, cwd=home, capture_stdout=True, capture_stderr=True,
        check=False,
    )  # fmt: skip
    lines = refused.stderr.decode().splitlines()
    assert refused.returncode == 5, refused.stderr
    assert len(lines) == 1 and "contracted by a newer release" in lines[0], lines
    query = "SELECT version, phase FROM schema_migrations ORDER BY version"
    applied = await trio.to_thread.run_sync(lambda: asyncio.run(_fetch(fleet.database_url, query)))
    assert [r["phase"] for r in applied].count("contract") >= 1
    assert fleet.errors() == []
    print(f"jobs {len(rows)} (follow-ups {len(follow_ups)}, cancelled {len(load.cancelled)}); most at once {most}")


@pytest.fixture
async def fleet(tmp_path: Path) -> Any:
    dsn = os.environ.get(TEST_DATABASE_URL_VAR)
    assert dsn, f"{TEST_DATABASE_URL_VAR} is unset (the postgres mark skips these tests)"
    async with open_fleet(tmp_path, dsn) as made:
        yield made


async def test_a_fleet_of_the_previous_release_upgraded_host_by_host_under_load_loses_nothing(fleet: Fleet) -> None:
    """The small size: short jobs, a few seconds of each mix (old, mixed, new)."""
    await upgrade_under_load(fleet, seconds=(0.05, 0.4), every_s=0.1, settle_s=2.0)


@pytest.mark.longrun
async def test_a_fleet_upgraded_host_by_host_under_a_long_load_loses_nothing(fleet: Fleet) -> None:
    """The full size (pytest --longrun): longer jobs, a minute of each mix."""
    await upgrade_under_load(fleet, seconds=(0.2, 3.0), every_s=0.05, settle_s=60.0)
