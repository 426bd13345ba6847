"""Fixtures shared by every test package, and the gate for tests marked ``docker``."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import SqliteRegistry

REPO_ROOT = Path(__file__).resolve().parents[1]
ENGINE_SCRIPT = REPO_ROOT / "scripts" / "docker-engine.sh"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[SqliteRegistry]:
    reg = SqliteRegistry(tmp_path / ".viewer" / "jobs.sqlite3")
    yield reg
    reg.close()


@functools.cache
def docker_engine_problem() -> str | None:
    """Why the docker tests cannot run here (no engine, no image, a stale image), or None when they can."""
    try:
        done = subprocess.run(
            ["bash", str(ENGINE_SCRIPT), "check"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {ENGINE_SCRIPT.name} check: {exc}"
    if done.returncode != 0:
        return (done.stdout + done.stderr).strip() or f"{ENGINE_SCRIPT.name} check exited {done.returncode}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``docker`` need the real engine: in CI its absence is a failure, elsewhere a skip that says why."""
    if item.get_closest_marker("docker") is None:
        return
    problem = docker_engine_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the Docker engine is not usable: {problem}", pytrace=False)
    pytest.skip(f"no usable Docker engine: {problem} (scripts/docker-engine.sh up)")
