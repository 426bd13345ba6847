"""The job shepherd (ADR 0004): true outcomes, adoption, and what happens when the shepherd itself dies."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from core_helpers import enqueue_raw, pid_of, poll, wait_running, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus, Liveness, Supervisor
from supervisor.domain import Job, RegistryError, hash_token
from supervisor.execution.shepherd import Spares
from supervisor.execution.subprocess import (
    JobFiles,
    RecordedStart,
    ShepherdClient,
    SubprocessExecutor,
    identify,
    identity_of,
    marker_path,
    prepare_run_dir,
    probe,
    read_exit_file,
    read_marker,
    read_start,
    read_start_file,
)
from supervisor.registry import PromoteRequest


def shepherd_of(sup: Supervisor) -> ShepherdClient:
    assert isinstance(sup.executor, SubprocessExecutor)
    return sup.executor.shepherd


def files_of(sup: Supervisor, job: Job) -> JobFiles:
    """The job's records: in the run directory while this supervisor is connected, else next to its log."""
    return JobFiles.for_job(job, sup.log_dir, shepherd_of(sup).run_dir)


async def run_copies_gone(files: JobFiles) -> bool | None:
    return None if any([await trio.Path(p).exists() for p in files.run_records]) else True


async def test_the_shepherd_records_identity_before_the_program_and_the_true_exit_after(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    """The records, while the supervisor is connected, live in the run directory (tmpfs) until the row is final."""
    sup = make_supervisor()
    assert shepherd_of(sup).run_dir is not None  # the default: /dev/shm/podcast-supervisor-<uid>/<data dir hash>
    gate = tmp_path / "gate"
    job = (await sup.enqueue("gated", {"gate": str(gate), "code": 7})).job
    running = await wait_running(sup, job.job_id)
    files = files_of(sup, running)
    start = read_start_file(files.run_pid)  # type: ignore[arg-type]
    assert start is not None and start.identity is not None
    assert start.identity.to_record() == running.identity
    assert start.shepherd is not None and start.shepherd.pid == shepherd_of(sup).pid
    assert not await trio.Path(files.pid).exists()  # nothing next to the log while a supervisor is connected
    await trio.Path(gate).write_text("open")
    ended = await wait_terminal(sup, job.job_id)
    assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.FAILED, "exit_code_7", 7)
    # The row is final: the registry holds all the records said, and the shepherd drops them.
    await poll(lambda: run_copies_gone(files), timeout_s=10)
    assert not await trio.Path(files.exit).exists()
    assert (await sup.read_log(job.job_id)) == b"gate open\n"


