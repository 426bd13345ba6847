"""``supervisor serve`` and the console entry point as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from serve_process import serve_process, stop  # type: ignore[import-not-found]

from supervisor import SqliteRegistry
from supervisor.api import HttpLimits
from supervisor.cli import EXIT_CONFIG, EXIT_OK

GRACEFUL_TIMEOUT_S = HttpLimits().graceful_timeout_s

REPO_ROOT = Path(__file__).resolve().parents[2]
START_LIMIT_S = 20.0


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PODCAST_JOB_DATA_DIR"] = str(tmp_path / "data")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(START_LIMIT_S):
        return await trio.run_process(
            [sys.executable, "-m", "supervisor", *args],
            env=env,
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def test_serve_refuses_a_non_loopback_bind_without_a_token(tmp_path: Path) -> None:
    done = await run_cli(["serve"], cli_env(tmp_path, PODCAST_JOB_BIND="0.0.0.0:0"), tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert b"refusing to serve on 0.0.0.0:0 without a token: set PODCAST_JOB_API_TOKEN(_FILE)" in done.stderr
    assert not (tmp_path / "data" / ".viewer").exists()  # refused before touching anything


async def test_serve_answers_the_cli_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(tmp_path, PODCAST_JOB_BIND=url.removeprefix("http://"), PODCAST_JOB_URL=url)
    async with serve_process(env, tmp_path, tmp_path / "serve.log") as process:
        async with httpx.AsyncClient(timeout=5.0) as client:
            with trio.fail_after(START_LIMIT_S):
                while True:
                    try:
                        if (await client.get(f"{url}/api/health", timeout=5.0)).status_code == 200:
                            break
                    except httpx.ConnectError:
                        pass
                    await trio.sleep(0.05)  # polling for the server to come up, under the deadline above

        listed = await run_cli(["jobs", "--json"], env, tmp_path)
        assert listed.returncode == EXIT_OK, listed.stderr
        assert listed.stdout.startswith(b"{")

        assert await stop(process, GRACEFUL_TIMEOUT_S + 5) == 0
    output = (tmp_path / "serve.log").read_text()
    assert "supervisor_stopped" in output
    # Everything the server process wrote is one JSON object per line (a log pipeline's contract).
    assert [type(json.loads(line)) for line in output.splitlines()] == [dict] * len(output.splitlines())


FOREIGN = """
import logging, warnings
from supervisor.observe import configure_logging, get_logger
configure_logging()
get_logger().info("ours", n=1)
pool = logging.getLogger("urllib3.connectionpool")
pool.warning("Connection pool is full, discarding connection: %s. Connection pool size: %s", "localhost", 64)
pool.info("a library's INFO: not the operator's")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=True)
warnings.warn("something odd", RuntimeWarning)
"""


def test_other_libraries_logs_and_python_warnings_are_json_lines_like_the_servers_own(tmp_path: Path) -> None:
    """What `serve` configures: the standard-library logging of the libraries in its process, from WARNING up, and
    Python's warnings, rendered as its own lines are (before: plain text, a traceback over several lines)."""
    done = subprocess.run(
        [sys.executable, "-c", FOREIGN], env=cli_env(tmp_path), capture_output=True, text=True, timeout=30, check=True
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(e["event"].split(":")[0], e["level"], e.get("logger")) for e in lines] == [
        ("ours", "info", None),
        ("Connection pool is full, discarding connection", "warning", "urllib3.connectionpool"),
        ("Task exception was never retrieved", "error", "asyncio"),
        (lines[3]["event"].split(":")[0], "warning", "py.warnings"),
    ]
    assert lines[2]["exception"].endswith("ZeroDivisionError: division by zero")
    assert "RuntimeWarning: something odd" in lines[3]["event"]
    assert all("timestamp" in e for e in lines)


