"""The kit's answers are production's: its kinds are a kinds file's (the doubling backoff, a refused kind refused),
its scripts say what real jobs do without internals, and a scenario repeats exactly (``docs/testing.md``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.testing import (
    JobNotFound,
    KindsFileError,
    RegistryUnavailable,
    Scenario,
    ScenarioTimeout,
    open_scenario,
)

HOUR = 3600.0


def run_scenario(tmp_path: Path, body: Callable[[Scenario], Awaitable[Any]]) -> Any:
    """One scenario in a run of its own (a fresh MockClock), as a test of it would be; its data dir's path, which
    differs from run to run, is written DATA in what it answers."""

    async def main() -> Any:
        async with open_scenario(tmp_path) as sc:
            return await body(sc)

    answer = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return json.loads(json.dumps(answer).replace(str(tmp_path), "DATA"))


async def test_resubmission_waits_double_up_to_the_cap(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(max_attempts=4, retry_backoff_s=100)})
    job_id = await sc.enqueue("work")
    kills = []
    for _ in range(3):
        await sc.advance(1)
        sc.kill(job_id)  # a crash: the kind may be resubmitted
        kills.append(sc.now())
        await sc.advance(1000)  # longer than any of its waits
    starts = [
        datetime.fromisoformat(hook["job"]["started_at"])
        for hook in sc.webhooks()
        if hook["event"] == "job.transition" and hook["job"]["status"] == "running"
    ]
    waits = [(start - killed).total_seconds() for killed, start in zip(kills, starts[1:], strict=True)]
    # 100 s, 200 s, 400 s, each times a jitter in 0.9-1.1 (the kinds file's default cap, 3600 s, is far)
    assert [round(wait / base, 2) for wait, base in zip(waits, (100, 200, 400), strict=True)] == pytest.approx(
        [1.0, 1.0, 1.0], abs=0.11
    )


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"max_attempts": 500}, "max_attempts"),
        ({"retry_backoff_s": 0}, "retry_backoff_seconds"),
        ({"deadline_s": 0}, "deadline_seconds"),
        ({"max_running": 0}, "max_running"),
    ],
)
def test_a_kind_a_kinds_file_refuses_is_refused(settings: dict[str, float], key: str) -> None:
    with pytest.raises(KindsFileError, match=key):
        Scenario.script(**settings)  # type: ignore[arg-type]


async def test_a_kinds_files_refusal_is_the_scenarios(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    with pytest.raises(KindsFileError, match="retry_backoff_max_seconds"):
        await sc.start(kinds_toml='[kinds.w]\nargv = ["w"]\nretry_backoff_seconds = 7200\n', behave={})
    with pytest.raises(KindsFileError, match="names no known kind"):
        await sc.start(kinds_toml='[kinds.w]\nargv = ["w"]\nthen = "nothing"\n')
    with pytest.raises(KindsFileError, match="belongs in the kinds file"):
        await sc.start(kinds_toml='[kinds.w]\nargv = ["w"]\n', behave={"w": sc.script(max_attempts=2)})
    with pytest.raises(KindsFileError, match="does not declare"):
        await sc.start(kinds_toml='[kinds.w]\nargv = ["w"]\n', behave={"x": sc.script()})


async def test_the_built_in_kinds_run_by_name_with_their_params(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    seen: list[dict[str, object]] = []

    def pipeline(params: dict[str, object]) -> object:
        seen.append(params)
        return sc.script(run_for=60, progress_every=10)

    await sc.start(behave={"pipeline": pipeline, "enrichment": sc.script(run_for=30)})
    job_id = await sc.enqueue("pipeline", feed="https://example.org/feed.xml")
    job = await sc.advance_until_ended(job_id, within=HOUR)
    assert (job.status, job.completed_units) == ("succeeded", 6)
    assert seen == [{"feed": "https://example.org/feed.xml", "max_episodes": 0}]
    await sc.advance(60)
    follow_up = [t for t in sc.transitions() if t.kind == "enrichment"]  # the built-in then = "enrichment"
    assert [t.status for t in follow_up] == ["queued", "running", "succeeded"]


async def test_a_silent_job_written_without_internals(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"quiet": sc.script(beats_every=5, progress_every=5, beats_until=600)}, silent_after_s=300)
    job_id = await sc.enqueue("quiet")
    await sc.advance_until(lambda: any(h["event"] == "job.silent" for h in sc.webhooks(job_id)), within=HOUR)
    job = await sc.job(job_id)
    assert (job.status, job.silent) == ("running", True)  # the process lives on: silent, not dead
    assert job.started_at is not None
    assert 600 + 300 <= (sc.now() - job.started_at).total_seconds() <= 600 + 300 + 60  # its threshold and a sweep


async def test_a_script_dies_by_a_signal_and_prints_its_lines(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"w": sc.script(run_for=40, signal="SIGSEGV", output=["starting", "working"])})
    job = await sc.advance_until_ended(await sc.enqueue("w"), within=HOUR)
    assert (job.status, job.error_reason, job.exit_code) == ("failed", "killed_by_SIGSEGV", -11)
    assert sc.executor.jobs[job.job_id].output == b"starting\nworking\n"


async def test_advance_until_says_when_it_did_not_happen(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"w": sc.script()})
    job_id = await sc.enqueue("w")
    with pytest.raises(ScenarioTimeout, match="within 600"):
        await sc.advance_until_ended(job_id, within=600)
    assert trio.current_time() == 600


def fingerprint(sc: Scenario) -> str:
    """What a scenario's reader sees: every webhook and log line."""
    return json.dumps([sc.webhooks(), sc.log()], sort_keys=True, default=str)


