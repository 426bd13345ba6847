"""This boot's shepherd seen from the supervisor (``ShepherdClient``): it starts the shepherd on first use
(``shepherd.py``, run as a script, daemonized), sends it requests and reads its events over a socket pair
(newline-delimited JSON; the protocol is ``shepherd.py``'s docstring), and tells each job's start and exit to whoever
waits for them. A shepherd outlives its supervisor: what it cannot tell any more, its records say (``_job_files``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ..domain import Liveness, SpawnError, StartOutcomeUnknown
from ..observe import get_logger
from ._base import ExitStatus
from ._identity import ProcessIdentity, kernel_boot_id, probe
from ._job_files import JobFiles, prepare_run_dir, prune_markers

log = get_logger()


SHEPHERD = Path(__file__).with_name("shepherd.py")
# The shepherd answers in milliseconds; this bounds a wedged one's first word (a start's bound is the executor's).
SHEPHERD_HELLO_TIMEOUT_S = 10.0
SHEPHERD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class ShepherdLost(SpawnError):
    """This boot's shepherd went away before it reported the job's exit."""


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

    def end(self) -> None:
        """The shepherd is gone: a start not answered may or may not have happened (``gone``: its start record says),
        an exit not reported is lost (the job's monitor falls back to its identity)."""
        self.alive = False
        for watch in self.watches.values():
            if not watch.started.is_set():
                watch.start_error = "the shepherd went away"
                watch.gone = True
                watch.started.set()
            if not watch.exited.is_set():
                watch.lost = True
                watch.exited.set()
        self.watches.clear()

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
        start_timeout_s: float,
    ) -> None:
        self._stderr_path = stderr_path
        self._start_timeout_s = start_timeout_s  # how long a start's answer (or the rest of a request) is awaited
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
        sock = trio.socket.from_stdlib_socket(await self._launch(marker))
        with sock:
            lines = _lines(sock)
            conn = await self._greet(sock, lines, marker)
            task_status.started(conn)
            try:
                async for event in lines:
                    self._dispatch(conn, event)
                # EOF: the shepherd died (it never leaves while we hold the socket). Its jobs live on, unwatched
                # by it: their monitors fall back to their identities, and the next start brings a new shepherd.
                log.error("shepherd_lost", pid=conn.pid, jobs=len(conn.watches))
            finally:
                conn.end()

    async def _launch(self, marker: Path | None) -> socket.socket:
        """Start a shepherd process on one end of a new socket pair, and return the other end (ours)."""
        if marker is not None:
            await trio.to_thread.run_sync(prune_markers, marker.parent)
        ours, theirs = socket.socketpair()
        try:
            await self._prepare_run_dir()
            stderr_fd = await self._open_shepherd_log()
        except SpawnError:
            ours.close()
            theirs.close()
            raise
        try:
            await self._start_daemon(theirs, stderr_fd)
        except OSError as exc:
            ours.close()
            raise SpawnError(f"cannot start the shepherd: {exc.strerror or exc}") from exc
        finally:
            theirs.close()
            os.close(stderr_fd)
        return ours

    async def _prepare_run_dir(self) -> None:
        """The run directory, made and checked private (``prepare_run_dir``), before a shepherd writes there."""
        if self.run_dir is None:
            return
        run_dir, private_from = self.run_dir, self._run_dir_private_from
        assert private_from is not None
        try:
            await trio.to_thread.run_sync(prepare_run_dir, run_dir, private_from)
        except OSError as exc:
            raise SpawnError(
                f"cannot use the run directory {run_dir} (PODCAST_JOB_RUN_DIR): {exc.strerror or exc}"
            ) from exc

    async def _open_shepherd_log(self) -> int:
        """The shepherd's stderr: its log file, appended to."""
        try:
            return await trio.to_thread.run_sync(
                lambda: os.open(self._stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            )
        except OSError as exc:
            raise SpawnError(f"cannot open the shepherd's log {self._stderr_path}: {exc.strerror or exc}") from exc

    @staticmethod
    async def _start_daemon(theirs: socket.socket, stderr_fd: int) -> None:
        """Run ``shepherd.py`` on ``theirs``; it double-forks and its launcher exits at once: the shepherd is nobody's
        child (a supervisor crash never takes it down, and nobody has to reap it)."""
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
        await launcher.wait()

    async def _greet(self, sock: trio.socket.SocketType, lines: Any, marker: Path | None) -> _Connection:
        """The shepherd's hello (its identity), answered with what every job's environment starts from, the trace
        and where its marker goes."""
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
        return conn

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
                with trio.CancelScope(shield=True), trio.move_on_after(self._start_timeout_s):
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
        request = _start_request(job_id, argv, env, cwd, files, log_max_bytes, memory_max_mb)
        await self._ask_start(job_id, watch, conn, request)
        self._raise_unless_started(job_id, watch, conn)
        return await self._started_job(watch)

    async def _ask_start(self, job_id: str, watch: _Watch, conn: _Connection, request: dict[str, Any]) -> None:
        """Send the start and wait for its answer, at most the start timeout."""
        try:
            await self._send(conn, request)
            with trio.move_on_after(self._start_timeout_s):
                await watch.started.wait()
        except ShepherdLost as exc:
            # The socket failed while the start was being asked: the shepherd may have read it before it went.
            self._abandon(job_id, watch, conn)
            raise StartOutcomeUnknown(f"the start was being asked when {exc}") from exc
        except BaseException:
            # Cancelled while the start was being asked (or waited for): the shepherd may have read it.
            self._abandon(job_id, watch, conn)
            raise

    def _raise_unless_started(self, job_id: str, watch: _Watch, conn: _Connection) -> None:
        """A start not answered is of unknown outcome (``StartOutcomeUnknown``); one refused is a ``SpawnError``."""
        if not watch.started.is_set() or watch.gone:
            # A start asked and not answered (a shepherd stopped or swapped out; one that died meanwhile): the job
            # may run or never will. Never a failure: the evidence tells which (start_pending, the start record).
            self._abandon(job_id, watch, conn)
            if watch.gone:
                raise StartOutcomeUnknown("the shepherd went away before it answered the start")
            raise StartOutcomeUnknown(f"the shepherd did not answer the start within {self._start_timeout_s:g} s")
        if watch.start_error is not None or watch.pid is None:
            self._watches.pop(job_id, None)
            raise SpawnError(watch.start_error or "the shepherd reported no pid")

    async def _started_job(self, watch: _Watch) -> StartedJob:
        """The started job's identity: its pid with its start time, for this machine's boot."""
        assert watch.pid is not None
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


def _start_request(
    job_id: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    files: JobFiles,
    log_max_bytes: int,
    memory_max_mb: int | None,
) -> dict[str, Any]:
    """A ``start`` request (the protocol: ``shepherd.py``)."""
    return {
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
    }


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