async def test_serve_runs_docker_mode_and_pins_it_in_its_start_line_and_health(tmp_path: Path) -> None:
    """Serve no longer refuses docker mode. Starting needs no engine: the client does no I/O until a job
    runs (the engine's absence is then UNKNOWN, never a failed start)."""
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(
        tmp_path,
        PODCAST_JOB_BIND=url.removeprefix("http://"),
        PODCAST_PIPELINE_EXEC_MODE="docker",
        PODCAST_JOB_HEARTBEAT_BASE_URL="http://supervisor.example:8000/",
        DOCKER_HOST="unix:///nonexistent/docker.sock",
    )
    async with serve_process(env, tmp_path, tmp_path / "serve.log") as process:
        async with httpx.AsyncClient(timeout=5.0) as client:
            with trio.fail_after(START_LIMIT_S):
                while True:
                    try:
                        health = await client.get(f"{url}/api/health", timeout=5.0)
                        break
                    except httpx.ConnectError:
                        await trio.sleep(0.05)  # polling for the server to come up, under the deadline above
        assert health.json()["exec_mode"] == "docker"
        assert await stop(process, GRACEFUL_TIMEOUT_S + 5) == 0
    lines = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines() if line.startswith("{")]
    [started] = [line for line in lines if line["event"] == "supervisor_started"]
    assert (started["exec_mode"], started["url"], started["heartbeat_base_url"]) == (
        "docker",
        url,
        "http://supervisor.example:8000",
    )


def _newer_registry(path: Path) -> None:
    """A registry file a newer release contracted (a downgrade after an upgrade's last step)."""
    SqliteRegistry(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "INSERT INTO schema_migrations SELECT MAX(version) + 1, 'x.sql', 'contract', '' FROM schema_migrations"
        )


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("damaged", "is damaged (file is not a database): it was not opened for writing and has not been changed"),
        ("newer", "contracted by a newer release"),
        ("data_dir_is_a_file", "its directory cannot be made (Not a directory: {data} is a file)"),
    ],
)
async def test_a_registry_that_cannot_be_opened_ends_serve_in_one_line_with_exit_3_and_is_left_untouched(
    tmp_path: Path, case: str, expected: str
) -> None:
    """Every foreseeable way the registry cannot be opened was a Python traceback and exit 1."""
    data = tmp_path / "data"
    registry = data / ".viewer" / "jobs.sqlite3"
    if case == "data_dir_is_a_file":
        data.write_text("a file where the data dir goes")
        registry = data
    else:
        registry.parent.mkdir(parents=True)
        if case == "damaged":
            registry.write_bytes(b"not a database at all\n" * 100)
        else:
            _newer_registry(registry)
    before = registry.read_bytes()
    done = await run_cli(["serve"], cli_env(tmp_path, PODCAST_JOB_BIND="127.0.0.1:0"), tmp_path)
    lines = done.stderr.decode().splitlines()
    # A newer release's contract has its own code (5: the unit does not restart it); the others are the operator's.
    assert done.returncode == (5 if case == "newer" else EXIT_CONFIG), done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expected.format(data=data) in lines[0]
    assert registry.read_bytes() == before  # untouched
    if case != "data_dir_is_a_file":  # and nothing made beside it (no -wal, no -shm)
        assert await trio.to_thread.run_sync(lambda: [p.name for p in registry.parent.iterdir()]) == [registry.name]


async def test_serve_raises_its_open_files_soft_limit_and_fits_its_connection_bound_to_it(tmp_path: Path) -> None:
    """A soft limit of 1,024 descriptors (the usual default) meant EMFILE for every client past it, and
    for the jobs' starts. ``serve`` raises its soft limit to the hard one, and bounds its connections to what fits."""
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(tmp_path, PODCAST_JOB_BIND=url.removeprefix("http://"))
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            ["sh", "-c", f"ulimit -Sn 300 && ulimit -Hn 600 && exec {sys.executable} -m supervisor serve"],
            env=env, cwd=tmp_path, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        with trio.fail_after(START_LIMIT_S):
            while "supervisor_started" not in log_path.read_text():
                assert process.returncode is None, log_path.read_text()
                await trio.sleep(0.05)  # polling for the server to come up, under the deadline above
        limits = await trio.Path(f"/proc/{process.pid}/limits").read_text()
        [line] = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert line.split()[3:5] == ["600", "600"]  # soft raised to hard
        [bounded] = [
            json.loads(text) for text in log_path.read_text().splitlines() if "http_connections_bounded" in text
        ]
        assert bounded["max_connections"] == 600 - 256 and bounded["open_files"] == 600
        assert await stop(process, GRACEFUL_TIMEOUT_S + 5) == 0
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
