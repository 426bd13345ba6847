"""Staging directories name their owner; a run removes those whose owner is provably gone, and only those.

Most cases run against a fake /proc (a directory tree), so every verdict is deterministic; the last ones use the
real /proc with real child processes. A SIGKILLed run and the next run are in test_runner_e2e.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from pipeline_runner import Corpus
from pipeline_runner import _staging as staging
from pipeline_runner._staging import ProcessIdentity, Verdict

BOOT = "0b2f3c4d-5e6f-4a1b-8c9d-0e1f2a3b4c5d"
OTHER_BOOT = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
NS = 4026531836
# Above PID_MAX_LIMIT (2**22): no process can ever have it, so kill(pid, 0) says "no such process", always.
NEVER_A_PID = 2**22 + 1
# The fake /proc's processes get pids no real process can have either, so none of them is this test's own pid.
ME = ProcessIdentity(BOOT, NS, 2**22 + 42, 1000)
RUNNING, UNREADABLE, GARBAGE = 2**22 + 77, 2**22 + 88, 2**22 + 99


def write_stat(proc: Path, entry: int | str, pid: int, start: int, *, comm: str = "python3") -> None:
    # After "pid (comm)": field 3 (state) first, field 22 (start time) the 20th.
    after = ["S", *["0"] * 18, str(start), *["0"] * 30]
    (proc / str(entry)).mkdir(parents=True, exist_ok=True)
    (proc / str(entry) / "stat").write_text(f"{pid} ({comm}) {' '.join(after)}\n")


def fake_proc(tmp_path: Path, me: ProcessIdentity = ME) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(me.boot_id + "\n")
    (proc / "self" / "ns").mkdir(parents=True)
    os.symlink(f"pid:[{me.pid_ns}]", proc / "self" / "ns" / "pid")
    write_stat(proc, "self", me.pid, me.start_ticks, comm="pipeline-runner (x) y")
    write_stat(proc, me.pid, me.pid, me.start_ticks)
    return proc


JOB_IDS = [
    "job-1",
    "a.b.c",
    "local-20250101T000000Z-17",
    "j@x",
    "naïve",
    "x" * 300,
    "x" + "é" * 200,  # cut inside a character
    "bad\udcffbytes",  # an undecodable byte from the command line
    f"job.{ME.tag()}.0",  # a job id that looks like an owner
]


@pytest.mark.parametrize("job_id", JOB_IDS)
def test_the_owner_is_read_back_from_the_name(tmp_path: Path, job_id: str) -> None:
    name = staging.staging_name(job_id, ME)
    assert staging.owner_of(name) == ME
    (tmp_path / name).mkdir()  # a long job id is cut: the name stays a valid file name
    assert staging.owner_of(next(tmp_path.iterdir()).name) == ME
    assert staging.staging_name(job_id, ME) != name  # one directory per attempt


@pytest.mark.parametrize(
    "name",
    [
        "job-1-0123456789ab",  # the old format: no owner
        staging.staging_name("job-1", None),  # a run that could not read its own identity
        f"job-1.{ME.tag()}",  # no random part
        f"job-1.boot-{BOOT}.pidns-{NS}.pid-0.start-1.0123456789ab",  # pid 0 is nobody
        f"job-1.boot-not-a-boot-id.pidns-{NS}.pid-7.start-1.0123456789ab",
    ],
    # Fixed ids: one name has a random part, and every pytest-xdist worker must collect the same tests.
    ids=["old-format", "no-identity", "no-random-part", "pid-0", "not-a-boot-id"],
)
def test_names_without_an_owner(name: str) -> None:
    assert staging.owner_of(name) is None


def test_own_identity_from_proc(tmp_path: Path) -> None:
    """The command name may hold ') (': the fields are read after the last ')'."""
    assert staging.read_own_identity(fake_proc(tmp_path)) == ME


def test_no_identity_when_proc_cannot_be_read(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    (proc / "self" / "ns" / "pid").unlink()
    assert staging.read_own_identity(proc) is None
    assert staging.read_own_identity(tmp_path / "nowhere") is None


@pytest.mark.parametrize(
    ("owner", "verdict"),
    [
        (ME, Verdict.ALIVE),  # this run
        (ProcessIdentity(OTHER_BOOT, NS, ME.pid, ME.start_ticks), Verdict.DEAD),  # before a reboot, even with my pid
        (ProcessIdentity(BOOT, NS, NEVER_A_PID, 5), Verdict.DEAD),  # no such pid
        (ProcessIdentity(BOOT, NS, RUNNING, 999), Verdict.DEAD),  # the pid was recycled: it started at 500
        (ProcessIdentity(BOOT, NS, ME.pid, 999), Verdict.DEAD),  # my pid, but not me: an earlier process had it
        (ProcessIdentity(BOOT, NS, RUNNING, 500), Verdict.ALIVE),  # the process as it started: running
        (ProcessIdentity(BOOT, NS + 1, NEVER_A_PID, 5), Verdict.UNKNOWN),  # another PID namespace: not judged
        (ProcessIdentity(BOOT, NS, UNREADABLE, 5), Verdict.UNKNOWN),  # its stat cannot be read
        (ProcessIdentity(BOOT, NS, GARBAGE, 5), Verdict.UNKNOWN),  # its stat is garbage
        (ProcessIdentity(BOOT, NS, os.getpid(), 5), Verdict.UNKNOWN),  # no /proc entry, but the pid exists
    ],
)
def test_verdicts(tmp_path: Path, owner: ProcessIdentity, verdict: Verdict) -> None:
    proc = fake_proc(tmp_path)
    write_stat(proc, RUNNING, RUNNING, 500)
    (proc / str(UNREADABLE) / "stat").mkdir(parents=True)  # reading it fails (EISDIR)
    (proc / str(GARBAGE)).mkdir()
    (proc / str(GARBAGE) / "stat").write_text(f"{GARBAGE} (x) S 1 2\n")
    got, why = staging.judge(owner, ME, proc)
    assert got is verdict, why


def plant(root: Path, job_id: str, owner: ProcessIdentity | None) -> str:
    name = staging.staging_name(job_id, owner)
    (root / name / "partial").mkdir(parents=True)
    (root / name / "partial" / "audio.bin").write_bytes(b"half")
    return name


async def test_a_run_removes_only_what_provably_dead_owners_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = fake_proc(tmp_path)
    write_stat(proc, RUNNING, RUNNING, 500)
    corpus = Corpus(tmp_path / "corpus", proc=proc)
    await corpus.ensure_layout()
    root = corpus.staging_root
    dead = [
        plant(root, "rebooted", ProcessIdentity(OTHER_BOOT, NS, RUNNING, 500)),
        plant(root, "vanished", ProcessIdentity(BOOT, NS, NEVER_A_PID, 5)),
        plant(root, "recycled", ProcessIdentity(BOOT, NS, RUNNING, 499)),
    ]
    kept = [
        plant(root, "mine", ME),
        plant(root, "running", ProcessIdentity(BOOT, NS, RUNNING, 500)),
        plant(root, "container", ProcessIdentity(BOOT, NS + 1, NEVER_A_PID, 5)),
        plant(root, "hidden", ProcessIdentity(BOOT, NS, os.getpid(), 5)),
    ]
    old = ["job-0-0123456789ab", "job-0-ba9876543210", "job-1-aaaaaaaaaaaa"]
    for name in old:
        (root / name).mkdir()
    (root / "stray-file").write_text("")
    shaped_file = staging.staging_name("a-file", ProcessIdentity(OTHER_BOOT, NS, RUNNING, 500))
    (root / shaped_file).write_text("")  # named like a dead run's directory, but not a directory: not ours

    with caplog.at_level(logging.DEBUG, logger="pipeline_runner"):
        report = await corpus.remove_dead_staging()

    assert report is not None
    assert sorted(p.name for p in root.iterdir()) == sorted([*kept, *old, "stray-file", shaped_file])
    assert sorted(name for name, _ in report.removed) == sorted(dead)
    assert [name for name, _ in report.kept_alive] == sorted(kept[:2])
    assert sorted(name for name, _ in report.kept_unknown) == sorted(kept[2:])
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    without_owner = [m for m in messages if "carry no owner" in m[1]]
    assert len(without_owner) == 1 and without_owner[0][0] == "INFO"  # one line for all of them
    assert "left 5 entries" in without_owner[0][1]
    assert sum("removed staging directory" in m for _, m in messages) == 3
    assert all(level == "WARNING" for level, m in messages if "kept staging directory" in m and "namespace" in m)


async def test_a_run_that_cannot_read_its_own_identity_removes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = fake_proc(tmp_path)
    (proc / "sys" / "kernel" / "random" / "boot_id").unlink()
    corpus = Corpus(tmp_path / "corpus", proc=proc)
    await corpus.ensure_layout()
    rebooted = plant(corpus.staging_root, "rebooted", ProcessIdentity(OTHER_BOOT, NS, RUNNING, 500))
    with caplog.at_level(logging.WARNING, logger="pipeline_runner"):
        assert await corpus.remove_dead_staging() is None
        new = await corpus.new_staging_dir("job-2")
    assert staging.owner_of(new.name) is None and new.name.startswith("job-2-")
    assert sorted(p.name for p in corpus.staging_root.iterdir()) == sorted([rebooted, new.name])
    assert sum("cannot read this process's identity" in r.getMessage() for r in caplog.records) == 1


# -- the real /proc ---------------------------------------------------------------------------------

needs_proc = pytest.mark.skipif(staging.read_own_identity() is None, reason="no readable /proc here")


@needs_proc
def test_own_identity_from_the_real_proc() -> None:
    me = staging.read_own_identity()
    assert me is not None
    assert me.pid == os.getpid()
    assert me.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert os.readlink("/proc/self/ns/pid") == f"pid:[{me.pid_ns}]"
    assert staging.read_own_identity() == me


@needs_proc
def test_a_real_child_is_alive_until_it_ends() -> None:
    me = staging.read_own_identity()
    assert me is not None
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        start = staging._read_stat(staging.PROC, child.pid)
        assert start is not None
        owner = ProcessIdentity(me.boot_id, me.pid_ns, child.pid, start[1])
        assert staging.judge(owner, me)[0] is Verdict.ALIVE
        assert staging.judge(ProcessIdentity(me.boot_id, me.pid_ns, child.pid, start[1] + 1), me)[0] is Verdict.DEAD
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    verdict, why = staging.judge(owner, me)
    assert verdict is Verdict.DEAD, why


@needs_proc
async def test_the_real_sweep_keeps_a_live_run_and_removes_a_dead_one(tmp_path: Path) -> None:
    corpus = Corpus(tmp_path / "corpus")
    await corpus.ensure_layout()
    me = await corpus.owner()
    assert me is not None
    ended = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
    with trio.fail_after(30):
        assert await ended.wait() == 0  # reaped: its pid names nothing now (or, recycled, a later process)
    live = await corpus.new_staging_dir("job-live")  # this process: a run in progress
    dead = plant(corpus.staging_root, "job-dead", ProcessIdentity(me.boot_id, me.pid_ns, ended.pid, 1))
    other_boot = plant(corpus.staging_root, "job-old", ProcessIdentity(str(uuid.uuid4()), me.pid_ns, me.pid, 1))
    report = await corpus.remove_dead_staging()
    assert report is not None
    assert [p.name for p in corpus.staging_root.iterdir()] == [live.name]
    assert sorted(name for name, _ in report.removed) == sorted([dead, other_boot])
