"""Blocking file I/O, always off the event loop, and the atomic-write primitives the corpus is built on.

Every blocking call goes through :func:`run_blocking`, one seam. A run on a ``MockClock``
(``pipeline_runner.testing``) makes it inline with :func:`blocking_inline`: a task waiting on a worker
thread looks idle to the autojump clock, which would otherwise jump virtual time to the next deadline
while an fsync is still running.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import trio

T = TypeVar("T")

# Set by blocking_inline() in the task that starts a run; Trio copies it into every task that task starts.
_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("pipeline_runner_blocking_inline", default=False)


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a worker thread. Not abandoned on cancel: a half-done fsync/rename must finish."""
    if _INLINE.get():
        await trio.lowlevel.checkpoint()
        return fn(*args)
    return await trio.to_thread.run_sync(fn, *args)


@contextlib.contextmanager
def blocking_inline() -> Iterator[None]:
    """Within the block, the current task and every task it starts run blocking calls inline (virtual time only)."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def fsync_dir(path: Path) -> None:
    """Make a rename/creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes) -> None:
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON so that readers see the old file or the new one, never a torn one.

    temp file in the same directory -> fsync -> rename over -> fsync the directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write_bytes_durably(tmp, json.dumps(payload, indent=2, sort_keys=True).encode() + b"\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def read_json(path: Path) -> Any | None:
    """The parsed file, or None when it does not exist."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the block: other *processes* (and other open files in this one)
    wait. Blocking, so call it in a worker thread.

    The lock file is created when missing and never removed: removing it would let one process lock the old inode
    while another locks a new one. The kernel drops the lock when the descriptor closes, so a process killed while
    holding it does not leave it held.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
