"""A job's process as the shepherd starts and keeps it: what a start asks (``StartRequest``), the checks before the
spawn, the spawn behind its gate (``spawn_behind_gate``), and the child it then owns (``Child``).

Part of the shepherd (``shepherd.py``, run as a script): it imports nothing but the standard library.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat

TYPE_CHECKING = False  # typing is not imported by the shepherd (its start time); mypy reads this name as typing's
if TYPE_CHECKING:
    from ._shepherd_files import Records


def start_time_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def kernel_boot_id() -> str | None:
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
    f"{{ echo {JOB_OOM_SCORE_ADJ} >/proc/self/oom_score_adj; }} 2>/dev/null; "
    '[ "$2" = - ] || ulimit -v "$2" || exit 124; cd -- "$1" || exit 126; shift 2; exec "$@"'
)
# Dispositions the shepherd changes for itself that a job must not inherit (an ignored signal survives exec).
JOB_DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD)


def check_runnable(program: str, cwd: str, env: dict[str, str]) -> None:
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


class StartRequest:
    """A ``start`` request, read before anything is made: the job's id, program, environment (its own variables over
    the base), directory, log and its cap, and its address-space bound for the gate (KiB, ``-``: none)."""

    __slots__ = ("argv", "cap", "cwd", "env", "job_id", "log_path", "memory_kib")

    def __init__(self, req: dict[str, object], base_env: dict[str, str]) -> None:
        self.job_id = str(req["id"])
        self.log_path = str(req["log"])
        self.argv = [str(a) for a in req["argv"]]  # type: ignore[attr-defined]
        self.env = {**base_env, **{str(k): str(v) for k, v in req["env"].items()}}  # type: ignore[attr-defined]
        self.cwd = str(req["cwd"])
        memory = req.get("memory_max_mb")
        self.memory_kib = str(int(str(memory)) * 1024) if memory is not None else "-"
        self.cap = int(str(req["cap"]))


class Spawned:
    """A job's gate shell, spawned and waiting on its gate: its pid, the read end of its output pipe (``out_fd``)
    and the write end of its gate (``gate_fd``)."""

    __slots__ = ("gate_fd", "out_fd", "pid")

    def __init__(self, pid: int, out_fd: int, gate_fd: int) -> None:
        self.pid = pid
        self.out_fd = out_fd
        self.gate_fd = gate_fd

    def open_gate(self) -> None:
        """The shell reads this line, closes the gate and execs the job's program (same pid, same start time)."""
        os.write(self.gate_fd, b"g\n")

    def close_gate(self) -> None:
        os.close(self.gate_fd)

    def kill(self) -> None:
        """Kill the shell still waiting on its gate (its program never ran), and reap it."""
        os.kill(self.pid, signal.SIGKILL)
        os.close(self.gate_fd)
        os.close(self.out_fd)
        os.waitpid(self.pid, 0)


def spawn_behind_gate(start: StartRequest) -> Spawned:
    """Spawn the job's gate shell in its own session, its stdout and stderr on a new pipe, its gate on ``GATE_FD``.

    posix_spawn (vfork + exec in glibc): no copy of this process's page tables and no copy-on-write faults, where
    fork() was most of the shepherd's time per job. The child is a POSIX shell that waits on the gate, then becomes
    the job's program by exec (same pid, same start time). Raises what the spawn raised (every descriptor closed).
    """
    out_r, out_w = os.pipe()
    gate_r, gate_w = os.pipe()
    if gate_r <= GATE_FD:  # file actions dup2 it onto GATE_FD: never onto itself (that would keep close-on-exec)
        gate_r, low = fcntl.fcntl(gate_r, fcntl.F_DUPFD_CLOEXEC, GATE_FD + 1), gate_r
        os.close(low)
    try:
        pid = os.posix_spawn(
            GATE_SHELL,
            [GATE_SHELL, "-c", GATE_SCRIPT, "podcast-job-gate", start.cwd, start.memory_kib, *start.argv],
            start.env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, out_w, 2),
                (os.POSIX_SPAWN_DUP2, gate_r, GATE_FD),
            ],
            setsid=True,
            setsigdef=JOB_DEFAULT_SIGNALS,
        )
    except Exception:
        for fd in (out_r, out_w, gate_r, gate_w):
            os.close(fd)
        raise
    os.close(out_w)
    os.close(gate_r)
    return Spawned(pid, out_r, gate_w)
