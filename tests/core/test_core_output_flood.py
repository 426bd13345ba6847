"""A job that floods its output at full speed, under the real ``supervisor serve``: the shepherd keeps draining it
into a capped log, so neither its memory nor the supervisor's grows with the output, and the job is never blocked
on a full pipe (it runs its whole time and exits 0)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio
from core_helpers import KINDS, pid_of, poll, serve_env  # type: ignore[import-not-found]

from supervisor import Job, JobStatus, Liveness, SqliteRegistry
from supervisor.domain import parse_kind
from supervisor.execution.subprocess import identity_of, probe
from supervisor.registry import NewJob

MIB = 1024 * 1024
LOG_CAP = MIB
FLOOD_S = 2.0
# Generous: the point is "does not grow with the output" (hundreds of MiB go through), not a tight figure.
RSS_GROWTH_CAP = 24 * MIB

FLOOD_KINDS = (
    KINDS
    + '''
[kinds.flood]
argv = ["{python}", "-c", """
import os, sys, time
chunk = b"y" * 65536 + b"\\\\n"
start = time.monotonic()
written = 0
while time.monotonic() - start < float(sys.argv[1]):
    for fd in (1, 2):
        written += os.write(fd, chunk)
with open(sys.argv[2], "w") as fh:
    fh.write(f"{written} {time.monotonic() - start}")
""", "{seconds}", "{report}"]
params = { seconds = "float", report = "str" }
'''
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return serve_env(tmp_path, FLOOD_KINDS, PODCAST_JOB_LOG_MAX_BYTES=str(LOG_CAP))


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SqliteRegistry]:
    reg = SqliteRegistry(tmp_path / "data" / ".viewer" / "jobs.sqlite3")
    yield reg
    for job in await reg.running_jobs():  # jobs outlive supervisors by design: stop what a failed test left
        identity = identity_of(job)
        if identity is not None and probe(identity) is Liveness.ALIVE:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid_of(job), signal.SIGKILL)
    await reg.aclose()


async def _enqueue(registry: SqliteRegistry, kind: str, params: dict[str, object]) -> str:
    parsed = parse_kind(kind, tomllib.loads(FLOOD_KINDS)["kinds"][kind])
    validated = parsed.validate_params(params)
    result = await registry.enqueue(NewJob(kind, validated, parsed.render_argv(validated)))
    return result.job.job_id


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def _shepherd_pid(server_log: Path) -> int:
    for line in server_log.read_text().splitlines():
        if '"shepherd_started"' in line:
            return int(json.loads(line)["pid"])
    raise AssertionError("no shepherd_started line")


@pytest.mark.e2e
async def test_a_job_flooding_its_output_runs_its_full_time_into_a_capped_log_with_flat_memory(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry, tmp_path: Path
) -> None:
    server = await start_server()  # type: ignore[misc]
    supervisor_pid = server.proc.pid  # type: ignore[attr-defined]

    async def ended(job_id: str) -> Job | None:
        job = await registry.get(job_id)
        return job if job.status.is_terminal else None

    # A first job starts the shepherd and warms both processes: "before" is their steady state.
    warm_id = await _enqueue(registry, "exit", {"code": 0})
    warm = await poll(lambda: ended(warm_id))
    assert warm.status is JobStatus.SUCCEEDED
    shepherd_pid = await trio.to_thread.run_sync(_shepherd_pid, server.log)  # type: ignore[attr-defined]
    pids = {"supervisor": supervisor_pid, "shepherd": shepherd_pid}
    before = {name: await trio.to_thread.run_sync(_status_kib, pid, "VmRSS") for name, pid in pids.items()}

    report = tmp_path / "flood-report"
    flood_id = await _enqueue(registry, "flood", {"seconds": FLOOD_S, "report": str(report)})
    during = dict(before)

    async def flood_ended() -> Job | None:
        for name, pid in pids.items():  # sampled at every look, and the kernel's high-water mark after
            during[name] = max(during[name], await trio.to_thread.run_sync(_status_kib, pid, "VmRSS"))
        return await ended(flood_id)

    flood = await poll(flood_ended, timeout_s=FLOOD_S + 30)
    peak = {name: await trio.to_thread.run_sync(_status_kib, pid, "VmHWM") for name, pid in pids.items()}
    after = {name: await trio.to_thread.run_sync(_status_kib, pid, "VmRSS") for name, pid in pids.items()}
    written, ran_s = (await trio.Path(report).read_text()).split()
    print(f"flood: {int(written) / MIB:.0f} MiB in {float(ran_s):.2f} s")
    for name in pids:
        print(
            f"{name}: VmRSS before {before[name] / MIB:.1f} MiB, max during {during[name] / MIB:.1f} MiB, "
            f"after {after[name] / MIB:.1f} MiB; VmHWM {peak[name] / MIB:.1f} MiB"
        )

    # Not blocked, not killed: it ran its whole time and exited 0, the shepherd reading all along.
    assert (flood.status, flood.exit_code) == (JobStatus.SUCCEEDED, 0)
    assert float(ran_s) >= FLOOD_S
    assert int(written) > 16 * LOG_CAP  # the reader went on draining past the cap
    # The log holds the first LOG_CAP bytes and the note that the rest was discarded.
    assert flood.log_path is not None
    log = await trio.Path(flood.log_path).read_bytes()
    note = f"\n[log capped at {LOG_CAP} bytes; further output discarded]\n".encode()
    assert len(log) == LOG_CAP + len(note) and log.endswith(note)
    # Memory does not grow with the output: bounded during and after.
    for name in pids:
        assert during[name] - before[name] < RSS_GROWTH_CAP, name
        assert after[name] - before[name] < RSS_GROWTH_CAP, name
    assert peak["shepherd"] - before["shepherd"] < RSS_GROWTH_CAP  # its peak since it started, between looks too