def test_ten_runs_of_a_beat_at_the_exit_are_identical(tmp_path: Path) -> None:
    async def body(sc: Scenario) -> list[Any]:
        await sc.start(
            kinds={"w": sc.script(run_for=HOUR, progress_every=30), "r": sc.script(run_for=70, max_attempts=3)},
            max_concurrent=3,
        )
        job_id = await sc.enqueue("w")
        retried = await sc.enqueue("r")
        await sc.advance(50)
        sc.kill(retried)  # resubmitted after a jittered wait
        await sc.advance(2 * HOUR)
        return [(await sc.job(job_id)).completed_units, fingerprint(sc)]

    runs = [run_scenario(tmp_path / str(n), body) for n in range(10)]
    assert runs[0][0] == 120  # the beat at the exit's instant is sent before the exit
    assert all(run == runs[0] for run in runs)


def test_the_seed_chooses_the_draws(tmp_path: Path) -> None:
    async def body(sc: Scenario, seed: int) -> str:
        await sc.start(kinds={"r": sc.script(run_for=70, max_attempts=2)}, seed=seed)
        job_id = await sc.enqueue("r")
        await sc.advance(10)
        sc.kill(job_id)
        await sc.advance(HOUR)
        return fingerprint(sc)

    one, again, other = (run_scenario(tmp_path / str(s), lambda sc, s=s: body(sc, s % 2)) for s in (0, 2, 1))
    assert one == again and one != other


async def test_the_operators_verbs_are_the_apis(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(
        kinds_toml='[kinds.w]\nargv = ["w"]\n[kinds.idle]\nargv = ["idle"]\n',
        behave={"w": sc.script(run_for=10, exit_code=4)},
        retention_days=1,
    )
    failed = [await sc.enqueue("w") for _ in range(3)]
    for job_id in failed:
        await sc.advance_until_ended(job_id, within=HOUR)
    dry = await sc.bulk("retry", dry_run=True, status="failed")
    assert (dry.dry_run, sorted(dry.job_ids)) == (True, sorted(failed))
    done = await sc.bulk("retry", status="failed")
    assert done.outcomes == {"retried": 3}
    with pytest.raises(JobNotFound):
        await sc.cancel("no-such-job")
    unscripted = await sc.enqueue("idle")  # a kind with no behaviour cannot start
    job = await sc.advance_until_ended(unscripted, within=60)
    assert job.status == "failed"
    report = await sc.reconcile()
    assert report.details == [] or all(d.job_id for d in report.details)
    assert await sc.prune(dry_run=True) == []  # nothing has been over for a day yet
    await sc.advance(2 * 86400)  # the sweeps' retention (one day) removes them; the operator's prune finds the rest
    await sc.prune()
    for job_id in failed:
        with pytest.raises(JobNotFound):
            await sc.job(job_id)


async def test_an_unreachable_registry_fails_every_call_until_it_answers(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"w": sc.script(run_for=100, progress_every=10)})
    job_id = await sc.enqueue("w")
    await sc.advance(20)
    sc.make_unreachable("registry")
    with pytest.raises(RegistryUnavailable):
        await sc.enqueue("w")
    assert sc.supervisor is not None and "registry" in (await sc.supervisor.health()).degraded
    await sc.advance(200)  # the job ended meanwhile: its end waits until it can be written
    sc.make_reachable("registry")
    job = await sc.advance_until_ended(job_id, within=120)
    assert (job.status, job.completed_units) == ("succeeded", 10)
    assert [h["job"]["status"] for h in sc.webhooks(job_id)] == ["queued", "running", "succeeded"]


