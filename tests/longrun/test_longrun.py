"""The long runs at full length, as tests: deselected unless ``pytest --longrun`` (never in ``make test``).

``pytest --longrun tests/longrun -k chaos`` is ``make chaos`` (the fleet one needs PODCAST_JOB_TEST_DATABASE_URL),
``-k soak`` is ``make soak``: each runs its harness with the same defaults, keeps its results file in
``bench/results/`` like the make target, and passes when every check of the run does. ``make test`` runs each harness
in miniature instead (test_chaos_smoke.py, test_soak_smoke.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "bench" / "results"


def run_to_verdict(script: str, *args: str, hours: float) -> None:
    """The harness run to its end (bounded: a wedged run fails) and its verdict, from the results file it wrote."""
    before = set(RESULTS.glob("*.json"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_JOB_") or k.startswith("PODCAST_JOB_TEST")}
    done = subprocess.run(
        [sys.executable, str(HERE / script), *args], timeout=hours * 3600, env=env, check=False, capture_output=True
    )
    written = sorted(set(RESULTS.glob("*.json")) - before)
    assert written, done.stdout.decode()[-4000:] + done.stderr.decode()[-4000:]
    verdicts = [json.loads(path.read_text())["verdict"] for path in written]
    assert done.returncode == 0 and verdicts == ["PASS"] * len(written), (written, done.stdout.decode()[-4000:])


@pytest.mark.longrun
@pytest.mark.e2e
def test_chaos_in_subprocess_mode_at_full_length() -> None:
    run_to_verdict("chaos.py", "--mode", "subprocess", hours=1)


@pytest.mark.longrun
@pytest.mark.e2e
@pytest.mark.docker
def test_chaos_in_docker_mode_at_full_length() -> None:
    run_to_verdict("chaos.py", "--mode", "docker", hours=1)


@pytest.mark.longrun
@pytest.mark.e2e
@pytest.mark.postgres
def test_chaos_with_three_hosts_at_full_length() -> None:
    dsn = os.environ["PODCAST_JOB_TEST_DATABASE_URL"]  # the postgres mark skips without it
    args = ("--hosts", "3", "--database-url", dsn, "--jobs", "400", "--kills", "80", "--seed", "27")
    run_to_verdict("chaos.py", *args, "--job-kill-every-s", "0.3", hours=1)


@pytest.mark.longrun
@pytest.mark.e2e
def test_an_hour_of_soak_keeps_resources_flat() -> None:
    run_to_verdict("soak.py", "--duration-s", "3600", "--table-step-s", "300", hours=1.5)
