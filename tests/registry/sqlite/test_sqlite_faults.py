"""The SQLite registry under a storage that misbehaves (ADR 0010): a full disk, a lock held past the busy timeout, a
file replaced under it, a damaged file at open. A write that cannot be made is ``RegistryUnavailable`` (the caller
retries or answers 503) and ``fault()`` says so until a write that wrote a row proves it over; a damaged file is
``RegistryDamaged`` and is never modified."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing
from registry_helpers import WallClock, new_job

from supervisor.domain import JobNotFound, JobStatus, RegistryDamaged, RegistryError, RegistryUnavailable
from supervisor.registry import Ending, NewJob, Outcome, SqliteRegistry

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root (CI runs as root)")


@pytest.fixture
def small_dir(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)
    return filler


@as_root
async def test_a_full_disk_is_a_fault_said_once_and_over_at_the_first_write_that_lands(
    small_dir: Path, clock: WallClock
) -> None:
    reg = await SqliteRegistry.open(small_dir / "jobs.sqlite3", clock=clock, boot_id="b")
    try:
        await reg.enqueue(new_job())
        assert reg.fault() is None
        filler = _fill(small_dir)
        with structlog.testing.capture_logs() as logs:
            with contextlib.suppress(RegistryUnavailable):
                # The WAL may still have room for a few pages: write until the disk says no (a bounded number).
                for _ in range(200):
                    await reg.enqueue(NewJob("k", {"pad": "x" * 2000}, ["run"]))
            for _ in range(3):
                with pytest.raises(RegistryUnavailable, match="full"):
                    await reg.enqueue(NewJob("k", {"pad": "x" * 2000}, ["run"]))
            fault = reg.fault()
            assert fault is not None and "full" in fault.reason and fault.failed_writes >= 4
            # A read still answers.
            assert (await reg.counts())["queued"] >= 1
            filler.unlink()
            await reg.enqueue(new_job())
            assert reg.fault() is None
        events = [(e["event"], e["log_level"]) for e in logs if e["event"].startswith("registry_writes")]
        assert events == [("registry_writes_failing", "error"), ("registry_writes_recovered", "info")]
    finally:
        await reg.aclose()


async def test_a_lock_held_past_the_busy_timeout_is_unavailable_not_an_error(path: Path, clock: WallClock) -> None:
    reg = await SqliteRegistry.open(path, clock=clock, boot_id="b", busy_timeout_ms=100)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(RegistryUnavailable, match="locked"):
            await reg.enqueue(new_job())
        assert reg.fault() is not None
        other.execute("ROLLBACK")
        await reg.enqueue(new_job())
        assert reg.fault() is None
    finally:
        other.close()
        await reg.aclose()


async def test_an_open_waiting_for_another_process_lock_gives_up_at_a_cancel_without_waiting_for_the_lock(
    path: Path,
) -> None:
    """``serve`` stopped while its start waits for the lock (the busy timeout). The open waited for its
    thread, so the stop waited for the lock; now the cancel comes back while the lock is still held, and the thread,
    left to finish, closes what it opened: the file's last connection gone, SQLite removes its ``-wal``. (Another
    thread lets the lock go after 5 s, so that an open which waits for it ends too, and fails the check.)"""
    SqliteRegistry(path).close()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    released = threading.Event()

    def let_go() -> None:
        other.execute("ROLLBACK")
        released.set()

    other.execute("BEGIN EXCLUSIVE")
    timer = threading.Timer(5.0, let_go)
    timer.start()
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(SqliteRegistry.open, path)
                await trio.testing.wait_all_tasks_blocked()  # the open is in its thread
                scope.cancel()
        assert scope.cancelled_caught
        assert not released.is_set(), "the cancel waited for the lock"
    finally:
        timer.cancel()
        timer.join()
    if not released.is_set():
        let_go()
    other.close()
    wal = path.with_name(path.name + "-wal")
    with trio.fail_after(10):
        while await trio.Path(wal).exists():  # noqa: ASYNC110 - another thread closes: nothing to wait on but the file
            await trio.sleep(0.01)  # polling for the abandoned open to close its connections, under the bound above


async def test_a_write_that_changes_nothing_does_not_end_a_fault(path: Path, clock: WallClock) -> None:
    """A commit that wrote no row succeeds on a full disk too: it proves nothing (the fault's one ERROR would
    otherwise flap into many)."""
    reg = await SqliteRegistry.open(path, clock=clock, boot_id="b", busy_timeout_ms=100)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(RegistryUnavailable):
            await reg.enqueue(new_job())
        other.execute("ROLLBACK")
        with pytest.raises(JobNotFound):  # committed, refused on its own merits: no row written
            await reg.finalize("no-such-job", Ending(Outcome(JobStatus.SUCCEEDED)))
        assert reg.fault() is not None  # nothing has written a row yet
        await reg.enqueue(new_job())
        assert reg.fault() is None
    finally:
        other.close()
        await reg.aclose()


async def test_a_registry_file_removed_under_a_running_registry_is_unavailable_and_never_recreated(
    path: Path, clock: WallClock, tmp_path: Path
) -> None:
    reg = await SqliteRegistry.open(path, clock=clock, boot_id="b")
    aside = tmp_path / "aside"
    aside.mkdir()
    try:
        await reg.enqueue(new_job())
        for part in path.parent.glob("jobs.sqlite3*"):
            part.rename(aside / part.name)
        with pytest.raises(RegistryUnavailable, match=str(path)):
            await reg.enqueue(new_job())
        assert not await trio.Path(path).exists()  # never a fresh empty database in its place
        for part in aside.iterdir():
            part.rename(path.parent / part.name)
        await reg.enqueue(new_job())
        assert (await reg.counts())["queued"] == 2
    finally:
        await reg.aclose()


async def test_reads_keep_answering_while_the_file_is_removed_and_a_new_connection_never_makes_a_fresh_database(
    path: Path, clock: WallClock, tmp_path: Path
) -> None:
    """Every connection is opened with the registry, so reads keep answering from the file they opened while it is
    removed (however many come at once: before, a connection first needed during the fault made a fresh empty database
    at the path, and its reads failed with "no such table"; a server test saw ``GET /api/queue`` fail so). A
    connection that must be opened then (one that failed was replaced) finds no file and says so: unavailable, and no
    file is made."""
    reg = await SqliteRegistry.open(path, clock=clock, boot_id="b", max_connections=3)
    aside = tmp_path / "aside"
    aside.mkdir()
    try:
        await reg.enqueue(new_job())
        assert reg.file.open_connections == 3  # all of them, at open
        for part in path.parent.glob("jobs.sqlite3*"):
            part.rename(aside / part.name)
        answers: list[int] = []

        async def count() -> None:
            answers.append((await reg.counts())["queued"])

        async with trio.open_nursery() as nursery:
            for _ in range(9):
                nursery.start_soon(count)
        assert answers == [1] * 9
        assert not await trio.Path(path).exists()
        with pytest.raises(RegistryError):
            reg.file.read("SELECT * FROM no_such_table")  # a storage error: that connection is closed
        for _ in range(3):  # the two left, then a new one
            with contextlib.suppress(RegistryError):
                await trio.to_thread.run_sync(reg.file.read, "SELECT * FROM no_such_table")
        assert reg.file.open_connections == 0
        with pytest.raises(RegistryUnavailable, match="cannot open registry"):
            await reg.counts()  # a new connection: the file is gone
        assert not await trio.Path(path).exists()  # never a fresh empty database in its place
        with pytest.raises(RegistryUnavailable):
            await reg.enqueue(new_job())  # a write: the fault begins
        for part in aside.iterdir():
            part.rename(path.parent / part.name)
        assert (await reg.counts())["queued"] == 1
        await reg.enqueue(new_job())  # the first write that lands ends the fault...
        assert reg.fault() is None
        assert reg.file.open_connections == 3  # ...and fills the pool again for the next one
    finally:
        await reg.aclose()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        pytest.param(lambda p: p.write_bytes(b""), "empty", id="empty"),
        pytest.param(lambda p: p.write_bytes(b"hello, I am a note\n" * 300), "not a database", id="not-a-database"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:5000]), "", id="truncated"),
    ],
)
async def test_a_damaged_file_is_refused_at_open_and_left_exactly_as_it_was(
    path: Path, clock: WallClock, damage: object, says: str
) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x BLOB)")
        conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(512),) for _ in range(64)])
        conn.commit()
    damage(path)  # type: ignore[operator]
    before = await trio.Path(path).read_bytes()
    with pytest.raises(RegistryDamaged, match=str(path)) as raised:
        await SqliteRegistry.open(path, clock=clock, boot_id="b")
    assert says in str(raised.value)
    assert await trio.Path(path).read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