async def test_the_trace_has_every_start_and_exit_on_the_shepherds_clock(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    trace = tmp_path / "shepherd-trace.ndjson"
    sup = make_supervisor(max_concurrent=3, shepherd_trace_file=trace)
    ids = [(await sup.enqueue("exit", {"code": code})).job.job_id for code in (0, 3, 0, 5)]
    ended = {job_id: await wait_terminal(sup, job_id) for job_id in ids}
    lines = [json.loads(line) for line in (await trio.Path(trace).read_text()).splitlines()]
    by_job: dict[str, dict[str, dict[str, object]]] = {}
    for line in lines:
        by_job.setdefault(str(line["job_id"]), {})[str(line["ev"])] = line
    assert set(by_job) == set(ids) and len(lines) == 2 * len(ids)
    for job_id, job in ended.items():
        started, exited = by_job[job_id]["started"], by_job[job_id]["exited"]
        identity = identity_of(job)
        assert identity is not None
        assert (started["pid"], started["start_time"]) == (identity.pid, identity.start_time)
        assert exited["pid"] == identity.pid
        assert exited["exit_code"] == job.exit_code and str(exited["ended_at"]) >= str(started["started_at"])
        assert started["shepherd"] == {"pid": shepherd_of(sup).pid, "start_time": started["shepherd"]["start_time"]}  # type: ignore[index]


async def test_one_shepherd_serves_every_job_of_a_boot(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(max_concurrent=3)
    ids = [(await sup.enqueue("sleep", {"seconds": 30})).job.job_id for _ in range(3)]
    shepherds = set()
    for job_id in ids:
        job = await wait_running(sup, job_id)
        start = read_start(files_of(sup, job))
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
        assert pid_of(job) is not None
        assert probe(identify(pid_of(job))) is Liveness.ALIVE  # type: ignore[arg-type]
        os.killpg(pid_of(job), signal.SIGKILL)
    for job in running:
        ended = await wait_terminal(sup, job.job_id)
        assert (ended.status, ended.error_reason) == (JobStatus.FAILED, "orphan_reconciled_dead_pid")
        assert ended.exit_code is None
    # A new shepherd serves the next job, with its true outcome.
    after = (await sup.enqueue("exit", {"code": 0})).job
    assert (await wait_terminal(sup, after.job_id)).status is JobStatus.SUCCEEDED
    assert shepherd_of(sup).pid not in (None, old_shepherd)


async def test_the_shepherd_exits_once_idle_and_orphaned_its_records_next_to_the_log(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    job = (await sup.enqueue("sleep", {"seconds": 1})).job
    running = await wait_running(sup, job.job_id)
    files = files_of(sup, running)
    start = read_start(files)
    assert start is not None and start.shepherd is not None
    shepherd = start.shepherd
    # Orphan it: end this boot's side of the control socket, as a supervisor crash would.
    assert shepherd_of(sup).pid is not None
    shepherd_of(sup).disconnect()

    async def shepherd_gone() -> bool | None:
        return True if probe(shepherd) is Liveness.DEAD else None

    # Nobody will say "forget" now: the identity record moves next to the log at once, while the job still runs.
    await poll(lambda: run_copies_gone(files), timeout_s=10)
    moved = read_start_file(files.pid)
    assert moved is not None and moved.identity == start.identity
    assert probe(shepherd) is Liveness.ALIVE  # it stays while its job runs (the job ends by itself), then leaves
    await poll(shepherd_gone, timeout_s=20)
    status = read_exit_file(files.exit, pid_of(running))  # written next to the log: no supervisor to tell
    assert status is not None and status.code == 0
    assert not await trio.Path(files.run_exit).exists()  # type: ignore[arg-type]
    assert spares_of(sup.log_dir, shepherd.pid) == []  # it removes its spares as it leaves
    run_dir = shepherd_of(sup).run_dir
    assert run_dir is not None and not await trio.Path(run_dir).exists()  # and its run directory, empty


async def test_a_shepherd_told_to_stop_moves_its_records_next_to_the_logs_first(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """SIGTERM (an orderly shutdown of the machine, say): the run directory (tmpfs) will not survive it."""
    sup = make_supervisor()
    job = (await sup.enqueue("sleep", {"seconds": 60})).job
    running = await wait_running(sup, job.job_id)
    files = files_of(sup, running)
    start = read_start_file(files.run_pid)  # type: ignore[arg-type]
    assert start is not None and start.shepherd is not None
    os.kill(start.shepherd.pid, signal.SIGTERM)

    async def shepherd_gone() -> bool | None:
        return True if probe(start.shepherd) is Liveness.DEAD else None  # type: ignore[arg-type]

    await poll(shepherd_gone, timeout_s=10)
    assert await run_copies_gone(files)
    moved = read_start_file(files.pid)
    assert moved is not None and moved.identity == start.identity
    assert pid_of(running) is not None and probe(identify(pid_of(running))) is Liveness.ALIVE  # type: ignore[arg-type]


async def test_a_prior_boots_job_never_started_goes_back_to_the_queue(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    from core_helpers import insert_running  # type: ignore[import-not-found]

    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", spawned=False)  # no start file, no shepherd: it never ran
    report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert report.details[0].action == "requeued"
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED


async def test_a_boot_killed_after_a_promotion_has_that_job_run_by_the_next_at_once_its_shepherd_answers(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """The boot dies after promoting a job and before its shepherd started it (the start never sent), with
    its shepherd alive (it runs another job). While that shepherd is connected it might still start it: the slot is
    kept. Its marker turns ``closed`` once it has read its supervisor's socket to the end; from then on the next boot
    knows the job never started and runs it, as its first attempt, without any wait."""
    async with trio.open_nursery() as old_boot:
        old = make_supervisor(boot_id="old", max_concurrent=2, attach=old_boot)
        busy = await wait_running(old, (await old.enqueue("sleep", {"seconds": 60})).job.job_id)
        queued = (await old.enqueue("exit", {"code": 0})).job
        marker = marker_path(old.log_dir, "old")
        found = read_marker(marker)  # its shepherd says who it is, and that its supervisor is connected
        assert found is not None and found.connected and found.identity is not None
        assert probe(found.identity) is Liveness.ALIVE
        old_boot.cancel_scope.cancel()  # it dies: its drainer never starts what it is about to promote
    [promoted] = (await old.registry.promote(PromoteRequest(2, "old", [hash_token("t")], old.log_dir))).jobs
    assert promoted.job_id == queued.job_id

    async def closed() -> bool | None:
        found = await trio.to_thread.run_sync(read_marker, marker)
        return True if found is not None and not found.connected else None

    await poll(closed)  # the shepherd has read the end of its socket (it lives on: its job runs)
    new = make_supervisor(boot_id="new", max_concurrent=2)
    details = {d.job_id: d for d in (await new.reconciler.reconcile(stale_marks_live_processes=False)).details}
    assert (details[queued.job_id].action, details[queued.job_id].reason) == ("requeued", "never_started")
    assert details[busy.job_id].action == "keep"  # the live one is adopted, never started twice
    done = await wait_terminal(new, queued.job_id)
    assert (done.status, done.attempts, done.boot_id) == (JobStatus.SUCCEEDED, 1, "new")
    await new.cancel(busy.job_id)
    await wait_terminal(new, busy.job_id, timeout_s=15)


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
    argv = ["/bin/sh", "-c", check, "check", str(shepherd_of(sup).run_dir)]
    job = await enqueue_raw(sup, "exit", {}, argv)
    await sup.drainer.drain()
    ended = await wait_terminal(sup, job.job_id)
    assert ended.status is JobStatus.SUCCEEDED
    recorded, own = (await sup.read_log(job.job_id)).decode().strip().splitlines()
    assert f'"pid": {pid_of(ended)}' in recorded
    assert own == f"self {pid_of(ended)}"  # the program is the very process whose identity was recorded


async def test_a_program_that_cannot_run_fails_its_start_with_execs_reason(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor(max_concurrent=2)
    not_executable = tmp_path / "script"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    denied = await enqueue_raw(sup, "exit", {}, [str(not_executable)])
    unknown = await enqueue_raw(sup, "exit", {}, ["no-such-program-anywhere"])
    await sup.drainer.drain()
    reasons = [(await wait_terminal(sup, r.job_id)).error_reason or "" for r in (denied, unknown)]
    assert reasons[0].startswith("spawn_failed: PermissionError")
    assert reasons[1].startswith("spawn_failed: FileNotFoundError") and "no-such-program-anywhere" in reasons[1]


async def test_a_job_does_not_inherit_the_signals_the_shepherd_ignores(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """The shepherd ignores SIGINT and SIGHUP for itself; an ignored signal would survive exec into every job."""
    sup = make_supervisor()
    job = await enqueue_raw(sup, "exit", {}, ["grep", "^SigIgn", "/proc/self/status"])
    await sup.drainer.drain()
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED
    mask = int((await sup.read_log(job.job_id)).decode().split()[-1], 16)
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        assert not mask & (1 << (signum - 1)), signum


def spares_of(log_dir: Path, shepherd_pid: int | None) -> list[str]:
    """The spare files of one shepherd, oldest first (by their sequence number)."""
    names = [n for n in os.listdir(log_dir) if n.startswith(f"{Spares.PREFIX}{shepherd_pid}-")]
    return sorted(names, key=lambda n: int(n.rsplit("-", 1)[1]))


async def test_records_are_renamed_from_spares_made_while_idle_and_a_dead_shepherds_are_swept(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    # Promotion latency (ADR 0004): making a file is a metadata change; spares made while the shepherd idles leave
    # one rename on the way from a job's exit to the next job's start (wherever the records are written).
    sup = make_supervisor()
    run_dir = shepherd_of(sup).run_dir
    assert run_dir is not None
    run_dir.mkdir(mode=0o700, parents=True)
    proc = await trio.lowlevel.open_process(["true"])  # a pid that no longer runs: a killed shepherd's leftover
    await proc.wait()
    leftover = run_dir / f"{Spares.PREFIX}{proc.pid}-1"
    leftover.touch()
    first = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
    shepherd = shepherd_of(sup).pid

    async def leftover_swept() -> bool | None:
        return True if not await trio.Path(leftover).exists() else None

    await poll(leftover_swept, timeout_s=10)  # swept while idle, after its first write in the directory

    async def spares_ready() -> bool | None:
        return True if len(spares_of(run_dir, shepherd)) == Spares.PER_DIRECTORY else None

    await poll(spares_ready, timeout_s=10)
    before = spares_of(run_dir, shepherd)
    inodes = {(run_dir / name).stat().st_ino for name in before}
    gate = tmp_path / "gate"
    second = await wait_running(sup, (await sup.enqueue("gated", {"gate": str(gate), "code": 3})).job.job_id)
    # Its identity record is the oldest spare, renamed, holding the whole record.
    files = files_of(sup, second)
    assert files.run_pid is not None and files.run_pid.stat().st_ino in inodes
    assert before[0] not in spares_of(run_dir, shepherd)
    start = read_start_file(files.run_pid)
    assert start is not None and start.identity is not None and start.identity.pid == pid_of(second)
    await trio.Path(gate).write_text("open")
    assert (await wait_terminal(sup, second.job_id)).exit_code == 3
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


async def test_a_killed_shepherds_records_are_read_from_the_run_directory_by_the_next_boot(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """INV-IDENTITY-BEFORE-PROGRAM with the record still on tmpfs: the boot died before recording the identity and
    its shepherd was SIGKILLed (so it never moved the record next to the log); the next boot finds it and adopts the
    live job instead of freeing its slot."""
    async with trio.open_nursery() as old_boot:
        old = make_supervisor(boot_id="old", attach=old_boot)

        async def lost(*args: object, **kwargs: object) -> None:
            raise RegistryError("the supervisor died before it recorded the identity")

        monkeypatch.setattr(old.registry, "record_identities", lost)
        job = (await old.enqueue("sleep", {"seconds": 60})).job
        files = JobFiles.for_job(await old.get(job.job_id), old.log_dir, shepherd_of(old).run_dir)

        async def recorded() -> RecordedStart | None:
            return await trio.to_thread.run_sync(read_start_file, files.run_pid)

        start = await poll(recorded)
        assert start.shepherd is not None and start.identity is not None
        shepherd = await trio.to_thread.run_sync(os.pidfd_open, start.shepherd.pid)
        os.kill(start.shepherd.pid, signal.SIGKILL)
        await trio.lowlevel.wait_readable(shepherd)  # gone, with the record where it wrote it
        os.close(shepherd)
        old_boot.cancel_scope.cancel()
    assert not await trio.Path(files.pid).exists() and await trio.Path(files.run_pid).exists()  # type: ignore[arg-type]

    new = make_supervisor(boot_id="new")
    [detail] = (await new.reconciler.reconcile(stale_marks_live_processes=False)).details
    assert (detail.action, detail.reason, detail.liveness) == ("keep", "adopted", "alive")
    adopted = await new.get(job.job_id)
    assert adopted.identity == start.identity.to_record()
    await new.cancel(job.job_id)
    ended = await wait_terminal(new, job.job_id, timeout_s=15)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")
    await poll(lambda: run_copies_gone(files), timeout_s=10)  # final: the dead shepherd's leftovers go too


async def test_without_a_run_directory_the_records_are_written_next_to_the_log(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(run_dir="off")
    assert shepherd_of(sup).run_dir is None
    ended = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 4})).job.job_id)
    files = JobFiles.for_job(ended, sup.log_dir)
    assert files.run_records == ()
    start = read_start_file(files.pid)
    assert start is not None and start.identity is not None and start.identity.pid == pid_of(ended)
    status = read_exit_file(files.exit, pid_of(ended))
    assert status is not None and status.code == 4


async def test_a_run_directory_others_can_write_to_is_refused_naming_the_setting(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    """A record planted there would be read as a job's identity: the start fails, clearly; nothing runs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    sup = make_supervisor(run_dir=str(shared / "run"))
    (shared / "run").mkdir()
    (shared / "run").chmod(0o777)
    ended = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
    assert ended.status is JobStatus.FAILED and pid_of(ended) is None
    assert ended.error_reason is not None and "PODCAST_JOB_RUN_DIR" in ended.error_reason
    assert "nobody else can write to" in ended.error_reason


def test_prepare_run_dir_makes_it_private_and_checks_down_from_the_private_root(tmp_path: Path) -> None:
    root = tmp_path / "mine"
    run = root / "abc"
    prepare_run_dir(run, root)
    assert run.is_dir() and (run.stat().st_mode & 0o777, root.stat().st_mode & 0o777) == (0o700, 0o700)
    root.chmod(0o733)  # someone could swap the leaf: refused though the leaf itself is fine
    with pytest.raises(PermissionError, match="nobody else can write to"):
        prepare_run_dir(run, root)
    root.chmod(0o700)
    run.rmdir()
    run.symlink_to(tmp_path)
    with pytest.raises(PermissionError):
        prepare_run_dir(run, root)
