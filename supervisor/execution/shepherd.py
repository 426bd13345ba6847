"""The job shepherd: one small process per supervisor boot that owns the jobs' processes.

Run as a script (``python -I shepherd.py --control-fd N``) by the subprocess executor; it imports nothing from the
package but its two siblings, which import only the standard library (it starts in ~20 ms and holds ~10 MB whatever
the number of jobs): ``_shepherd_jobs`` (a job's spawn behind its gate, and the child it owns) and ``_shepherd_files``
(what it writes: records, marker, trace). This module is its loop and its control protocol. It daemonizes at once
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
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time

TYPE_CHECKING = False  # typing is not imported by the shepherd (its start time); mypy reads this name as typing's
if TYPE_CHECKING or __package__:  # imported as part of the package (the executor's constants, the tests)
    from ._shepherd_files import Marker, RecordKeeper, Records, Spares, Trace, now_iso, say
    from ._shepherd_jobs import (
        JOB_OOM_SCORE_ADJ,
        Child,
        Spawned,
        StartRequest,
        check_log_writable,
        check_runnable,
        kernel_boot_id,
        spawn_behind_gate,
        start_time_of,
    )
else:  # run as a script (python -I: its directory is not on the path); appended, so the standard library comes first
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from _shepherd_files import Marker, RecordKeeper, Records, Spares, Trace, now_iso, say
    from _shepherd_jobs import (
        JOB_OOM_SCORE_ADJ,
        Child,
        Spawned,
        StartRequest,
        check_log_writable,
        check_runnable,
        kernel_boot_id,
        spawn_behind_gate,
        start_time_of,
    )

__all__ = ["JOB_OOM_SCORE_ADJ", "ShepherdProcess", "Spares", "main"]

# After a job's process exits, how long its output pipe may stay open (a daemon it left holds it) before the exit is
# reported anyway; the pipe is still drained to the end.
LOG_LINGER_S = 5.0
PR_SET_CHILD_SUBREAPER = 36


class ShepherdProcess:
    """The shepherd itself: one selector loop over the supervisor's control socket, the children's output pipes and
    their exits (SIGCHLD), that starts, signals, reaps and records jobs (the module docstring). ``ShepherdClient``
    (``_shepherd_client.py``) is its other end."""

    def __init__(self, control: socket.socket) -> None:
        self.control: socket.socket | None = control
        self.control.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.jobs: dict[str, Child] = {}
        self.by_pid: dict[int, Child] = {}
        self.by_pipe: dict[int, Child] = {}
        self.inbuf = b""
        self.outbuf = b""
        self.boot_id = kernel_boot_id()
        self.spares = Spares()
        self.keeper = RecordKeeper(self.spares)  # where each job's records are written, and which only in the run dir
        self.base_env: dict[str, str] = {}  # what every job's environment starts from (the "env" request)
        self.tracer = Trace()  # the optional trace: one line per start and per exit
        self.identity = {"pid": os.getpid(), "start_time": start_time_of(os.getpid())}
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
        """Write one state record where it belongs now (``RecordKeeper``); raises OSError when it cannot be written."""
        self.keeper.record(records, which, payload, connected=self.control is not None)

    def forget_records(self, job_id: str) -> None:
        """The supervisor has made the job's row final: its run-directory records are redundant."""
        job = self.jobs.get(job_id)
        self.keeper.forget(job_id, running=job is not None and job.exit is None)

    def persist(self) -> None:
        """Every record that only the run directory holds, written next to its log (``RecordKeeper.persist``)."""
        self.keeper.persist()

    # -- jobs --------------------------------------------------------------------------------------

    def start(self, req: dict[str, object]) -> None:
        start = StartRequest(req, self.base_env)
        records = Records(
            {"pid": str(req["pid_file"]), "exit": str(req["exit_file"])},
            {"pid": str(req.get("run_pid_file") or ""), "exit": str(req.get("run_exit_file") or "")},
        )
        refusal = self.refusal(start)
        if refusal is not None:
            self.send({"ev": "start_failed", "id": start.job_id, "error": refusal[:1000]})
            return
        try:
            spawned = spawn_behind_gate(start)
        except Exception as exc:  # cannot start the gate at all (or an argv/env the OS cannot take)
            self.send({"ev": "start_failed", "id": start.job_id, "error": f"{type(exc).__name__}: {exc}"[:1000]})
            return
        start_time = start_time_of(spawned.pid)
        start_record: dict[str, object] = {
            "job_id": start.job_id,
            "pid": spawned.pid,
            "start_time": start_time,
            "kernel_boot_id": self.boot_id,
            "shepherd": self.identity,
            "started_at": now_iso(),
        }
        if not self.record_identity_then_open_gate(start.job_id, spawned, records, start_record):
            return
        self.watch(Child(start.job_id, spawned.pid, spawned.out_fd, start.log_path, start.cap, records), start_time)
        # The gate shell runs (posix_spawn returned after its exec), and its program was checked above; the exec
        # into the program is not waited for: a program removed in between ends the job with the shell's 127.
        self.send({"ev": "started", "id": start.job_id, "pid": spawned.pid, "start_time": start_time})
        self.tracer.write({"ev": "started", **start_record})

    def refusal(self, start: StartRequest) -> str | None:
        """Why this job must not be spawned (its log, the marker, its program), as exec would say it; None: it may."""
        try:
            check_log_writable(start.log_path)
        except OSError as exc:
            # INV-NO-START-WITHOUT-LOG: a job whose output could not be kept is not started (spawn_failed, naming
            # the path); the shepherd and every other job go on.
            return f"cannot write the job's log {start.log_path}: {exc.strerror or exc} ({exc.filename})"
        if self.marker.error is not None:
            self.marker.write("connected")  # a full disk may have room again
        if self.marker.error is not None:
            # Without its marker a later boot could not tell this start from one that never happened.
            return self.marker.error
        try:
            check_runnable(start.argv[0], start.cwd, start.env)
        except Exception as exc:  # the program cannot be run: say why, as its exec would have
            return f"{type(exc).__name__}: {exc}"
        return None

    def record_identity_then_open_gate(
        self, job_id: str, spawned: Spawned, records: Records, start_record: dict[str, object]
    ) -> bool:
        """INV-IDENTITY-BEFORE-PROGRAM: the .pid record exists before the program runs. A job whose identity cannot
        be recorded never runs: its shell is killed on the gate, and the start fails (False)."""
        try:
            self.record(records, "pid", start_record)
            spawned.open_gate()
        except OSError as exc:
            spawned.kill()  # never let a job run whose identity is not on disk
            self.forget_records(job_id)  # it never ran
            self.send({"ev": "start_failed", "id": job_id, "error": f"cannot record the job identity: {exc}"})
            return False
        spawned.close_gate()
        return True

    def watch(self, job: Child, start_time: int | None) -> None:
        """From now on the job's output is read into its log, and its exit is reaped and recorded."""
        assert job.pipe_fd is not None
        os.set_blocking(job.pipe_fd, False)
        job.start_time = start_time
        self.jobs[job.id] = job
        self.by_pid[job.pid] = job
        self.by_pipe[job.pipe_fd] = job
        self.sel.register(job.pipe_fd, selectors.EVENT_READ, "pipe")

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
                "ended_at": now_iso(),
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
            self.keeper.close()  # its spares, and its run directories if empty
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
