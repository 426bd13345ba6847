"""Subprocess mode: the executor whose jobs are processes of this boot's shepherd, on this machine.

Jobs are started by this boot's shepherd (``shepherd.py``, its own process and session): it forks each job into
its own session, reads its output into the log, reaps it and writes its true exit status to disk. The supervisor
talks to it over a socket pair (newline-delimited JSON). A supervisor crash never takes the shepherd or the jobs
down; the next boot starts its own shepherd and adopts the prior boot's jobs by their recorded identity.

The shepherd keeps two state records per job (``JobFiles``): ``<id>.pid`` (identity, written before the program
runs) and ``<id>.exit`` (true exit status, written at reap). While this supervisor is connected they are written to
the run directory (tmpfs) and dropped once the job's row is final (``release``); when the supervisor goes away the
shepherd writes whatever is left there next to the job's log, where they otherwise are. Readers look in both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ..domain import IdentityRecord, Job, Liveness, SpawnError, StartOutcomeUnknown
from ..observe import get_logger
from ._base import Evidence, Executor, ExitStatus, JobHandle, Launch, ProofOfEnd, Unwatchable
from ._identity import ProcessIdentity, identify, kernel_boot_id, pidfd_open, probe

__all__ = [
    "JobFiles",
    "ProcessHandle",
    "ProcessIdentity",
    "RecordedStart",
    "ShepherdClient",
    "ShepherdLost",
    "ShepherdMarker",
    "SubprocessExecutor",
    "identify",
    "identity_of",
    "kernel_boot_id",
    "marker_path",
    "probe",
    "read_exit",
    "read_exit_file",
    "read_exit_of",
    "read_marker",
    "read_start",
    "read_start_file",
    "signal_by_identity",
]

log = get_logger()

SHEPHERD = Path(__file__).with_name("shepherd.py")
# The shepherd answers a start in milliseconds; these bound a wedged one.
SHEPHERD_HELLO_TIMEOUT_S = 10.0
START_TIMEOUT_S = 30.0
SHEPHERD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class ShepherdLost(SpawnError):
    """This boot's shepherd went away before it reported the job's exit."""


@dataclass(frozen=True)
class JobFiles:
    """Where one job's log and state records live: next to the log (``pid``, ``exit``), and in the run directory
    while a connected supervisor may still need them (``run_pid``, ``run_exit``; None without a run directory)."""

    log: Path
    pid: Path
    exit: Path
    run_pid: Path | None = None
    run_exit: Path | None = None

    @classmethod
    def for_log(cls, log: Path, run_dir: Path | None = None) -> JobFiles:
        stem = log.name.removesuffix(".log")
        return cls(
            log,
            log.with_suffix(".pid"),
            log.with_suffix(".exit"),
            run_dir / f"{stem}.pid" if run_dir is not None else None,
            run_dir / f"{stem}.exit" if run_dir is not None else None,
        )

    @classmethod
    def for_job(cls, job: Job, log_dir: Path, run_dir: Path | None = None) -> JobFiles:
        """Where the row says its log is (fixed at promotion), else where this boot would put it."""
        return cls.for_log(Path(job.log_path) if job.log_path else log_dir / f"{job.job_id}.log", run_dir)

    @property
    def run_records(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.run_pid, self.run_exit) if p is not None)


@dataclass(frozen=True)
class RecordedStart:
    """What the shepherd recorded before the job's program ran: the job's identity and its own."""

    identity: ProcessIdentity | None
    shepherd: ProcessIdentity | None


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # torn or unreadable: files are replaced atomically, so this is not ours; treat as absent
    return data if isinstance(data, dict) else None


def read_start_file(path: Path) -> RecordedStart | None:
    """The ``<id>.pid`` file (blocking). None when the shepherd never recorded the job: it never ran."""
    data = _load_json(path)
    if data is None:
        return None
    identity = None
    if isinstance(data.get("pid"), int) and isinstance(data.get("start_time"), int) and data.get("kernel_boot_id"):
        identity = ProcessIdentity(data["pid"], data["start_time"], str(data["kernel_boot_id"]))
    shepherd = None
    sh = data.get("shepherd")
    shepherd_known = isinstance(sh, dict) and isinstance(sh.get("pid"), int) and isinstance(sh.get("start_time"), int)
    if shepherd_known and identity is not None:
        assert isinstance(sh, dict)
        shepherd = ProcessIdentity(sh["pid"], sh["start_time"], identity.kernel_boot_id)
    return RecordedStart(identity, shepherd)


def read_exit_file(path: Path, pid: int | None = None) -> ExitStatus | None:
    """The ``<id>.exit`` file (blocking): the job's true exit status, or None when none was recorded.

    With ``pid``, only a record of that process counts.
    """
    data = _load_json(path)
    if data is None or (pid is not None and data.get("pid") != pid):
        return None
    code, sig = data.get("exit_code"), data.get("signal")
    if isinstance(code, int) and not isinstance(code, bool):
        return ExitStatus(code=code)
    if isinstance(sig, int) and not isinstance(sig, bool):
        return ExitStatus(signal=sig)
    return None


def read_exit_of(path: Path, identity: ProcessIdentity) -> ExitStatus | None:
    """The exit record at ``path`` (blocking), only if it names exactly ``identity``: pid, start time and kernel boot
    id (INV-PID-NEEDS-BOOT-AND-IDENTITY). A record of a pid alone (a shepherd from before these fields) is None."""
    data = _load_json(path)
    if data is None:
        return None
    named = (data.get("pid"), data.get("start_time"), data.get("kernel_boot_id"))
    if named != (identity.pid, identity.start_time, identity.kernel_boot_id):
        return None
    return read_exit_file(path, identity.pid)


def read_start(files: JobFiles) -> RecordedStart | None:
    """The job's start record (blocking): in the run directory first, then next to the log.

    In that order: the shepherd writes a record next to the log before it removes the run copy, never after.
    """
    if files.run_pid is not None and (found := read_start_file(files.run_pid)) is not None:
        return found
    return read_start_file(files.pid)


MARKER_PREFIX = ".shepherd-"


def marker_path(log_dir: Path, boot_id: str) -> Path:
    """Where the shepherd of supervisor boot ``boot_id`` keeps its marker: next to that boot's job logs."""
    return log_dir / f"{MARKER_PREFIX}{boot_id}.json"


