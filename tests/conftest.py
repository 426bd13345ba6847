"""Fixtures shared by every test package, and the gates for tests marked ``docker``, ``postgres`` and ``longrun``."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
from pathlib import Path

import asyncpg
import pytest

# Fixtures shared by more than one test package: the core's (a supervisor on a job nursery, its config; for
# tests/core and tests/execution), and the API's (a supervisor behind the test client, a live server; for tests/api
# and tests/cli). Their helpers are modules beside them (core_helpers, core_executors, core_engine, api_support).
pytest_plugins = ["core_fixtures", "api_fixtures"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--longrun", action="store_true", help="run the tests marked longrun (minutes each)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long runs are deselected (not skipped: nothing is owed) unless ``--longrun`` asks for them."""
    if config.getoption("--longrun"):
        return
    long = [item for item in items if item.get_closest_marker("longrun")]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if not item.get_closest_marker("longrun")]
ENGINE_SCRIPT = REPO_ROOT / "scripts" / "docker-engine.sh"


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


TEST_DATABASE_URL_VAR = "PODCAST_JOB_TEST_DATABASE_URL"
TEST_POOLER_URL_VAR = "PODCAST_JOB_TEST_PGBOUNCER_URL"


@functools.cache
def postgres_problem(variable: str = TEST_DATABASE_URL_VAR) -> str | None:
    """Why the postgres tests cannot run here (no server named, or it does not answer), or None when they can;
    ``variable``: the environment variable that names it (the pgbouncer tests': the pooler in front of it)."""
    dsn = os.environ.get(variable)
    if not dsn:
        return f"{variable} is unset"

    async def probe() -> None:
        conn = await asyncpg.connect(dsn, timeout=10)
        await conn.close()

    try:
        asyncio.run(probe())
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return f"{variable} names a server that does not answer: {type(exc).__name__}: {exc}"
    return None


def _require(problem: str | None, *, fail_as: str, skip_as: str, how: str) -> None:
    """A real service a test needs, and ``problem``, why it cannot be used (None: it can): in CI a failure, elsewhere
    a skip that says why and how to start it."""
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {fail_as}: {problem}", pytrace=False)
    pytest.skip(f"{skip_as}: {problem} ({how})")


def alerting_problem() -> str | None:
    """Why the alerting tests cannot run here (a binary missing), or None when they can."""
    missing = [name for name in ("victoria-metrics", "vmalert") if shutil.which(name) is None]
    if shutil.which("prometheus-alertmanager") is None and shutil.which("alertmanager") is None:
        missing.append("alertmanager")
    return f"not installed: {', '.join(missing)}" if missing else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``docker`` (``postgres``, ``pgbouncer``, ``alerting``) need the real engine (server, pooler,
    alerting stack): in CI its absence is a failure, elsewhere a skip that says why."""
    if item.get_closest_marker("alerting") is not None:
        _require(
            alerting_problem(),
            fail_as="the alerting stack is not installed",
            skip_as="no alerting stack",
            how="apt-get install victoria-metrics prometheus-alertmanager",
        )
    if item.get_closest_marker("docker") is not None:
        _require(
            docker_engine_problem(),
            fail_as="the Docker engine is not usable",
            skip_as="no usable Docker engine",
            how="scripts/docker-engine.sh up",
        )
    if item.get_closest_marker("postgres") is not None:
        _require(
            postgres_problem(),
            fail_as="no usable PostgreSQL server",
            skip_as="no usable PostgreSQL server",
            how=f"{TEST_DATABASE_URL_VAR}=$(bash scripts/postgres.sh up) names the local one",
        )
    if item.get_closest_marker("pgbouncer") is not None:
        _require(
            postgres_problem(TEST_POOLER_URL_VAR),
            fail_as="no usable pgbouncer",
            skip_as="no usable pgbouncer in transaction mode",
            how=f"{TEST_POOLER_URL_VAR}=$(bash scripts/pgbouncer.sh up) names the local one",
        )
