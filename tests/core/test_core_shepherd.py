"""The job shepherd (issue 10): true outcomes, adoption, and what happens when the shepherd itself dies."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import trio
from core_helpers import poll, wait_running, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus
from supervisor._core import Supervisor
from supervisor._identity import Liveness, identify, probe
from supervisor.execution.shepherd import Spares
from supervisor.execution.subprocess import (
    START_RECORD_GRACE_S,
    JobFiles,
    Shepherd,
    SubprocessExecutor,
    read_exit_file,
    read_start_file,
)


def shepherd_of(sup: Supervisor) -> Shepherd:
    assert isinstance(sup.executor, SubprocessExecutor)
    return sup.executor.shepherd


async def test_the_shepherd_records_identity_before_the_program_and_the_true_exit_after(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    job = (await sup.enqueue("exit", {"code": 7})).job
    ended = await wait_terminal(sup, job.job_id)
    assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.FAILED, "exit_code_7", 7)
    files = JobFiles.for_job(ended, sup.log_dir)
    start = read_start_file(files.pid)
    assert start is not None and start.identity is not None
    assert (start.identity.pid, start.identity.start_time) == (ended.pid, ended.pid_start_time)
    assert start.shepherd is not None and start.shepherd.pid == shepherd_of(sup).pid
    status = read_exit_file(files.exit, ended.pid)
    assert status is not None and (status.code, status.signal) == (7, None)
    assert (await sup.read_log(job.job_id)) == b"bye\n"


async def test_one_shepherd_serves_every_job_of_a_boot(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(max_concurrent=3)
    ids = [(await sup.enqueue("exit", {"code": 0})).job.job_id for _ in range(6)]
    shepherds = set()
    for job_id in ids:
        job = await wait_terminal(sup, job_id)
        start = read_start_file(JobFiles.for_job(job, sup.log_dir).pid)
        assert start is not None and start.shepherd is not None
        shepherds.add(start.shepherd.pid)
    assert shepherds == {shepherd_of(sup).pid}


async def test_shepherd_sigkilled_jobs_end_orphaned_never_guessed_and_a_new_shepherd_serves_new_jobs(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(max_concurrent=2)
    jobs = [(await sup.enqueue("sleep", {"seconds": 60})).job for _ in range(2)]
    running = [await wait_running(sup, j.job_id) for j in jobs]
    old_shepherd = shepherd_of(sup).pid
    assert old_shepherd is not None
    os.kill(old_shepherd, signal.SIGKILL)
    # The jobs outlive their shepherd; their monitors fall back to pidfds. Now they die, and nobody records how.
    for job in running:
        assert job.pid is not None
        assert probe(identify(job.pid)) is Liveness.ALIVE  # type: ignore[arg-type]
        os.killpg(job.pid, signal.SIGKILL)
    for job in running:
        ended = await wait_terminal(sup, job.job_id)
        assert (ended.status, ended.error_reason) == (JobStatus.FAILED, "orphan_reconciled_dead_pid")
        assert ended.exit_code is None
    # A new shepherd serves the next job, with its true outcome.
    after = (await sup.enqueue("exit", {"code": 0})).job
    assert (await wait_terminal(sup, after.job_id)).status is JobStatus.SUCCEEDED
    assert shepherd_of(sup).pid not in (None, old_shepherd)


async def test_the_shepherd_exits_once_idle_and_orphaned(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    job = (await sup.enqueue("sleep", {"seconds": 0.5})).job
    running = await wait_running(sup, job.job_id)
    start = read_start_file(JobFiles.for_job(running, sup.log_dir).pid)
    assert start is not None and start.shepherd is not None
    shepherd = start.shepherd
    # Orphan it: end this boot's side of the control socket, as a supervisor crash would.
    assert shepherd_of(sup)._conn is not None
    shepherd_of(sup)._conn.sock.shutdown(socket.SHUT_RDWR)

    async def shepherd_gone() -> bool | None:
        return True if probe(shepherd) is Liveness.DEAD else None

    # It stays while its job runs (the job ends by itself), then leaves.
    assert probe(shepherd) is Liveness.ALIVE
    await poll(shepherd_gone, timeout_s=20)
    assert read_exit_file(JobFiles.for_job(running, sup.log_dir).exit, running.pid) is not None
    assert spares_of(sup.log_dir, shepherd.pid) == []  # it removes its spares as it leaves


async def test_a_prior_boots_job_never_started_is_still_a_spawn_window_orphan(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    from core_helpers import age_started, insert_running  # type: ignore[import-not-found]

    sup = make_supervisor(boot_id="new")
    job = await insert_running(sup, boot_id="old", spawned=False)  # no start file: it never ran
    age_started(sup, job.job_id, START_RECORD_GRACE_S + 5)  # and long enough ago that no start is under way
    await sup.reconcile(stale_marks_live_processes=False)
    ended = await sup.get(job.job_id)
    assert (ended.status, ended.error_reason) == (JobStatus.FAILED, "orphan_reconciled_spawn_window")


async def test_a_job_leaving_a_daemon_on_its_output_is_still_finalized(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    with trio.fail_after(30):
        job = (await sup.enqueue("daemonizer", {})).job
        ended = await wait_terminal(sup, job.job_id)
    assert ended.status is JobStatus.SUCCEEDED
    assert (await sup.read_log(job.job_id)).startswith(b"parent done")


async def test_the_program_finds_its_identity_on_disk_when_it_starts_INV_IDENTITY_BEFORE_PROGRAM(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """The job's first instruction already sees its ``<id>.pid`` (the gate shell waits for it), naming its own pid."""
    sup = make_supervisor()
    check = 'cat "$1/$PODCAST_JOB_ID.pid"; echo; echo "self $$"'
    argv = ["/bin/sh", "-c", check, "check", str(sup.log_dir)]
    job = (await sup.registry.enqueue("exit", {}, argv, coalesce_key=None)).job
    await sup.drain()
    ended = await wait_terminal(sup, job.job_id)
    assert ended.status is JobStatus.SUCCEEDED
    recorded, own = (await sup.read_log(job.job_id)).decode().strip().splitlines()
    assert f'"pid": {ended.pid}' in recorded
    assert own == f"self {ended.pid}"  # the program is the very process whose identity was recorded


