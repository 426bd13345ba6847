"""The chaos run in miniature (tests/longrun/chaos.py --smoke), once per exec mode: real supervisors SIGKILLed and
restarted while jobs are SIGKILLed from outside and resubmitted.

The full run is `make chaos`; this keeps the script from rotting and checks its promises on a small scale: every
acknowledged job has a terminal row that the API shows alike; no job ran twice except as a recorded resubmit (its
attempts are its journal's starts, its history its earlier attempts); every outcome is what the job did (a kill from
outside recorded as that kill and resubmitted while attempts remain, an exit 0 as succeeded); never more than the slots
at once; nothing left running. Its results file goes to a temp dir. The smoke run goes on until a few outside kills
have landed, so each run exercises resubmission whatever the machine's speed.

The fleet version (``--hosts 2``, ADR 0012) runs two supervisors on a fresh schema of the test PostgreSQL server, each
SIGKILLed at random and restarted with its host id, and adds two checks: never two leaders (every host's health, the
leader table's handovers: INV-ONE-LEADER), and no attempt ended by a host that did not run it (INV-OWNER-JUDGES).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TEST_DATABASE_URL_VAR = "PODCAST_JOB_TEST_DATABASE_URL"

CHAOS = Path(__file__).resolve().parent / "chaos.py"
CHECKS = 9  # since idempotency keys: as many rows as acknowledged jobs; since max_running: never two solo jobs
FLEET_CHECKS = CHECKS + 2


def run_smoke(mode: str, results: Path, *fleet: str, checks: int = CHECKS) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    done = subprocess.run(
        [sys.executable, str(CHAOS), "--smoke", "--mode", mode, *fleet, "--results-dir", str(results)],
        capture_output=True,
        text=True,
        timeout=240,  # a backstop for a wedged run: each takes 10-30 s
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.count("PASS") == checks and "FAIL" not in done.stdout
    # The raw results as a dated JSON file: every check's verdict, the figures, the outcomes, the machine.
    [written] = results.glob("*-chaos.json")
    data: dict[str, Any] = json.loads(written.read_text())
    return data


def check_figures(data: dict[str, Any], mode: str, checks: int = CHECKS) -> None:
    assert data["kind"] == "chaos" and data["mode"] == mode and data["smoke"] is True
    assert data["verdict"] == "PASS" and [c["verdict"] for c in data["checks"]] == ["PASS"] * checks
    # 16 acknowledged, 16 rows: a request whose answer was lost (or thrown away by the lossy client) was sent again
    # with its Idempotency-Key, and made no second row (ADR 0016).
    assert data["acknowledged"] == 16 == data["rows"] and data["rows_no_answer_acknowledged"] == 0
    assert sum(o["count"] for o in data["outcomes"]) == data["rows"]
    assert data["supervisor_kills"] >= 4 and data["machine"]["nproc"]
    kills, raced = data["outside_job_kills"], data["outside_kills_raced_exit"]
    assert kills >= 3
    # Every outside kill is resubmitted or ends a job out of attempts, unless it raced the job's own exit 0 (then
    # either outcome is true); nothing else crashed.
    assert kills - raced <= data["resubmits"] + data["jobs_out_of_attempts"] <= kills


@pytest.mark.e2e
def test_chaos_smoke_in_subprocess_mode_keeps_every_promise(tmp_path: Path) -> None:
    check_figures(run_smoke("subprocess", tmp_path), "subprocess")


@pytest.mark.e2e
@pytest.mark.docker
def test_chaos_smoke_in_docker_mode_keeps_every_promise(tmp_path: Path) -> None:
    check_figures(run_smoke("docker", tmp_path), "docker")


@pytest.mark.e2e
@pytest.mark.postgres
def test_chaos_smoke_with_two_hosts_on_postgresql_keeps_every_promise(tmp_path: Path) -> None:
    dsn = os.environ[TEST_DATABASE_URL_VAR]  # the postgres mark skips (CI: fails) without it
    data = run_smoke("subprocess", tmp_path, "--hosts", "2", "--database-url", dsn, checks=FLEET_CHECKS)
    check_figures(data, "subprocess", FLEET_CHECKS)
    assert data["args"]["hosts"] == 2 and Path(next(tmp_path.glob("*-chaos.json"))).name.endswith("-2hosts-chaos.json")
    # The hosts were SIGKILLed (whichever the draw picked) and came back; somebody led, and said so, meanwhile.
    assert set(data["host_kills"]) == {"h1", "h2"} and sum(data["host_kills"].values()) == data["supervisor_kills"]
    assert data["supervisor_kills"] >= 4
    assert data["leader_holders"] >= 1 and data["leader_answers"] >= 1
    # Every attempt's end was seen in a host's log and checked against the host that ran it.
    assert data["ends_in_logs"] >= 1 and set(data["ran_on"]) <= {"h1", "h2"}
