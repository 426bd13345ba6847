"""The job shepherd: one small process per supervisor boot that owns the jobs' processes.

Run as a script (``python -I shepherd.py --control-fd N``) by the subprocess executor; it imports nothing from the
package on purpose (it starts in ~20 ms and holds ~10 MB whatever the number of jobs). It daemonizes at once
(double fork, own session), so a supervisor crash never takes it or the jobs down, and nobody has to reap it.

What it does (ADR 0004):

- **start**: spawns the job (``posix_spawn``: vfork + exec, no copy of this process) into its own session with
  stdout+stderr on a pipe, writes the job's identity (``<id>.pid``: pid, start time, kernel boot id, and the
  shepherd's own identity) atomically next to the log **before the job's program runs** (the child is a POSIX shell
  that waits on a gate until the file exists, then execs the program: same pid, same start time), then opens the
  gate. A boot that finds a RUNNING row without a pid looks there first: no file means the program provably never
  ran. A program that cannot run (missing, not executable, no such directory) is refused before the spawn with the
  reason exec would give (``start_failed``); so is a job whose log directory cannot be written (missing, not a
  directory, read-only), naming it, so that no job runs whose output would be lost.
- **logs**: one epoll loop reads every job's pipe into its log file (made at the job's first output), capped, and
  never stops reading, so no job blocks on a full pipe or dies of SIGPIPE while the shepherd lives.
- **spares**: while it has nothing else to do, it makes a few empty files where it writes records; the ``.pid`` and
  ``.exit`` records are written into one and renamed into place (``Spares``), so that no file is made between a
  job's exit and the next job's start.
- **exit**: it reaps its children (SIGCHLD) and writes each job's true exit status atomically (``<id>.exit``: exit code
  or signal, end time, and the job's pid + start time + kernel boot id) before telling the supervisor. A job that
  ends while no supervisor runs still has its outcome on disk for the next boot (or for the fleet's leader).
- **signal**: signals a job's process group on the supervisor's request; the leader is its unreaped child, so the
  pid cannot have been recycled.
- **marker**: it keeps ``.shepherd-<boot>.json`` next to the logs (the path comes with ``env``, before any start):
  its identity, and whether its supervisor is still ``connected`` or ``closed`` (written once the control socket
  has ended: every start it was sent has been handled by then). A later boot reads it for a row the dead boot
  promoted with no start record: a shepherd still connected (and alive) may yet start it; one closed or dead never
  will, so the job provably never ran. Removed when the shepherd exits.
- It exits by itself once its supervisor is gone (control socket closed) and it has no job left.

The state files are written without fsync on purpose: they must survive a *process* crash (the page cache does);
a kernel crash ends every job anyway, and the kernel boot id then tells the next boot so.

Where they are written (``Records``): to the run directory (tmpfs) while the supervisor is connected, dropped on its
``forget`` once the row is final; when it goes away (or on SIGTERM) the shepherd first writes whatever is left there
next to the logs, and later records go there directly.

Control protocol: newline-delimited JSON on the control socket.
Requests: ``{"op": "env", "env", "trace", "marker"}`` (the base environment of every job, sent once; ``trace``: an
optional file to append a line to at each start and exit; ``marker``: where to keep the marker),
``{"op": "start", "id", "argv", "env", "cwd", "log", "cap", "pid_file", "exit_file", "run_pid_file",
"run_exit_file"}`` (``env``: the job's own variables, over the base; the ``run_`` paths may be null),
``{"op": "signal", "id", "sig"}``, ``{"op": "forget", "id"}``.
Events: ``{"ev": "hello", "pid", "start_time"}``, ``{"ev": "started", "id", "pid", "start_time"}``,
``{"ev": "start_failed", "id", "error"}``, ``{"ev": "exited", "id", "pid", "exit_code", "signal", "ended_at"}``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import stat
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime

# After a job's process exits, how long its output pipe may stay open (a daemon it left holds it) before the exit is
# reported anyway; the pipe is still drained to the end.
LOG_LINGER_S = 5.0
PR_SET_CHILD_SUBREAPER = 36


def say(message: str) -> None:
    """One diagnostic line on stderr (the shepherd's log file). Never raises: that file is most often on the disk
    that just filled up, and a shepherd that died of its own complaint would leave every job unwatched."""
    try:
        os.write(2, message.encode(errors="replace") + b"\n")
    except OSError:
        pass


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _kernel_boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


# The job's first program: a POSIX shell that waits on the gate (fd 3) until the shepherd has recorded its identity,
# closes it, enters the job's directory and execs the job's program (PATH from the job's environment, as execvpe).
GATE_SHELL = "/bin/sh"
GATE_FD = 3
# Every job is a likelier choice for the kernel's OOM killer than the supervisor and its shepherd (0): a runaway job
# is the one killed, never the process that would record its end (the docker executor sets the same on containers).
JOB_OOM_SCORE_ADJ = 500
# $1: the job's directory; $2: its address-space bound in KiB ("-": none). Before the exec, in the process that becomes
# the program (same pid): a likelier OOM victim than the shepherd (JOB_OOM_SCORE_ADJ; raising one's own is allowed),
# and the kind's memory bound (ulimit -v: RLIMIT_AS, inherited by exec).
GATE_SCRIPT = (
    'IFS= read -r gate <&3; exec 3<&-; [ "$gate" = g ] || exit 125; '
    f'{{ echo {JOB_OOM_SCORE_ADJ} >/proc/self/oom_score_adj; }} 2>/dev/null; '
    '[ "$2" = - ] || ulimit -v "$2" || exit 124; cd -- "$1" || exit 126; shift 2; exec "$@"'
)
# Dispositions the shepherd changes for itself that a job must not inherit (an ignored signal survives exec).
JOB_DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD)


def _check_runnable(program: str, cwd: str, env: dict[str, str]) -> None:
    """Raise what exec (or chdir) would raise for this job, so that a start fails with its reason (``spawn_failed``)
    instead of a job that exits 127: the directory must exist, the program must be an executable file."""
    if not os.path.isdir(cwd):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), cwd)
    if "/" in program:
        candidates = [os.path.join(cwd, program)]
    else:
        path = env.get("PATH", os.defpath)
        candidates = [os.path.join(os.path.join(cwd, d) if d else cwd, program) for d in path.split(os.pathsep)]
    denied = None
    for candidate in candidates:
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return
            denied = candidate
    if denied is not None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), denied)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def check_log_writable(log_path: str) -> None:
    """Raise an OSError naming the log's directory when the job's log could not be made there (gone, not a
    directory, read-only, no permission). Two cheap calls, no file made: the log itself is made at the job's first
    output, and a start must not wait on a metadata change (docs/performance.md)."""
    directory = os.path.dirname(log_path) or "."
    st = os.stat(directory)  # FileNotFoundError; NotADirectoryError when a parent is a file
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory)
    if not os.access(directory, os.W_OK | os.X_OK):
        # access() says no without saying why: a read-only mount (which even root cannot write), or permissions.
        readonly = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
        code = errno.EROFS if readonly else errno.EACCES
        raise OSError(code, os.strerror(code), directory)


def write_atomically(path: str, payload: dict[str, object], spare: str | None = None) -> None:
    """Write JSON to ``path`` so that a reader sees the old file or the whole new one, never a part.

    ``spare``: an empty file of this shepherd's, made beforehand in the same directory, written and renamed instead of
    a new temporary file (one metadata change on the way instead of two; see ``Spares``).
    """
    fd = None
    if spare is not None:
        # Made empty (O_EXCL) by this shepherd and never written but here: no O_TRUNC, which on ext4 marks the file
        # for a data flush at close (the replace-by-truncate heuristic), three times slower here.
        try:
            tmp, fd = spare, os.open(spare, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass  # removed by hand: make the temporary file after all
    if fd is None:
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    try:
        os.write(fd, json.dumps(payload, sort_keys=True).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Spares:
    """Empty files made ahead, while the shepherd is idle, in each directory where it writes state files.

    A state file is written to a temporary file and renamed, so that a reader never sees a part of it; making that
    temporary file is a metadata change as costly as the rename (on this project's VMs, from 20 us to nearly 1 ms
    when the journal is busy), and both sat on the way from a job's exit to the next job's start (docs/performance.md:
    promotion latency). A spare is made while nothing else waits; taking one costs nothing. When none is left (a
    burst), the temporary file is made as before. A shepherd removes its spares when it exits; a killed one's are
    removed, while idle, by the next shepherd that writes in the same directory.
    """

    PER_DIRECTORY = 4
    PREFIX = ".shepherd-spare-"

    def __init__(self) -> None:
        self._ready: dict[str, list[str]] = {}
        self._broken: set[str] = set()
        self._unswept: set[str] = set()  # directories whose dead shepherds' spares are still to be removed
        self._seq = 0

    def take(self, path: str) -> str | None:
        directory = os.path.dirname(path)
        if directory not in self._ready:
            self._ready[directory] = []
            self._unswept.add(directory)  # swept while idle: the jobs' directory holds every past job's files
        ready = self._ready[directory]
        return ready.pop(0) if ready else None  # the oldest first

    def wanted(self) -> bool:
        return bool(self._unswept) or any(
            len(r) < self.PER_DIRECTORY and d not in self._broken for d, r in self._ready.items()
        )

    def make_one(self) -> None:
        """One step of idle work: sweep a directory, or make one missing spare (a failure is left for the write that
        would have used it to meet)."""
        if self._unswept:
            self._sweep_dead(self._unswept.pop())
            return
        for directory, ready in self._ready.items():
            if len(ready) < self.PER_DIRECTORY and directory not in self._broken:
                self._seq += 1
                path = os.path.join(directory, f"{self.PREFIX}{os.getpid()}-{self._seq}")
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640))
                except OSError:
                    # Cannot make files there (gone, full, read-only): no spares there; writes make their own.
                    self._broken.add(directory)
                    return
                ready.append(path)
                return

    def remove_all(self) -> None:
        for ready in self._ready.values():
            for path in ready:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        self._ready.clear()

    def _sweep_dead(self, directory: str) -> None:
        """Spares left by a shepherd that was killed (its pid no longer runs)."""
        try:
            names = [n for n in os.listdir(directory) if n.startswith(self.PREFIX)]
        except OSError:
            return
        for name in names:
            try:
                pid = int(name[len(self.PREFIX) :].split("-", 1)[0])
                os.kill(pid, 0)
                continue  # alive (or another user's): not ours to remove
            except ProcessLookupError:
                pass
            except (ValueError, PermissionError):
                continue
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


class Records:
    """One job's two state records (``pid``: its identity; ``exit``: its true exit status) and where they are.

    While a supervisor is connected, a record is written to the run directory (tmpfs: no journal, so microseconds,
    where a create-and-rename in the jobs' directory on ext4 cost about 1 ms under load, twice per job;
    docs/performance.md), and the supervisor says ``forget`` once the job's row is final: the registry then holds
    everything they say, and the run copies go. When the supervisor goes away (or the shepherd is told to stop) every
    record still in the run directory is first written next to the log (``ShepherdProcess.persist``), and from then on
    records are written there directly: what a next boot reads is where it always was, and survives an orderly reboot.
    Without a run directory (none configured, or it cannot be written) a record goes next to the log at once, as before.
    """

    __slots__ = ("durable", "in_run", "payload", "run")

    def __init__(self, durable: dict[str, str], run: dict[str, str]) -> None:
        self.durable = durable  # "pid"/"exit" -> the path next to the log
        self.run = run  # "pid"/"exit" -> the path in the run directory (empty: none)
        self.payload: dict[str, dict[str, object]] = {}
        self.in_run: set[str] = set()  # which records exist only in the run directory


class Child:
    """One job this shepherd started and owns (its unreaped child): its pid and start time, its output pipe and log
    file, its records, and its exit once reaped (``done_reported``: the supervisor has been told)."""

    __slots__ = (
        "cap",
        "done_reported",
        "exit",
        "id",
        "linger_until",
        "log_fd",
        "log_path",
        "pid",
        "pipe_fd",
        "records",
        "start_time",
        "written",
    )

    def __init__(self, job_id: str, pid: int, pipe_fd: int, log_path: str, cap: int, records: Records) -> None:
        self.id = job_id
        self.records = records
        self.start_time: int | None = None
        self.pid = pid
        self.pipe_fd: int | None = pipe_fd
        self.log_path = log_path
        self.log_fd: int | None = None  # opened at the job's first output: no file to make on the way to its start
        self.cap = cap
        self.written = 0
        self.exit: dict[str, object] | None = None
        self.linger_until: float | None = None
        self.done_reported = False

    def write_output(self, chunk: bytes) -> None:
        if self.written >= self.cap:
            return  # capped: keep reading, write nothing
        if self.log_fd is None:
            # Appended to, as before: whatever the file holds counts against the cap.
            self.log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            self.written = os.fstat(self.log_fd).st_size
            if self.written >= self.cap:
                return
        room = self.cap - self.written
        data = chunk[:room]
        os.write(self.log_fd, data)
        self.written += len(data)
        if self.written >= self.cap:
            os.write(self.log_fd, f"\n[log capped at {self.cap} bytes; further output discarded]\n".encode())


def write_run_record(path: str, payload: dict[str, object], spares: Spares) -> None:
    """A state record in the run directory (made again, private, if it went)."""
    try:
        write_atomically(path, payload, spares.take(path))
    except FileNotFoundError:
        # The directory went: a shepherd of this data dir's previous boot removes it when it leaves, empty, and may
        # have just done so. Its parents were checked by our supervisor; make it again, private.
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomically(path, payload)


class Marker:
    """The marker (see the module docstring): who this shepherd is, and whether its supervisor is connected. ``error``:
    why it could not be written (no job starts without it)."""

    def __init__(self, identity: Mapping[str, object], boot_id: str | None) -> None:
        self.identity = identity
        self.boot_id = boot_id
        self.path: str | None = None  # where to keep it (the "env" request)
        self.error: str | None = None

    def write(self, control: str) -> None:
        if self.path is None:
            return
        payload: dict[str, object] = {**self.identity, "kernel_boot_id": self.boot_id, "control": control}
        try:
            write_atomically(self.path, payload)
        except OSError as exc:
            self.error = f"cannot write the shepherd's marker {self.path}: {exc}"
            say(f"shepherd: {self.error}")
        else:
            self.error = None

    def remove(self) -> None:
        if self.path is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass  # a marker left behind names a dead shepherd: read the same as none


class Trace:
    """The optional trace (diagnostics: every start and exit as this shepherd saw them, on its clock)."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def open(self, path: str) -> None:
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            say(f"shepherd: cannot open the trace {path}: {exc}")

    def write(self, event: dict[str, object]) -> None:
        """One line of the trace."""
        if self.fd is None:
            return
        try:
            os.write(self.fd, json.dumps(event).encode() + b"\n")  # one write: lines never interleave
        except OSError as exc:
            say(f"shepherd: trace write failed, tracing stops: {exc}")
            os.close(self.fd)
            self.fd = None


class ShepherdProcess:
    """The shepherd itself: one selector loop over the supervisor's control socket, the children's output pipes and
    their exits (SIGCHLD), that starts, signals, reaps and records jobs (the module docstring). ``ShepherdClient``
    (``subprocess.py``) is its other end."""

    def __init__(self, control: socket.socket) -> None:
        self.control: socket.socket | None = control
        self.control.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.jobs: dict[str, Child] = {}
        self.by_pid: dict[int, Child] = {}
        self.by_pipe: dict[int, Child] = {}
        self.inbuf = b""
        self.outbuf = b""
        self.boot_id = _kernel_boot_id()
        self.spares = Spares()
        self.base_env: dict[str, str] = {}  # what every job's environment starts from (the "env" request)
        self.records: dict[str, Records] = {}  # job id -> records that exist only in the run directory
        self.run_dirs: set[str] = set()  # removed when this shepherd leaves, if empty
        self.tracer = Trace()  # the optional trace: one line per start and per exit
        self.identity = {"pid": os.getpid(), "start_time": _start_time(os.getpid())}
        self.marker = Marker(self.identity, self.boot_id)
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self.wake_r, self.wake_w = wake_r, wake_w
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler (not SIG_DFL) so the wakeup fd sees it
        # SIGTERM (an orderly shutdown of the machine, say): persist the run directory's records, then go.
        signal.signal(signal.SIGTERM, lambda *_: None)
        # The supervisor's terminal and its process group are not ours: only an explicit SIGTERM/SIGKILL stops us.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        self.sel.register(control, selectors.EVENT_READ, "control")

    # -- the control channel ---------------------------------------------------------------------

    def send(self, event: dict[str, object]) -> None:
        if self.control is None:
            return  # the supervisor is gone: the state files are the record
        self.outbuf += json.dumps(event).encode() + b"\n"
        self.flush()

    def flush(self) -> None:
        while self.outbuf and self.control is not None:
            try:
                sent = self.control.send(self.outbuf)
            except BlockingIOError:
                break
            except OSError:
                self.lose_control()
                return
            self.outbuf = self.outbuf[sent:]
        if self.control is not None:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.outbuf else 0)
            self.sel.modify(self.control, events, "control")

    def lose_control(self) -> None:
        if self.control is None:
            return
        self.sel.unregister(self.control)
        self.control.close()
        self.control = None
        self.outbuf = b""
        self.persist()  # nobody will say "forget" now: what only the run directory holds goes next to the logs
        # Every request the supervisor sent has been read and handled: no start of its can come after this.
        self.marker.write("closed")

    def read_control(self) -> None:
        assert self.control is not None
        try:
            data = self.control.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.lose_control()
            return
        self.inbuf += data
        while b"\n" in self.inbuf:
            line, self.inbuf = self.inbuf.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                self.handle(request)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a bug in the caller: say so, go on
                say(f"shepherd: bad request {line[:200]!r}: {exc!r}")

    def handle(self, request: dict[str, object]) -> None:
        op = request.get("op")
        if op == "env":
            self.base_env = {str(k): str(v) for k, v in request["env"].items()}  # type: ignore[attr-defined]
            if request.get("trace"):
                self.tracer.open(str(request["trace"]))
            if request.get("marker"):
                self.marker.path = str(request["marker"])
                self.marker.write("connected")
        elif op == "start":
            self.start(request)
        elif op == "signal":
            self.signal_job(str(request["id"]), int(str(request["sig"])))
        elif op == "forget":
            self.forget_records(str(request["id"]))

    # -- state records -------------------------------------------------------------------------------

    def record(self, records: Records, which: str, payload: dict[str, object]) -> None:
        """Write one state record where it belongs now (see ``Records``); raises OSError when it cannot be written."""
        run_path = records.run.get(which) if self.control is not None else None
        records.payload[which] = payload
        if run_path:
            try:
                write_run_record(run_path, payload, self.spares)
                self.run_dirs.add(os.path.dirname(run_path))
            except OSError as exc:  # the run directory is unusable (full, say): the durable place is always right
                say(f"shepherd: {run_path}: {exc}; writing next to the log")
            else:
                records.in_run.add(which)
                self.records[str(payload["job_id"])] = records
                return
        path = records.durable[which]
        write_atomically(path, payload, self.spares.take(path))

    def forget_records(self, job_id: str) -> None:
        """The supervisor has made the job's row final: its run-directory records are redundant."""
        records = self.records.get(job_id)
        job = self.jobs.get(job_id)
        if records is None or (job is not None and job.exit is None):
            return  # none there, or still running: its identity is still evidence
        del self.records[job_id]
        for which in records.in_run:
            try:
                os.unlink(records.run[which])
            except OSError:
                pass
        records.in_run.clear()

    def persist(self) -> None:
        """Every record that only the run directory holds, written next to its log; then the run copy goes.

        Written before it is removed, so that a reader who looks in the run directory first and then next to the log
        always finds one of them.
        """
        for job_id, records in list(self.records.items()):
            for which in sorted(records.in_run, reverse=True):  # the identity first
                try:
                    write_atomically(records.durable[which], records.payload[which])
                except OSError as exc:  # the run copy stays: a next boot still reads it there (until a reboot)
                    say(f"shepherd: job {job_id}: cannot persist its {which} record: {exc}")
                    continue
                records.in_run.discard(which)
                try:
                    os.unlink(records.run[which])
                except OSError:
                    pass
            if not records.in_run:
                del self.records[job_id]
        sys.stderr.flush()

    # -- jobs --------------------------------------------------------------------------------------

    def start(self, req: dict[str, object]) -> None:
        job_id = str(req["id"])
        log_path = str(req["log"])
        argv = [str(a) for a in req["argv"]]  # type: ignore[attr-defined]
        env = {**self.base_env, **{str(k): str(v) for k, v in req["env"].items()}}  # type: ignore[attr-defined]
        records = Records(
            {"pid": str(req["pid_file"]), "exit": str(req["exit_file"])},
            {"pid": str(req.get("run_pid_file") or ""), "exit": str(req.get("run_exit_file") or "")},
        )
        cwd = str(req["cwd"])
        memory = req.get("memory_max_mb")
        memory_kib = str(int(str(memory)) * 1024) if memory is not None else "-"
        try:
            check_log_writable(log_path)
        except OSError as exc:
            # INV-NO-START-WITHOUT-LOG: a job whose output could not be kept is not started (spawn_failed, naming
            # the path); the shepherd and every other job go on.
            error = f"cannot write the job's log {log_path}: {exc.strerror or exc} ({exc.filename})"
            self.send({"ev": "start_failed", "id": job_id, "error": error[:1000]})
            return
        if self.marker.error is not None:
            self.marker.write("connected")  # a full disk may have room again
        if self.marker.error is not None:
            # Without its marker a later boot could not tell this start from one that never happened.
            self.send({"ev": "start_failed", "id": job_id, "error": self.marker.error[:1000]})
            return
        try:
            _check_runnable(argv[0], cwd, env)
        except Exception as exc:  # the program cannot be run: say why, as its exec would have
            self.send({"ev": "start_failed", "id": job_id, "error": f"{type(exc).__name__}: {exc}"[:1000]})
            return
        out_r, out_w = os.pipe()
        gate_r, gate_w = os.pipe()
        if gate_r <= GATE_FD:  # file actions dup2 it onto GATE_FD: never onto itself (that would keep close-on-exec)
            gate_r, low = fcntl.fcntl(gate_r, fcntl.F_DUPFD_CLOEXEC, GATE_FD + 1), gate_r
            os.close(low)
        try:
            # posix_spawn (vfork + exec in glibc): no copy of this process's page tables and no copy-on-write
            # faults, where fork() was most of the shepherd's time per job. The child is a POSIX shell that waits
            # on the gate, then becomes the job's program by exec (same pid, same start time).
            # INV-IDENTITY-BEFORE-PROGRAM: the .pid file exists before the program runs.
            pid = os.posix_spawn(
                GATE_SHELL,
                [GATE_SHELL, "-c", GATE_SCRIPT, "podcast-job-gate", cwd, memory_kib, *argv],
                env,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, out_w, 1),
                    (os.POSIX_SPAWN_DUP2, out_w, 2),
                    (os.POSIX_SPAWN_DUP2, gate_r, GATE_FD),
                ],
                setsid=True,
                setsigdef=JOB_DEFAULT_SIGNALS,
            )
        except Exception as exc:  # cannot start the gate at all (or an argv/env the OS cannot take)
            for fd in (out_r, out_w, gate_r, gate_w):
                os.close(fd)
            self.send({"ev": "start_failed", "id": job_id, "error": f"{type(exc).__name__}: {exc}"[:1000]})
            return
        os.close(out_w)
        os.close(gate_r)
        start_time = _start_time(pid)
        start_record: dict[str, object] = {
            "job_id": job_id,
            "pid": pid,
            "start_time": start_time,
            "kernel_boot_id": self.boot_id,
            "shepherd": self.identity,
            "started_at": _now_iso(),
        }
        try:
            self.record(records, "pid", start_record)
            os.write(gate_w, b"g\n")
        except OSError as exc:
            os.kill(pid, signal.SIGKILL)  # never let a job run whose identity is not on disk
            os.close(gate_w)
            os.close(out_r)
            os.waitpid(pid, 0)
            self.forget_records(job_id)  # it never ran
            self.send({"ev": "start_failed", "id": job_id, "error": f"cannot record the job identity: {exc}"})
            return
        os.close(gate_w)
        os.set_blocking(out_r, False)
        job = Child(job_id, pid, out_r, log_path, int(str(req["cap"])), records)
        job.start_time = start_time
        self.jobs[job_id] = job
        self.by_pid[pid] = job
        self.by_pipe[out_r] = job
        self.sel.register(out_r, selectors.EVENT_READ, "pipe")
        # The gate shell runs (posix_spawn returned after its exec), and its program was checked above; the exec
        # into the program is not waited for: a program removed in between ends the job with the shell's 127.
        self.send({"ev": "started", "id": job_id, "pid": pid, "start_time": start_time})
        self.tracer.write({"ev": "started", **start_record})

    def signal_job(self, job_id: str, signum: int) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.exit is not None:
            return  # already reaped: its pid may belong to someone else now
        try:
            os.killpg(job.pid, signum)  # the whole group; the leader is our unreaped child
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                os.kill(job.pid, signum)
            except ProcessLookupError:
                pass

    def read_pipe(self, fd: int) -> None:
        job = self.by_pipe.get(fd)
        if job is None:
            return  # closed earlier in this pass: a stale readiness event
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close_pipe(job)
                self.maybe_done(job)
                return
            try:
                job.write_output(chunk)
            except OSError as exc:  # a full disk (or no log file) must not stop the draining: the job would block
                say(f"shepherd: job {job.id}: log write failed: {exc}")
                job.written = job.cap

    def close_pipe(self, job: Child) -> None:
        if job.pipe_fd is not None:
            self.sel.unregister(job.pipe_fd)
            del self.by_pipe[job.pipe_fd]
            os.close(job.pipe_fd)
            job.pipe_fd = None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.by_pid.pop(pid, None)
            if job is None:
                continue  # a job's orphaned descendant (we are their subreaper): nothing to record
            code = os.waitstatus_to_exitcode(status)
            job.exit = {
                "job_id": job.id,
                "pid": pid,
                # The full identity (pid + start time + kernel boot): another host reading this record on a shared
                # volume matches it against the row's, never by pid alone (INV-SILENT-HOST-ENDS-BY-PROOF).
                "start_time": job.start_time,
                "kernel_boot_id": self.boot_id,
                "exit_code": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
                "ended_at": _now_iso(),
            }
            self.tracer.write({"ev": "exited", **job.exit})
            try:
                self.record(job.records, "exit", job.exit)
            except OSError as exc:
                say(f"shepherd: job {job.id}: cannot record its exit: {exc}")
            job.linger_until = time.monotonic() + LOG_LINGER_S
            self.maybe_done(job)

    def maybe_done(self, job: Child) -> None:
        """Report the exit once it is reaped and its output has ended (or lingered too long)."""
        if job.exit is None or job.done_reported:
            return  # not ended, or already told
        if job.pipe_fd is not None and job.linger_until is not None and time.monotonic() < job.linger_until:
            return
        job.done_reported = True
        self.send({"ev": "exited", "id": job.id, **{k: v for k, v in job.exit.items() if k != "job_id"}})
        if job.pipe_fd is None:
            self.forget(job)

    def forget(self, job: Child) -> None:
        if job.log_fd is not None:
            os.close(job.log_fd)
            job.log_fd = None
        self.jobs.pop(job.id, None)

    def tick(self) -> None:
        """Lingering pipes: report exits that waited long enough; forget jobs whose pipes have ended."""
        for job in list(self.jobs.values()):
            self.maybe_done(job)
            if job.done_reported and job.pipe_fd is None:
                self.forget(job)

    def run(self) -> int:
        self.send({"ev": "hello", **self.identity})
        try:
            while self.control is not None or self.jobs:
                self.step()
        finally:
            self.marker.remove()
            self.spares.remove_all()
            for directory in self.run_dirs:
                try:
                    os.rmdir(directory)  # only if empty: what a killed shepherd left is still read from there
                except OSError:
                    pass
        return 0

    def step(self) -> None:
        lingering = any(j.exit is not None and not j.done_reported for j in self.jobs.values())
        # Spares are made only when nothing is ready (a zero timeout first): never ahead of a start or a reap.
        make_spares = self.spares.wanted()
        ready = self.sel.select(timeout=0 if make_spares else 0.2 if lingering else None)
        if not ready and make_spares:
            self.spares.make_one()
            return
        for key, _mask in ready:
            if key.data == "wake":
                signals = b""
                try:
                    while chunk := self.wake_r.recv(4096):
                        signals += chunk
                except BlockingIOError:
                    pass
                if signal.SIGTERM in signals:  # the wakeup fd carries each signal's number as one byte
                    self.lose_control()  # persists the run directory's records
                    raise SystemExit(0)  # the jobs live on in their own sessions, as they would after a SIGKILL
                self.reap()
            elif key.data == "control":
                if _mask & selectors.EVENT_READ:
                    self.read_control()
                if self.control is not None and _mask & selectors.EVENT_WRITE:
                    self.flush()
            elif key.data == "pipe":
                self.read_pipe(key.fd)
        self.reap()  # a SIGCHLD that raced the registration of its job
        self.tick()


def _daemonize() -> None:
    """Double fork: the shepherd is no child of the supervisor (nobody has to reap it) and leads no terminal."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)


def _become_subreaper() -> None:
    """Orphaned descendants of jobs are reparented to us, not to init: they stay accounted for (and reaped)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _raise_fd_limit() -> None:
    """Two descriptors a running job (pipe + log): lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
        except (ValueError, OSError):
            pass


def main(argv: list[str]) -> int:
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    control_fd = int(args["--control-fd"])
    _daemonize()
    os.set_inheritable(control_fd, False)
    control = socket.socket(fileno=control_fd)
    _become_subreaper()
    _raise_fd_limit()
    try:
        return ShepherdProcess(control).run()
    except OSError as exc:
        if exc.errno == errno.EBADF:
            return 1
        raise


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