@dataclass(frozen=True)
class ShepherdMarker:
    """A shepherd's marker (``shepherd.py``): who it is, and whether its supervisor was still connected."""

    identity: ProcessIdentity | None
    connected: bool


def read_marker(path: Path) -> ShepherdMarker | None:
    """The marker at ``path`` (blocking); None when there is none (its shepherd has exited, or never started)."""
    data = _load_json(path)
    if data is None:
        return None
    identity = None
    if isinstance(data.get("pid"), int) and isinstance(data.get("start_time"), int) and data.get("kernel_boot_id"):
        identity = ProcessIdentity(data["pid"], data["start_time"], str(data["kernel_boot_id"]))
    return ShepherdMarker(identity, data.get("control") == "connected")


def may_still_start(marker: ShepherdMarker | None) -> bool:
    """Whether that shepherd may yet start a job its (dead) supervisor asked for: it is alive and has not read the
    end of its control socket. An unverifiable identity counts as alive (INV-UNKNOWN-KEEPS-SLOT)."""
    if marker is None or not marker.connected:
        return False
    return marker.identity is None or probe(marker.identity) is not Liveness.DEAD


def prune_markers(log_dir: Path) -> None:
    """Remove the markers of shepherds that are gone (blocking): a killed one cannot remove its own, and a marker
    naming a dead shepherd says no more than no marker at all."""
    try:
        paths = list(log_dir.glob(f"{MARKER_PREFIX}*.json"))
    except OSError:
        return
    for path in paths:
        marker = read_marker(path)
        if marker is not None and marker.identity is not None and probe(marker.identity) is Liveness.DEAD:
            try:
                path.unlink()
            except OSError:
                pass


def read_exit(files: JobFiles, pid: int | None = None) -> ExitStatus | None:
    """The job's exit record (blocking): in the run directory first, then next to the log (see ``read_start``)."""
    if files.run_exit is not None and (found := read_exit_file(files.run_exit, pid)) is not None:
        return found
    return read_exit_file(files.exit, pid)