SCENARIO_IN_A_PROCESS = """
import hashlib, json, sys, trio, trio.testing
from pathlib import Path
from supervisor.testing import open_scenario

async def main():
    async with open_scenario(Path(sys.argv[1])) as sc:
        await sc.start(
            kinds={"w": sc.script(run_for=600, progress_every=30), "r": sc.script(run_for=70, max_attempts=3),
                   "s": sc.script(beats_every=5)},
            max_concurrent=3, progress_stale_after_s=300, stall_action="terminate",
        )
        retried = [await sc.enqueue(kind) for kind in ("w", "r", "s")][1]
        await sc.advance(50)
        sc.kill(retried)
        await sc.advance(3600)
        seen = json.dumps([sc.webhooks(), sc.log()], sort_keys=True, default=str).replace(sys.argv[1], "DATA")
        print(hashlib.sha256(seen.encode()).hexdigest())

trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
"""


@pytest.mark.e2e
def test_a_scenario_repeats_in_processes_with_other_hash_seeds(tmp_path: Path) -> None:
    """Set orders differ between processes (PYTHONHASHSEED): what a scenario shows does not."""
    (tmp_path / "scenario.py").write_text(SCENARIO_IN_A_PROCESS)
    digests = set()
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "scenario.py", str(tmp_path / f"data-{seed}")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=False,
        )
        assert done.returncode == 0, done.stderr
        digests.add(done.stdout.strip())
    assert len(digests) == 1


async def test_quiet_sweeps_are_slept_through_on_the_same_ticks(supervisor_scenario: Scenario) -> None:
    """A quiet stretch costs no sweep, and the sweeps after it fall on the ticks they always would (every 30 s from
    the startup sweep), not 30 s after whatever woke the sweeper."""
    sc = supervisor_scenario
    await sc.start(kinds={"spin": sc.script(beats_every=5)}, progress_stale_after_s=300)
    assert sc.supervisor is not None
    sweeps = sc.supervisor.render_metrics
    before = [line for line in (await sweeps()).decode().splitlines() if "sweep_duration_seconds_count" in line]
    await sc.advance(1000)  # nothing in the registry: not one sweep
    after = [line for line in (await sweeps()).decode().splitlines() if "sweep_duration_seconds_count" in line]
    assert before == after and before, before
    await sc.enqueue("spin")
    await sc.advance_until(lambda: any(h["event"] == "job.stalled" for h in sc.webhooks()), within=3600)
    assert trio.current_time() == 1320  # the first tick (a multiple of 30 s) past 1000 + 300


async def test_coalescing_and_then_are_the_kinds_files(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    kinds = '[kinds.fetch]\nargv = ["f"]\nthen = "index"\n[kinds.index]\nargv = ["i"]\ncoalesce = true\n'
    behave = {"fetch": sc.script(run_for=10), "index": sc.script(run_for=100)}
    await sc.start(kinds_toml=kinds, behave=behave, max_concurrent=1)
    await sc.pause()
    queued = {await sc.enqueue("index") for _ in range(3)}
    assert len(queued) == 1  # identical queued jobs are one
    fetch = await sc.enqueue("fetch")
    await sc.resume()
    await sc.advance_until_ended(fetch, within=HOUR)
    await sc.advance(HOUR)
    index_jobs = [t.job_id for t in sc.transitions() if t.kind == "index" and t.status == "succeeded"]
    assert len(index_jobs) == 2 and index_jobs[0] in queued  # and one more, the fetch's follow-up


async def test_a_kinds_file_on_disk_is_read_as_serve_reads_it(supervisor_scenario: Scenario, tmp_path: Path) -> None:
    sc = supervisor_scenario
    path = tmp_path / "kinds.toml"
    path.write_text('[kinds.nightly]\nargv = ["n", "{day}"]\nparams = { day = "int" }\nmax_attempts = 2\n')
    await sc.start(kinds_file=path, behave={"nightly": lambda params: sc.script(run_for=params["day"])})
    job = await sc.advance_until_ended(await sc.enqueue("nightly", day="7"), within=60)  # the CLI's text, converted
    assert (job.status, job.params, job.max_attempts, trio.current_time()) == ("succeeded", {"day": 7}, 2, 7)
    assert sc.supervisor is not None and sc.supervisor.config.kinds_file == path
