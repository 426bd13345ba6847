"""Starting a job's process in subprocess mode, and signalling it by identity.

The job runs in its own session (so its own process group), with cwd = the data directory. Its stdout and stderr
go through a pipe to a log-capping reader process that is also in its own session: neither is a child of the
supervisor's terminal or depends on the supervisor staying up, so a supervisor crash or restart leaves the job
running (jobs outlive supervisor restarts; the next boot reconciles them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from ._errors import SpawnError
from ._identity import Liveness, ProcessIdentity, identify, pidfd_open, probe

LOGCAP = Path(__file__).with_name("_logcap.py")


@dataclass
class SpawnedProcess:
    """A job process started by this boot, and its log reader. Only this boot can wait for them."""

    process: trio.Process
    log_reader: trio.Process
    identity: ProcessIdentity | None


async def spawn_subprocess(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    log_max_bytes: int,
) -> SpawnedProcess:
    """Start ``argv``; raise ``SpawnError`` with a one-line reason when it cannot start.

    ``log_path``'s directory must exist (the caller creates it off the event loop).
    """
    try:
        read_fd, write_fd = os.pipe()
    except OSError as exc:
        raise SpawnError(f"cannot prepare the job log: {exc}") from exc
    log_reader: trio.Process | None = None
    try:
        log_reader = await trio.lowlevel.open_process(
            [sys.executable, "-I", str(LOGCAP), str(log_path), str(log_max_bytes)],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            cwd=str(cwd),
            env=dict(env),
            start_new_session=True,
        )
    except Exception as exc:  # OSError, and also e.g. an argv or env the OS cannot encode
        if log_reader is not None:
            os.close(write_fd)
            write_fd = -1
            with trio.move_on_after(5):
                await log_reader.wait()  # EOF on its pipe: it exits at once; reap it, never leave a zombie
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise SpawnError(f"{type(exc).__name__}: {detail}") from exc
    finally:
        os.close(read_fd)
        if write_fd != -1:
            os.close(write_fd)
    # The child is not reaped until we wait for it, so its /proc entry (and start time) is still readable
    # even if it has already exited.
    return SpawnedProcess(process, log_reader, await trio.to_thread.run_sync(identify, process.pid))


def job_environment(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(extra)
    return env


def signal_own_child(spawned: SpawnedProcess, signum: int) -> None:
    """Signal the job's whole process group. Safe: the leader is our unreaped child, so its pid cannot be reused."""
    if spawned.process.returncode is not None:
        return
    try:
        os.killpg(spawned.process.pid, signum)
    except ProcessLookupError:
        pass
    except PermissionError:
        spawned.process.send_signal(signum)


def signal_by_identity(identity: ProcessIdentity, signum: int) -> tuple[bool, int | None]:
    """Signal a process this boot did not start, only if it is still exactly the recorded one.

    INV-NEVER-BLIND-SIGNAL: a pidfd is opened first and the identity checked after, so the signal reaches the
    process that was verified, never one that inherited the number. Returns (signalled, pidfd); the caller owns
    the pidfd (it becomes readable when the process exits).
    """
    fd = pidfd_open(identity.pid)
    if fd is None:
        return False, None
    if probe(identity) is not Liveness.ALIVE:
        os.close(fd)
        return False, None
    try:
        signal.pidfd_send_signal(fd, signum)
    except OSError:  # gone (ProcessLookupError) or not ours to signal (PermissionError): the fd is ours to close
        os.close(fd)
        return False, None
    # The leader is verified; its group shares its pid as group id while it lives.
    try:
        os.killpg(identity.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
    return True, fd