async def test_a_program_that_cannot_run_fails_its_start_with_execs_reason(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor(max_concurrent=2)
    not_executable = tmp_path / "script"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    denied = await sup.registry.enqueue("exit", {}, [str(not_executable)], coalesce_key=None)
    unknown = await sup.registry.enqueue("exit", {}, ["no-such-program-anywhere"], coalesce_key=None)
    await sup.drain()
    reasons = [(await wait_terminal(sup, r.job.job_id)).error_reason or "" for r in (denied, unknown)]
    assert reasons[0].startswith("spawn_failed: PermissionError")
    assert reasons[1].startswith("spawn_failed: FileNotFoundError") and "no-such-program-anywhere" in reasons[1]


async def test_a_job_does_not_inherit_the_signals_the_shepherd_ignores(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """The shepherd ignores SIGINT and SIGHUP for itself; an ignored signal would survive exec into every job."""
    sup = make_supervisor()
    job = (await sup.registry.enqueue("exit", {}, ["grep", "^SigIgn", "/proc/self/status"], coalesce_key=None)).job
    await sup.drain()
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED
    mask = int((await sup.read_log(job.job_id)).decode().split()[-1], 16)
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        assert not mask & (1 << (signum - 1)), signum


def spares_of(log_dir: Path, shepherd_pid: int | None) -> list[str]:
    """The spare files of one shepherd, oldest first (by their sequence number)."""
    names = [n for n in os.listdir(log_dir) if n.startswith(f"{Spares.PREFIX}{shepherd_pid}-")]
    return sorted(names, key=lambda n: int(n.rsplit("-", 1)[1]))


async def test_state_files_are_renamed_from_spares_made_while_idle_and_a_dead_shepherds_are_swept(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    # Issue 10 (promotion latency): making a file is a metadata change that cost up to a millisecond here; spares
    # made while the shepherd idles leave one rename on the way from a job's exit to the next job's start.
    sup = make_supervisor()
    sup.log_dir.mkdir(parents=True)
    proc = await trio.lowlevel.open_process(["true"])  # a pid that no longer runs: a killed shepherd's leftover
    await proc.wait()
    leftover = sup.log_dir / f"{Spares.PREFIX}{proc.pid}-1"
    leftover.touch()
    first = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
    shepherd = shepherd_of(sup).pid

    async def leftover_swept() -> bool | None:
        return True if not await trio.Path(leftover).exists() else None

    await poll(leftover_swept, timeout_s=10)  # swept while idle, after its first write in the directory

    async def spares_ready() -> bool | None:
        return True if len(spares_of(sup.log_dir, shepherd)) == Spares.PER_DIRECTORY else None

    await poll(spares_ready, timeout_s=10)
    before = spares_of(sup.log_dir, shepherd)
    inodes = {(sup.log_dir / name).stat().st_ino for name in before}
    second = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 3})).job.job_id)
    # Its two state files are two of the spares, renamed (the oldest first), holding the whole records.
    files = JobFiles.for_job(second, sup.log_dir)
    assert set(before) - set(spares_of(sup.log_dir, shepherd)) == set(before[:2])
    assert {files.pid.stat().st_ino, files.exit.stat().st_ino} <= inodes
    start = read_start_file(files.pid)
    assert start is not None and start.identity is not None and start.identity.pid == second.pid
    status = read_exit_file(files.exit, second.pid)
    assert status is not None and status.code == 3
    assert first.status is JobStatus.SUCCEEDED
    await poll(spares_ready, timeout_s=10)  # made again, while idle


async def test_a_silent_jobs_log_file_is_made_only_at_its_first_output(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    silent = await wait_terminal(sup, (await sup.enqueue("sleep", {"seconds": 0.05})).job.job_id)
    assert silent.status is JobStatus.SUCCEEDED and silent.log_path is not None
    assert not await trio.Path(silent.log_path).exists()  # no file made on the way to its start
    assert await sup.read_log(silent.job_id) == b""
    talking = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
    assert talking.log_path is not None and await trio.Path(talking.log_path).read_bytes() == b"bye\n"