def prepare_run_dir(run_dir: Path, private_from: Path) -> None:
    """Make the run directory (blocking), and refuse one that others could write to.

    Every directory from ``private_from`` down to ``run_dir`` must be a real directory (no symlink) owned by this
    user and writable by nobody else: the default lives on a shared tmpfs (/dev/shm), where another user could have
    made the name first, and a record planted there would be read as a job's identity.
    """
    chain = [run_dir, *(p for p in run_dir.parents if p.is_relative_to(private_from))]
    private_from.parent.mkdir(parents=True, exist_ok=True)
    for directory in reversed(chain):  # the private ones made private: nobody else lists its jobs
        directory.mkdir(mode=0o700, exist_ok=True)
    for directory in chain:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PermissionError(
                f"{directory} must be a directory of this user's that nobody else can write to "
                f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)})"
            )


@dataclass
class _Watch:
    """One job of this boot's shepherd: its start answer and, later, its exit. ``gone``: the connection ended before
    the start was answered (the shepherd may or may not have started it: its start record says)."""

    started: trio.Event = field(default_factory=trio.Event)
    start_error: str | None = None
    pid: int | None = None
    start_time: int | None = None
    exited: trio.Event = field(default_factory=trio.Event)
    status: ExitStatus | None = None
    lost: bool = False
    gone: bool = False


@dataclass(frozen=True)
class StartedJob:
    """A job the shepherd started: its verified identity (None only when /proc could not be read)."""

    pid: int
    identity: ProcessIdentity | None


class _Connection:
    """One shepherd process and its control socket; replaced when the shepherd dies. ``identity``: the shepherd's
    process (None when it could not be read), which says whether it may still act on what it was sent."""

    def __init__(self, sock: trio.socket.SocketType, pid: int, identity: ProcessIdentity | None = None) -> None:
        self.sock = sock
        self.pid = pid
        self.identity = identity
        self.watches: dict[str, _Watch] = {}
        self.alive = True
        self.send_lock = trio.Lock()

    def may_still_answer(self) -> bool:
        """Blocking (a /proc read once the socket is gone): while this shepherd lives it may still read and act on
        what it was sent (one that is stopped, say, with our requests in its socket buffer)."""
        return self.alive or self.identity is None or probe(self.identity) is not Liveness.DEAD


class ShepherdClient:
    """This boot's shepherd, seen from the supervisor. Started on first use in the nursery given to ``attach``.

    ``start_job`` asks it to start a job and returns the job's identity; ``wait_exit`` returns the job's exit status
    (raising ``ShepherdLost`` if the shepherd died first: the caller then falls back to the job's identity);
    ``signal`` signals the job's process group.
    """

    def __init__(
        self,
        stderr_path: Path,
        base_env: Mapping[str, str] | None = None,
        *,
        run_dir: Path | None = None,
        run_dir_private_from: Path | None = None,
        trace: Path | None = None,
    ) -> None:
        self._stderr_path = stderr_path
        self._base_env = dict(base_env or {})  # sent once per shepherd; each start sends only its job's own
        self.run_dir = run_dir
        self._run_dir_private_from = run_dir_private_from or run_dir  # None exactly when run_dir is
        self._trace = trace
        self._nursery: trio.Nursery | None = None
        self._conn: _Connection | None = None
        self._ensure_lock = trio.Lock()
        self._watches: dict[str, _Watch] = {}  # job id -> watch, across connections
        # Starts asked and given up on before their answer (timed out, cancelled, the connection lost): job id ->
        # the watch and the connection it was asked on, until answered or the job's next start.
        self._abandoned: dict[str, tuple[_Watch, _Connection]] = {}
        self._kernel_boot_id: str | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    @property
    def pid(self) -> int | None:
        """The current shepherd's pid (None before the first job, or after it died until the next one)."""
        return self._conn.pid if self._conn is not None and self._conn.alive else None

    def disconnect(self) -> None:
        """Shut this boot's side of the control socket down, as a crash of the supervisor would: the shepherd writes
        its records next to the logs and goes on alone (ADR 0004). A seam for the tests of that path; a supervisor
        that stops in order asks the shepherd to stop instead."""
        if self._conn is not None:
            self._conn.sock.shutdown(socket.SHUT_RDWR)

    async def _ensure(self, marker: Path | None) -> _Connection:
        async with self._ensure_lock:
            if self._conn is not None and self._conn.alive:
                return self._conn
            if self._nursery is None:
                raise SpawnError("the shepherd needs a nursery: call attach() first")
            conn: _Connection = await self._nursery.start(self._serve, marker)
            self._conn = conn
            return conn

    async def _serve(self, marker: Path | None, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Start a shepherd, report its connection, then read its events until it goes away. ``marker``: where it
        keeps its marker (see ``shepherd.py``)."""
        if marker is not None:
            await trio.to_thread.run_sync(prune_markers, marker.parent)
        ours, theirs = socket.socketpair()
        if self.run_dir is not None:
            run_dir, private_from = self.run_dir, self._run_dir_private_from
            assert private_from is not None
            try:
                await trio.to_thread.run_sync(prepare_run_dir, run_dir, private_from)
            except OSError as exc:
                ours.close()
                theirs.close()
                raise SpawnError(
                    f"cannot use the run directory {run_dir} (PODCAST_JOB_RUN_DIR): {exc.strerror or exc}"
                ) from exc
        try:
            stderr_fd = await trio.to_thread.run_sync(
                lambda: os.open(self._stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            )
        except OSError as exc:
            ours.close()
            theirs.close()
            raise SpawnError(f"cannot open the shepherd's log {self._stderr_path}: {exc.strerror or exc}") from exc
        try:
            launcher = await trio.lowlevel.open_process(
                [sys.executable, "-I", str(SHEPHERD), "--control-fd", str(theirs.fileno())],
                # Nothing of the supervisor's environment (its API token among it): each job gets its own.
                env=SHEPHERD_ENV,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr_fd,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
            await launcher.wait()  # it double-forks and exits at once: the shepherd is nobody's child
        except OSError as exc:
            ours.close()
            raise SpawnError(f"cannot start the shepherd: {exc.strerror or exc}") from exc
        finally:
            theirs.close()
            os.close(stderr_fd)
        sock = trio.socket.from_stdlib_socket(ours)
        with sock:
            lines = _lines(sock)
            try:
                with trio.fail_after(SHEPHERD_HELLO_TIMEOUT_S):
                    hello = await anext(lines)
            except (trio.TooSlowError, StopAsyncIteration) as exc:
                raise SpawnError("the shepherd did not start") from exc
            pid, start_time = int(hello["pid"]), hello.get("start_time")
            boot = await self._machine_boot_id()
            identity = ProcessIdentity(pid, start_time, boot) if isinstance(start_time, int) and boot else None
            conn = _Connection(sock, pid, identity)
            log.info("shepherd_started", pid=conn.pid)
            # Every job's environment starts from this one: sent once, not in each start request (it was most of
            # each request's JSON, encoded here and decoded there, at every job start).
            await self._send(
                conn,
                {
                    "op": "env",
                    "env": self._base_env,
                    "trace": str(self._trace) if self._trace else None,
                    "marker": str(marker) if marker is not None else None,
                },
            )
            task_status.started(conn)
            try:
                async for event in lines:
                    self._dispatch(conn, event)
                # EOF: the shepherd died (it never leaves while we hold the socket). Its jobs live on, unwatched
                # by it: their monitors fall back to their identities, and the next start brings a new shepherd.
                log.error("shepherd_lost", pid=conn.pid, jobs=len(conn.watches))
            finally:
                conn.alive = False
                for watch in conn.watches.values():
                    if not watch.started.is_set():
                        watch.start_error = "the shepherd went away"
                        watch.gone = True
                        watch.started.set()
                    if not watch.exited.is_set():
                        watch.lost = True
                        watch.exited.set()
                conn.watches.clear()

    def _dispatch(self, conn: _Connection, event: dict[str, Any]) -> None:
        watch = conn.watches.get(str(event.get("id")))
        if watch is None:
            return
        kind = event.get("ev")
        abandoned = self._abandoned.get(str(event.get("id")))
        if abandoned is not None and abandoned[0] is watch and kind in ("started", "start_failed"):
            # A late answer: its start record (or the lack of one) is now the whole truth (see start_pending).
            del self._abandoned[str(event["id"])]
        if kind == "started":
            watch.pid, watch.start_time = int(event["pid"]), event.get("start_time")
            watch.started.set()
        elif kind == "start_failed":
            watch.start_error = str(event.get("error"))
            watch.started.set()
            conn.watches.pop(str(event["id"]), None)
        elif kind == "exited":
            code, sig = event.get("exit_code"), event.get("signal")
            watch.status = ExitStatus(code=code) if isinstance(code, int) else ExitStatus(signal=int(sig or 0))
            watch.exited.set()
            conn.watches.pop(str(event["id"]), None)

    async def _send(self, conn: _Connection, request: dict[str, Any]) -> None:
        """One request, whole or not at all: a cancel lands before its first byte or after its last, never between
        (half a line would garble the next request too). A rest that cannot be sent within the start timeout (a
        shepherd that reads nothing, its socket buffer full) ends this connection: the shepherd reads what came whole,
        then the end, and no later request of ours is ever read as part of this one."""
        data = json.dumps(request).encode() + b"\n"
        async with conn.send_lock:
            try:
                sent = await conn.sock.send(data)  # cancellable: nothing of it is sent if cancelled here
                view = memoryview(data)[sent:]
                with trio.CancelScope(shield=True), trio.move_on_after(START_TIMEOUT_S):
                    while view:
                        sent = await conn.sock.send(view)
                        view = view[sent:]
            except OSError as exc:
                raise ShepherdLost(f"the shepherd went away: {exc}") from exc
            if view:
                conn.alive = False  # the next start brings a new shepherd
                conn.sock.close()
                log.error(
                    "shepherd_unresponsive",
                    pid=conn.pid,
                    why="a request could not be sent whole",
                    jobs=len(conn.watches),
                )
                raise ShepherdLost("the shepherd reads nothing: a request could not be sent whole")

    async def start_job(
        self,
        job_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        files: JobFiles,
        log_max_bytes: int,
        marker: Path | None = None,
        memory_max_mb: int | None = None,
    ) -> StartedJob:
        """Start a job; raise ``SpawnError`` with a one-line reason when it cannot start. ``env``: the job's own
        variables, laid over the base environment given at construction. ``marker``: where a shepherd started for
        it keeps its marker (``marker_path``)."""
        conn = await self._ensure(marker)
        watch = _Watch()
        conn.watches[job_id] = watch
        self._watches[job_id] = watch
        self._abandoned.pop(job_id, None)  # an earlier start of the job's, given up on: this one is the one now
        try:
            await self._send(
                conn,
                {
                    "op": "start",
                    "id": job_id,
                    "argv": list(argv),
                    "env": dict(env),
                    "cwd": str(cwd),
                    "log": str(files.log),
                    "pid_file": str(files.pid),
                    "exit_file": str(files.exit),
                    "run_pid_file": str(files.run_pid) if files.run_pid else None,
                    "run_exit_file": str(files.run_exit) if files.run_exit else None,
                    "cap": log_max_bytes,
                    "memory_max_mb": memory_max_mb,
                },
            )
            with trio.move_on_after(START_TIMEOUT_S):
                await watch.started.wait()
        except ShepherdLost as exc:
            # The socket failed while the start was being asked: the shepherd may have read it before it went.
            self._abandon(job_id, watch, conn)
            raise StartOutcomeUnknown(f"the start was being asked when {exc}") from exc
        except BaseException:
            # Cancelled while the start was being asked (or waited for): the shepherd may have read it.
            self._abandon(job_id, watch, conn)
            raise
        if not watch.started.is_set() or watch.gone:
            # A start asked and not answered (a shepherd stopped or swapped out; one that died meanwhile): the job
            # may run or never will. Never a failure: the evidence tells which (start_pending, the start record).
            self._abandon(job_id, watch, conn)
            if watch.gone:
                raise StartOutcomeUnknown("the shepherd went away before it answered the start")
            raise StartOutcomeUnknown(f"the shepherd did not answer the start within {START_TIMEOUT_S:g} s")
        if watch.start_error is not None or watch.pid is None:
            self._watches.pop(job_id, None)
            raise SpawnError(watch.start_error or "the shepherd reported no pid")
        boot = await self._machine_boot_id()
        identity = None
        if isinstance(watch.start_time, int) and boot is not None:
            identity = ProcessIdentity(watch.pid, watch.start_time, boot)
        return StartedJob(watch.pid, identity)

    def _abandon(self, job_id: str, watch: _Watch, conn: _Connection) -> None:
        if self._watches.get(job_id) is watch:
            del self._watches[job_id]
        if not (watch.started.is_set() and not watch.gone):
            self._abandoned[job_id] = (watch, conn)

    def start_pending(self, job_id: str) -> bool:
        """Blocking (see ``may_still_answer``): whether a start of ``job_id`` that this boot gave up on before its
        answer may still happen -- the shepherd it was asked of has not answered it and may yet act on it. Read it
        before the job's start record: an answer always comes after the record it reports."""
        abandoned = self._abandoned.get(job_id)
        if abandoned is None:
            return False
        watch, conn = abandoned
        if watch.started.is_set() and not watch.gone:
            return False  # answered since
        return conn.may_still_answer()

    async def _machine_boot_id(self) -> str | None:
        if self._kernel_boot_id is None:  # constant for the machine's boot: read once, not a thread hop per start
            self._kernel_boot_id = await trio.to_thread.run_sync(kernel_boot_id)
        return self._kernel_boot_id

    async def wait_exit(self, job_id: str) -> ExitStatus:
        """The job's exit status as the shepherd reaped it; ``ShepherdLost`` if the shepherd died first."""
        watch = self._watches.get(job_id)
        if watch is None:
            raise ShepherdLost(f"job {job_id} is not one of this shepherd's")
        try:
            await watch.exited.wait()
        finally:
            if watch.exited.is_set():
                self._watches.pop(job_id, None)
        if watch.lost or watch.status is None:
            raise ShepherdLost("the shepherd went away before the job ended")
        return watch.status

    async def forget(self, job_id: str) -> None:
        """The job's row is final: the shepherd may drop its run-directory records. Nothing to do when this shepherd
        is gone: it wrote them next to the log as it left (or, killed, left them for the run directory's end)."""
        conn = self._conn
        if conn is None or not conn.alive:
            return
        try:
            await self._send(conn, {"op": "forget", "id": job_id})
        except ShepherdLost:
            pass

    async def signal(self, job_id: str, signum: int) -> bool:
        """Signal the job's process group through the shepherd; False when this shepherd no longer has it."""
        conn = self._conn
        if conn is None or not conn.alive or job_id not in conn.watches:
            return False
        try:
            await self._send(conn, {"op": "signal", "id": job_id, "sig": int(signum)})
        except ShepherdLost:
            return False
        return True


async def _lines(sock: trio.socket.SocketType) -> Any:
    """Newline-delimited JSON objects from ``sock`` until EOF."""
    buffer = b""
    while True:
        try:
            data = await sock.recv(65536)
        except (OSError, trio.ClosedResourceError):
            return
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


def signal_by_identity(identity: ProcessIdentity, signum: int) -> tuple[bool, int | None]:
    """Signal a process this boot's shepherd does not own, only if it is still exactly the recorded one.

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


def open_verified_pidfd(identity: ProcessIdentity) -> int | None:
    """A pidfd for exactly the recorded process (blocking), or None when it is not (or no longer) that process."""
    fd = pidfd_open(identity.pid)
    if fd is None:
        return None
    if probe(identity) is Liveness.ALIVE:
        return fd
    os.close(fd)
    return None


# -- the executor -------------------------------------------------------------------------------------

# Once an adopted job's process is gone, its shepherd records the exit at reap (milliseconds); this bounds the wait
# for that record while the shepherd is alive.
EXIT_RECORD_WAIT_S = 10.0
EXIT_RECORD_POLL_S = 0.02


def identity_of(job: Job) -> ProcessIdentity | None:
    """INV-PID-NEEDS-BOOT-AND-IDENTITY: a bare pid is no identity."""
    return ProcessIdentity.from_record(job.identity)


def _remove_files(paths: Sequence[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
        except OSError:
            pass


def _shepherd_alive(start: RecordedStart | None) -> bool:
    return bool(start and start.shepherd and probe(start.shepherd) is Liveness.ALIVE)


@dataclass
class ProcessHandle(JobHandle):
    """A job's process: its pid, its verified identity (None only when /proc could not be read), its state files.

    ``adopted``: watched through its identity (pidfd, then the exit file), not through this boot's shepherd: a prior
    boot's job, or one whose shepherd died.
    """

    job_id: str
    pid: int
    identity: ProcessIdentity | None
    files: JobFiles
    adopted: bool = False

    @property
    def record(self) -> IdentityRecord:
        if self.identity is not None:
            return self.identity.to_record()
        # /proc could not be read at the start: the pid alone is recorded, which is no identity (judged UNKNOWN).
        return IdentityRecord("process", {"pid": self.pid, "pid_start_time": None, "kernel_boot_id": None})

    def log_fields(self) -> dict[str, object]:
        return {"pid": self.pid}


class SubprocessExecutor(Executor):
    """Jobs as processes on this machine, children of this boot's shepherd (ADR 0004).

    ``base_env``: the environment every job inherits (the supervisor's, without its private variables); the
    launch's own variables are laid over it. ``log_dir``: where a row without a log path has its state files.
    """

    mode = "subprocess"

    def __init__(
        self,
        *,
        base_env: Mapping[str, str],
        log_dir: Path,
        shepherd_log: Path,
        run_dir: Path | None = None,
        run_dir_private_from: Path | None = None,
        trace: Path | None = None,
    ) -> None:
        self.python = sys.executable
        self._base_env = dict(base_env)
        self._log_dir = log_dir
        self.shepherd = ShepherdClient(
            stderr_path=shepherd_log,
            base_env=self._base_env,
            run_dir=run_dir,
            run_dir_private_from=run_dir_private_from,
            trace=trace,
        )

    def attach(self, nursery: trio.Nursery) -> None:
        self.shepherd.attach(nursery)

    async def start(self, launch: Launch) -> ProcessHandle:
        files = JobFiles.for_log(launch.log, self.shepherd.run_dir)
        started = await self.shepherd.start_job(
            launch.job_id,
            launch.argv,
            env=launch.env,
            cwd=launch.data_dir,
            files=files,
            log_max_bytes=launch.log_max_bytes,
            marker=marker_path(launch.log.parent, launch.boot_id),
            memory_max_mb=launch.memory_max_mb,
        )
        return ProcessHandle(launch.job_id, started.pid, started.identity, files)

    async def wait(self, handle: JobHandle) -> ExitStatus | None:
        assert isinstance(handle, ProcessHandle)
        if not handle.adopted:
            try:
                return await self.shepherd.wait_exit(handle.job_id)
            except ShepherdLost:
                handle.adopted = True  # from now on, watched and signalled through its identity
                log.warning("job_watched_by_identity", job_id=handle.job_id, pid=handle.pid, why="shepherd lost")
        if handle.identity is None:
            raise Unwatchable("no recorded process identity to watch")
        return await self._await_exit_by_identity(handle.identity, handle.files)

    async def _await_exit_by_identity(self, identity: ProcessIdentity, files: JobFiles) -> ExitStatus | None:
        """Wait for a process this boot's shepherd does not own to exit (pidfd), then for its recorded exit."""
        pidfd = await trio.to_thread.run_sync(open_verified_pidfd, identity)
        if pidfd is not None:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                trio.lowlevel.notify_closing(pidfd)
                os.close(pidfd)
        # Gone. Its shepherd (if alive) records the exit at reap, within milliseconds: there is no event to wait on
        # across processes, so look for the record, bounded, while that shepherd lives.
        with trio.move_on_after(EXIT_RECORD_WAIT_S):
            while True:
                status = await trio.to_thread.run_sync(read_exit, files, identity.pid)
                if status is not None:
                    return status
                start = await trio.to_thread.run_sync(read_start, files)
                if not await trio.to_thread.run_sync(_shepherd_alive, start):
                    # One last look: it may have written the record just before it exited.
                    return await trio.to_thread.run_sync(read_exit, files, identity.pid)
                await trio.sleep(EXIT_RECORD_POLL_S)
        return None

    async def release(self, handle: JobHandle) -> None:
        """The row is final: its state records say nothing the registry does not (their run copies go)."""
        assert isinstance(handle, ProcessHandle)
        await self.shepherd.forget(handle.job_id)  # this shepherd's job or not: it drops only what it holds
        if handle.adopted and handle.files.run_records:
            # Another shepherd's job (a prior boot's, or ours that died): it left its run copies behind only if it
            # was killed; drop them. What is next to the log stays, as for any job whose supervisor went away.
            await trio.to_thread.run_sync(_remove_files, handle.files.run_records)

    async def stop(self, handle: JobHandle, grace_s: float) -> None:
        assert isinstance(handle, ProcessHandle)
        log.info("job_cancel_signal", job_id=handle.job_id, signal="SIGTERM", pid=handle.pid)
        await self._signal(handle, signal.SIGTERM)
        await trio.sleep(grace_s)
        log.warning("job_cancel_signal", job_id=handle.job_id, signal="SIGKILL", pid=handle.pid)
        await self._signal(handle, signal.SIGKILL)

    async def _signal(self, handle: ProcessHandle, signum: int) -> None:
        """Signal a job's process group: through its shepherd, else only by verified identity."""
        if not handle.adopted and await self.shepherd.signal(handle.job_id, signum):
            return
        if handle.identity is None:
            log.error("job_not_signalled", job_id=handle.job_id, pid=handle.pid, why="no verified identity")
            return
        # INV-NEVER-BLIND-SIGNAL: pidfd first, identity checked, then the signal.
        _, pidfd = await trio.to_thread.run_sync(signal_by_identity, handle.identity, signum)
        if pidfd is not None:
            os.close(pidfd)

    def gather_evidence(self, jobs: Sequence[Job], *, boot_id: str) -> list[Evidence]:
        return [self._evidence(job, this_boot=job.boot_id == boot_id) for job in jobs]

    def proof_of_end(self, jobs: Sequence[Job]) -> list[ProofOfEnd | None]:
        """INV-SILENT-HOST-ENDS-BY-PROOF: the exit record another host's shepherd wrote next to the job's log (where a
        shepherd whose supervisor went away keeps it), readable here (the same machine, or a shared volume), naming
        the row's full identity. Never a probe of the pid: another machine's pid says nothing here, and a process
        that looks alive or dead by its number is no proof. No record, or one of another process: None."""
        out: list[ProofOfEnd | None] = []
        for job in jobs:
            identity = identity_of(job)
            if identity is None or job.log_path is None:
                out.append(None)
                continue
            # Next to the log only: the other host's run directory is its own (a tmpfs of its machine).
            exit_path = JobFiles.for_log(Path(job.log_path)).exit
            status = read_exit_of(exit_path, identity)
            out.append(ProofOfEnd(status, f"exit record {exit_path}") if status is not None else None)
        return out

    def _evidence(self, job: Job, *, this_boot: bool) -> Evidence:
        files = JobFiles.for_job(job, self._log_dir, self.shepherd.run_dir)
        # A start this boot gave up on (no answer in time, a drain cancelled part way): asked before the record.
        pending = not job.spawned and this_boot and self.shepherd.start_pending(job.job_id)
        start = read_start(files)
        identity = identity_of(job)
        found = None
        if pending and (start is None or start.identity is None):
            # INV-UNKNOWN-KEEPS-SLOT: this boot's shepherd was asked to start it and has not answered yet.
            return Evidence(Liveness.UNKNOWN, detail="its start was asked of this boot's shepherd, not yet answered")
        if not job.spawned and not this_boot and (start is None or start.identity is None):
            if job.log_path is not None and job.boot_id is not None:
                marker = read_marker(marker_path(Path(job.log_path).parent, job.boot_id))
                if may_still_start(marker):
                    # INV-UNKNOWN-KEEPS-SLOT: a start that boot sent just before it died may still be in its
                    # shepherd's hands (it reads what is on its socket after the supervisor is gone).
                    return Evidence(Liveness.UNKNOWN, detail="no start record yet: its shepherd may still start it")
            # That shepherd has handled every request it was sent (or is gone): a record written meanwhile is
            # there now, and none means the start never happened.
            start = read_start(files)
        if not job.spawned and start is not None and start.identity is not None:
            # INV-IDENTITY-BEFORE-PROGRAM: a prior boot died between the spawn and recording the pid (or this boot
            # gave up on the start's answer); the shepherd's start file names the process.
            identity = start.identity
            found = identity.to_record()
        if identity is None:
            # A pid without its start time is no evidence either way (UNKNOWN); no pid at all: it never ran.
            return Evidence(Liveness.UNKNOWN if job.spawned else None, detail="no verifiable process identity")
        liveness = probe(identity)
        exit_status = read_exit(files, identity.pid) if liveness is Liveness.DEAD else None
        return Evidence(
            liveness,
            exit_status=exit_status,
            exit_pending=_shepherd_alive(start),
            handle=ProcessHandle(job.job_id, identity.pid, identity, files, adopted=True),
            found=found,
        )
