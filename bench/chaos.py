"""Chaos run: an operator's worst day. The supervisor is SIGKILLed and restarted again and again while jobs are
SIGKILLed from outside at random, in subprocess and in Docker mode, with resubmission on.

Usage: make chaos   (or .venv/bin/python bench/chaos.py [--mode subprocess|docker|both] [--jobs 1000]
                     [--kills 200] [--slots 3] [--seed 25] [--job-kill-every-s 1.0] [--smoke]
                     [--results-dir DIR] [--no-write])

Each job sleeps a few tenths of a second and exits 0; it appends a "start" and an "end" line (its job id, wall time,
pid) to a journal in the data dir (bind-mounted into its container in Docker mode), so the journal is the jobs' own
record of what ran. Its kind has ``max_attempts = 3``, a 0.2 s backoff and ``retry_on_exit_codes = [137]`` (how
Docker reports a container SIGKILLed from outside). Half the jobs are enqueued straight into the registry before the
first boot (as a CLI in another process would); the other half through ``POST /api/jobs`` while the supervisor comes
and goes (a job counts as acknowledged once its 202 is read; a request whose answer was lost is retried, and the job
it may have made is checked like any other row).

Meanwhile: ``supervisor serve`` is started, SIGKILLed after a random 0.5-3 s and started again, ``--kills`` times;
and, every ``--job-kill-every-s`` on average (exponential), one running job is SIGKILLed from outside: in subprocess
mode its own process (the pid its journal line gives, opened as a pidfd and checked to carry the job's
``PODCAST_JOB_ID`` before the signal: never a shepherd, never a reused pid), in Docker mode its container
(``ps-job-<id>[-<attempt>]``, checked by its ``ps.job_id`` and ``ps.attempt`` labels, ``docker kill``). A last boot
then runs until every row is terminal. What is checked, from the journal, the bench's own kill list, the registry and
the API of the last boot:

- nothing lost: every acknowledged job has a row, every row is terminal, and the API says what the registry says;
- nothing runs twice except as a recorded resubmit: each row's ``attempts`` is the number of its journal starts, its
  ``history`` holds one entry per earlier attempt, and no attempt starts before the previous one ended;
- every outcome is what the job really did: an attempt the bench killed is recorded as that kill
  (``failed/killed_by_SIGKILL``; Docker: ``failed/exit_code_137``) and resubmitted while attempts remain; a job
  whose last attempt exited 0 is ``succeeded``; no other reason appears;
- never more than ``--slots`` jobs at once: the journal's intervals (a killed attempt ends when the bench signalled
  it) and the registry's ``running`` count, sampled throughout;
- nothing stuck: the last boot drains everything; no job process (or container) of the run is left.

Exit status 1 when any check fails, 2 when the run could not be made (the supervisor exited by itself, no engine).
The results (parameters, figures, outcomes, each check's verdict and the first violations) go to
``bench/results/<UTC date>-<mode>-chaos.json`` (``--results-dir``; ``--smoke`` writes only where ``--results-dir``
says; ``--no-write`` nowhere); docs/reliability.md reports them.

The seed fixes the jobs' durations, the supervisor's lifetimes, the moments of the outside kills and the enqueues;
which job a kill hits depends on what runs at that moment, so two runs with one seed differ in detail.
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import git_revision, machine, versions  # noqa: E402
from results import results_name, run_header, write_json  # noqa: E402

from supervisor import Config, Job, SqliteRegistry, load_config, load_kinds  # noqa: E402
from supervisor.execution.docker import (  # noqa: E402
    ENGINE_ERRORS,
    LABEL_ATTEMPT,
    LABEL_JOB,
    container_name,
    make_client,
)
from supervisor.registry import NewJob  # noqa: E402

MODES = ("subprocess", "docker")
KIND = "work"
MAX_ATTEMPTS = 3
# How each mode records a SIGKILL from outside: the signal itself (a child of the shepherd), or the 128 + 9 the engine
# reports (it cannot tell a signal from an exit code; the kind lists 137 as "try again", as the pipeline kind does).
KILLED = {"subprocess": ("killed_by_SIGKILL", -9), "docker": ("exit_code_137", 137)}
DRAIN_LIMIT_S = 1800.0  # the last boot's drain; a long Docker run on a busy machine takes minutes, never this
GONE_LIMIT_S = 120.0

JOB = r"""
import os, sys, time
journal = sys.argv[2]
def note(what):
    line = "%s %s %.6f %d\n" % (what, os.environ["PODCAST_JOB_ID"], time.time(), os.getpid())
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
note("start")
time.sleep(float(sys.argv[1]))
note("end")
"""


def kinds_toml(journal: Path) -> str:
    argv = ["{python}", "-c", JOB, "{seconds}", str(journal)]
    return (
        f"[kinds.{KIND}]\nargv = {json.dumps(argv)}\nparams = {{ seconds = \"float\" }}\n"
        f"max_attempts = {MAX_ATTEMPTS}\nretry_backoff_seconds = 0.2\nretry_backoff_max_seconds = 1.0\n"
        "retry_on_exit_codes = [137]\n"
    )


def call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A registry call from this blocking script: each in a Trio run of its own."""
    return trio.run(functools.partial(method, *args, **kwargs))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the journal: what the jobs themselves say ran --------------------------------------------------------------


@dataclass
class Run:
    """One start of a job's program: its journal lines, and the bench's kill of it if any."""

    start: float
    pid: int
    end: float | None = None
    killed_at: float | None = None  # just before the bench's signal: the latest moment it is known to have lived

    @property
    def open(self) -> bool:
        return self.end is None and self.killed_at is None

    @property
    def stop(self) -> float:
        return min(t for t in (self.end, self.killed_at, float("inf")) if t is not None)


@dataclass
class Journal:
    path: Path
    offset: int = 0
    runs: dict[str, list[Run]] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)

    def read(self) -> None:
        """Take in the lines appended since the last read (whole lines only)."""
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        for line in data[:cut].decode().splitlines():
            what, job_id, at_text, pid_text = line.split()
            at = float(at_text)
            runs = self.runs.setdefault(job_id, [])
            if what == "start":
                if runs and runs[-1].open:
                    self.anomalies.append(f"{job_id}: start {len(runs) + 1} while start {len(runs)} still ran")
                runs.append(Run(at, int(pid_text)))
            elif not runs or runs[-1].end is not None:
                self.anomalies.append(f"{job_id}: an end with no start before it")
            else:
                runs[-1].end = at

    def open_runs(self) -> list[tuple[str, int, Run]]:
        return [(job_id, len(runs), runs[-1]) for job_id, runs in self.runs.items() if runs and runs[-1].open]


def max_overlap(runs: dict[str, list[Run]]) -> int:
    edges = []
    for job_runs in runs.values():
        for r in job_runs:
            edges += [(r.start, 1), (r.stop, -1)]
    held = peak = 0
    for _, delta in sorted(edges):  # an end at the same instant as a start comes first
        held += delta
        peak = max(peak, held)
    return peak


# -- killing a job from outside ---------------------------------------------------------------------------------


def kill_process(job_id: str, run: Run, journal: Path) -> float | None:
    """SIGKILL the job's own process (the pid its journal line gives); the moment just before, or None if it is gone.

    The pid is opened as a pidfd first and the process checked to be this job's program (its environment names the
    job, its command line the journal): a pid reused since, or a process that is not a job, is never signalled."""
    try:
        fd = os.pidfd_open(run.pid)
    except ProcessLookupError:
        return None
    try:
        try:
            environ = Path(f"/proc/{run.pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{run.pid}/cmdline").read_bytes()
        except OSError:
            return None
        if f"PODCAST_JOB_ID={job_id}".encode() not in environ or str(journal).encode() not in cmdline:
            return None
        at = time.time()
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return at
    finally:
        os.close(fd)


def kill_container(client: Any, job_id: str, attempt: int) -> float | None:
    """``docker kill`` the container of this attempt of the job, checked by its labels; None if it is not running."""
    from docker.errors import APIError, NotFound

    try:
        state = client.inspect_container(container_name(job_id, attempt))
    except (NotFound, *ENGINE_ERRORS):
        return None  # none, or the engine does not answer now (it may be restarted under us): no kill
    labels = (state.get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL_JOB) != job_id or labels.get(LABEL_ATTEMPT, "1") != str(attempt):
        return None
    if not (state.get("State") or {}).get("Running"):
        return None
    at = time.time()
    try:
        client.kill(state["Id"])  # SIGKILL to its init: the whole container ends, 128 + 9
    except (NotFound, APIError):
        return None  # it ended meanwhile
    except ENGINE_ERRORS:
        # The engine stopped answering mid-call: the kill may have landed. Counted as one: if it did not, the job
        # writes its "end" line, and a kill with an "end" line may end either way (as a kill that races an exit).
        return at
    return at


def our_containers(ids: set[str]) -> list[str] | None:
    """The containers (running or not) of this run's jobs; None while the engine does not answer (other test suites
    on this machine may restart it: the supervisor rides that out, and so does the bench)."""
    client = make_client(timeout=30)
    try:
        listed = client.containers(all=True, filters={"label": LABEL_JOB})
    except ENGINE_ERRORS:
        return None
    finally:
        client.close()
    return [c["Id"] for c in listed if (c.get("Labels") or {}).get(LABEL_JOB) in ids]


def job_processes(journal: Path) -> list[int]:
    """Processes that run a job of this run (each names the journal in its argv)."""
    needle = str(journal).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# -- the threads beside the supervisor's restarts ---------------------------------------------------------------


@dataclass
class Observer:
    """Reads the journal and samples the registry all along; kills a running job every so often while ``killing``."""

    mode: str
    journal: Journal
    registry_path: Path
    rng: random.Random
    kill_every_s: float
    retry_bias: float = 0.6  # how often a kill prefers an attempt that is itself a resubmission (to spend attempts)
    killing: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    kills: list[dict[str, Any]] = field(default_factory=list)
    missed: int = 0  # kills aimed at a job that had ended meanwhile
    peak_running_rows: int = 0
    samples: int = 0
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        registry = SqliteRegistry(self.registry_path)
        client = make_client(timeout=30) if self.mode == "docker" else None
        next_kill = time.monotonic() + self.rng.expovariate(1 / self.kill_every_s)
        try:
            while not self.stop.is_set():
                self.journal.read()
                counts = call(registry.counts)
                self.peak_running_rows = max(self.peak_running_rows, counts["running"])
                self.samples += 1
                # A kill that finds no job running waits for one (the supervisor may be booting).
                if self.killing.is_set() and time.monotonic() >= next_kill and self._kill_one(client):
                    next_kill = time.monotonic() + self.rng.expovariate(1 / self.kill_every_s)
                self.stop.wait(0.05)
        finally:
            registry.close()
            if client is not None:
                client.close()

    def _kill_one(self, client: Any) -> bool:
        """Kill one running attempt, picked at random; False when none runs."""
        candidates = self.journal.open_runs()
        if not candidates:
            return False
        retried = [c for c in candidates if c[1] > 1]
        pool = retried if retried and self.rng.random() < self.retry_bias else candidates
        job_id, attempt, run = self.rng.choice(pool)
        at = kill_process(job_id, run, self.journal.path) if client is None else kill_container(client, job_id, attempt)
        if at is None:
            self.missed += 1
            return True
        run.killed_at = at
        self.kills.append({"job_id": job_id, "attempt": attempt, "at": at})
        return True


@dataclass
class Enqueuer:
    """Enqueues jobs through ``POST /api/jobs`` while the supervisor comes and goes."""

    base_url: str
    durations: list[float]
    gap_s: float
    rng: random.Random
    acked: list[str] = field(default_factory=list)
    refused: int = 0  # no connection: nothing was sent, the same job is asked again
    lost_answers: int = 0  # sent, no answer: the job may exist (checked as a row like any other), asked again
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.base_url, timeout=10.0) as client:
                for seconds in self.durations:
                    self._one(client, seconds)
                    if self.stop.wait(self.rng.uniform(0, 2 * self.gap_s)):
                        return
            self.done.set()
        except BaseException as exc:
            self.error = exc

    def _one(self, client: httpx.Client, seconds: float) -> None:
        while not self.stop.is_set():
            try:
                answer = client.post(
                    "/api/jobs", json={"kind": KIND, "params": {"seconds": seconds}}, timeout=10.0
                )
            except httpx.ConnectError:
                self.refused += 1
            except httpx.TransportError:
                self.lost_answers += 1
            else:
                if answer.status_code == 202:
                    self.acked.append(answer.json()["job_id"])
                    return
                if answer.status_code < 500:
                    raise RuntimeError(f"enqueue refused: {answer.status_code} {answer.text}")
                self.lost_answers += 1  # a 5xx: the registry may or may not have it
            self.stop.wait(0.1)


# -- the run ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    mode: str
    jobs: int
    slots: int
    kills: int
    seed: int
    job_kill_every_s: float
    job_seconds: tuple[float, float] = (0.05, 0.5)
    lifetime_s: tuple[float, float] = (0.5, 3.0)
    min_job_kills: int = 0  # the chaos phase goes on (up to 4 x kills boots) until this many outside kills landed
    smoke: bool = False


def start_supervisor(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=fh
        )


def engine_problem(image: str) -> str | None:
    """Why Docker mode cannot run here, or None. Any build of the image will do (the jobs run its python3 alone), so
    one built from other sources than this checkout's is no problem here, unlike for the tests."""
    from docker.errors import ImageNotFound

    client = make_client(timeout=30)
    try:
        client.ping()
        client.inspect_image(image)
    except ImageNotFound:
        return f"no image {image} on the engine"
    except Exception as exc:  # the engine does not answer: whatever the SDK raised says why
        return f"the engine does not answer: {exc}"
    finally:
        client.close()
    return None


def all_rows(registry: SqliteRegistry) -> list[Job]:
    rows: list[Job] = []
    cursor = None
    while True:
        page, cursor = call(registry.list_jobs, limit=100, cursor=cursor)
        rows += page
        if cursor is None:
            return rows


def run(plan: Plan, results_dir: Path | None) -> int:
    if plan.mode == "docker":
        problem = engine_problem(Config().docker_image)  # the image `serve` uses unless told otherwise
        if problem is not None:
            print(f"chaos ({plan.mode}): no usable Docker engine: {problem} (bash scripts/docker-engine.sh up)")
            return 2
    rng = random.Random(plan.seed)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp).resolve()
        data = root / "data"
        data.mkdir()
        journal_path = data / "journal"  # under the data dir: bind-mounted into each container at the same path
        journal_path.touch(mode=0o666)
        kinds = root / "kinds.toml"
        kinds.write_text(kinds_toml(journal_path))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
        env.update(
            PODCAST_JOB_DATA_DIR=str(data),
            PODCAST_JOB_BIND=f"127.0.0.1:{port}",
            PODCAST_JOB_KINDS_FILE=str(kinds),
            PODCAST_JOB_MAX_CONCURRENT=str(plan.slots),
            PODCAST_JOB_SWEEP_SECONDS="1",
            PODCAST_PIPELINE_EXEC_MODE=plan.mode,
        )
        if plan.mode == "docker":
            env["PODCAST_JOB_DOCKER_NETWORK"] = "host"  # no job of this run calls home; this says so to the config
        registry = SqliteRegistry(data / ".viewer" / "jobs.sqlite3")
        kind = load_kinds(kinds).get(KIND)
        python = sys.executable if plan.mode == "subprocess" else "python3"

        durations = [round(rng.uniform(*plan.job_seconds), 3) for _ in range(plan.jobs)]
        direct, over_api = durations[: plan.jobs // 2], durations[plan.jobs // 2 :]
        acked: list[str] = []
        for seconds in direct:
            params = kind.validate_params({"seconds": seconds})
            argv = kind.render_argv(params, python=python)
            enqueued, _ = call(registry.enqueue, NewJob(KIND, params, argv, max_attempts=kind.max_attempts))
            acked.append(enqueued.job.job_id)
        lifetimes = [rng.uniform(*plan.lifetime_s) for _ in range(plan.kills)]
        chaos_s = sum(lifetimes)
        journal = Journal(journal_path)
        observer = Observer(
            plan.mode, journal, data / ".viewer" / "jobs.sqlite3", random.Random(rng.random()), plan.job_kill_every_s
        )
        enqueuer = Enqueuer(
            f"http://127.0.0.1:{port}", over_api, 0.8 * chaos_s / max(1, len(over_api)), random.Random(rng.random())
        )
        threads = [threading.Thread(target=observer.run), threading.Thread(target=enqueuer.run)]
        log = root / "supervisor.log"
        idle_kills = 0  # supervisor kills that found no job queued or running (the run's work ended before its kills)
        started = time.monotonic()
        observer.killing.set()
        for thread in threads:
            thread.start()
        try:
            extra = random.Random(rng.random())
            for boot in itertools.count():
                if boot >= len(lifetimes):
                    # Past --kills: more boots only while fewer outside kills than the plan's minimum landed (bounded).
                    if len(observer.kills) >= plan.min_job_kills or boot >= 4 * plan.kills:
                        break
                    lifetimes.append(extra.uniform(*plan.lifetime_s))
                lifetime = lifetimes[boot]
                proc = start_supervisor(env, log)
                time.sleep(lifetime)
                if proc.poll() is not None:
                    print(f"the supervisor exited by itself ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
                    return 2
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                counts = call(registry.counts)
                if counts["queued"] + counts["running"] == 0 and enqueuer.done.is_set():
                    idle_kills += 1
                if observer.error or enqueuer.error:
                    raise RuntimeError("a bench thread failed") from observer.error or enqueuer.error
            observer.killing.clear()
            chaos_elapsed = time.monotonic() - started
            last = start_supervisor(env, log)
            try:
                drained = drain(plan, registry, enqueuer, observer, last, data)
                api_mismatches = compare_with_api(f"http://127.0.0.1:{port}", all_rows(registry)) if drained else []
            finally:
                last.send_signal(signal.SIGTERM)
                last.wait(timeout=60)
        finally:
            enqueuer.stop.set()
            observer.killing.clear()
            observer.stop.set()
            for thread in threads:
                thread.join(timeout=60)
        elapsed = time.monotonic() - started
        if not drained:
            print(f"chaos ({plan.mode}): not drained in {DRAIN_LIMIT_S:.0f} s; see {log}:\n{log.read_text()[-3000:]}")
            return 1
        for error in (observer.error, enqueuer.error):
            if error is not None:
                raise RuntimeError("a bench thread failed") from error
        acked += enqueuer.acked
        rows = all_rows(registry)
        registry.close()
        # A job wrongly judged never started, or adopted twice, would still run now: read the journal once all are gone.
        left: list[str] = []
        deadline = time.monotonic() + GONE_LIMIT_S
        while time.monotonic() < deadline:
            left = [str(p) for p in job_processes(journal_path)]
            if plan.mode == "docker":
                containers = our_containers({r.job_id for r in rows})
                left += ["(the engine does not answer)"] if containers is None else containers
            if not left:
                break
            time.sleep(0.5)
        journal.read()
        records = state_records_left(env) if plan.mode == "subprocess" else []
        run_dirs = load_config(env)[0].run_dirs()
        if run_dirs is not None:  # outside the temp dir (tmpfs): no later boot of this data dir will sweep it
            shutil.rmtree(run_dirs[0], ignore_errors=True)
        report = judge(plan, rows, acked, journal, observer, enqueuer, left, api_mismatches)
        report.update(
            state_records_left=len(records),
            elapsed_s=round(elapsed, 1),
            chaos_phase_s=round(chaos_elapsed, 1),
            supervisor_kills=len(lifetimes),
            supervisor_kills_with_no_work_left=idle_kills,
        )
        return finish(plan, report, results_dir)


def state_records_left(env: dict[str, str]) -> list[Path]:
    """Subprocess mode: the shepherds' ``<id>.pid`` / ``<id>.exit`` records still in the run directory (tmpfs) once
    every row is final and the last boot has stopped: each is dropped once its row is final (those written next to
    the logs when a supervisor went away stay there with the logs, by design)."""
    run_dirs = load_config(env)[0].run_dirs()
    if run_dirs is None or not run_dirs[0].is_dir():
        return []
    return [p for p in run_dirs[0].iterdir() if p.suffix in (".pid", ".exit")]


def drain(
    plan: Plan,
    registry: SqliteRegistry,
    enqueuer: Enqueuer,
    observer: Observer,
    last: subprocess.Popen[bytes],
    data: Path,
) -> bool:
    """Until every job is enqueued and every row terminal (and, in Docker mode, every container of the run removed)."""
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        if last.poll() is not None:
            return False
        if observer.error or enqueuer.error:
            return False
        counts = call(registry.counts)
        if enqueuer.done.is_set() and counts["queued"] == 0 and counts["running"] == 0:
            break
        time.sleep(0.2)
    else:
        return False
    if plan.mode == "docker":
        # Each container is removed just after its row is final: wait for the last few removals (one left for good
        # is reported by the "nothing stuck" check).
        settle = time.monotonic() + GONE_LIMIT_S
        ids = {r.job_id for r in all_rows(registry)}
        while time.monotonic() < settle and our_containers(ids) != []:
            time.sleep(0.2)
    return True


def compare_with_api(base_url: str, rows: list[Job]) -> list[str]:
    """Every row as the last boot's API shows it: the same status, reason, exit code, attempts and history."""
    mismatches = []
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        for row in rows:
            shown = client.get(f"/api/jobs/{row.job_id}", timeout=30.0)
            shown.raise_for_status()
            body = shown.json()
            want = row.public()
            for key in ("status", "error_reason", "exit_code", "attempts", "max_attempts", "history"):
                if body.get(key) != want.get(key):
                    mismatches.append(f"{row.job_id}: API {key}={body.get(key)!r}, registry {want.get(key)!r}")
    return mismatches


def judge(
    plan: Plan,
    rows: list[Job],
    acked: list[str],
    journal: Journal,
    observer: Observer,
    enqueuer: Enqueuer,
    left: list[str],
    api_mismatches: list[str],
) -> dict[str, Any]:
    """Every row against what its job really did: the journal's starts and ends, and the bench's kills."""
    kill_reason, kill_code = KILLED[plan.mode]
    by_id = {r.job_id: r for r in rows}
    lost = [job_id for job_id in acked if job_id not in by_id]
    not_terminal = [r.job_id for r in rows if not r.status.is_terminal]
    unknown_runs = [job_id for job_id in journal.runs if job_id not in by_id]
    twice: list[str] = list(journal.anomalies)  # a start while the previous one ran; an end with no start
    wrong: list[str] = []  # an outcome or a history entry that is not what the job did
    raced = 0  # attempts the bench killed just as they exited (an "end" line and a kill): either outcome is true
    for row in rows:
        runs = journal.runs.get(row.job_id, [])
        if row.attempts != len(runs):
            twice.append(f"{row.job_id}: attempts {row.attempts}, journal starts {len(runs)}")
            continue
        if [h.attempt for h in row.history] != list(range(1, len(runs))) and row.status.is_terminal:
            twice.append(f"{row.job_id}: history {[h.attempt for h in row.history]} for {len(runs)} starts")
            continue
        if row.max_attempts != MAX_ATTEMPTS:
            wrong.append(f"{row.job_id}: max_attempts {row.max_attempts}")
        for earlier, later in itertools.pairwise(runs):
            if earlier.open or later.start < earlier.stop:
                twice.append(f"{row.job_id}: an attempt started at {later.start:.6f} before the one before ended")
        raced += sum(1 for r in runs if r.end is not None and r.killed_at is not None)
        for entry, r in zip(row.history, runs, strict=False):
            # ADR 0009 §2: an attempt is resubmitted only after a crash; here, the bench's kill.
            if r.killed_at is None or (entry.status.value, entry.reason, entry.exit_code) != (
                "failed",
                kill_reason,
                kill_code,
            ):
                wrong.append(
                    f"{row.job_id}: attempt {entry.attempt} recorded {entry.status}/{entry.reason}/{entry.exit_code}, "
                    f"the job {'was killed' if r.killed_at is not None else 'was not killed'}"
                    f"{' and exited 0' if r.end is not None else ''}"
                )
        if not runs:
            wrong.append(f"{row.job_id}: ended {row.status}/{row.error_reason} and never ran")
            continue
        last = runs[-1]
        got = (str(row.status), row.error_reason, row.exit_code)
        allowed = []
        if last.end is not None:
            allowed.append(("succeeded", None, 0))
        if last.killed_at is not None and row.attempts >= MAX_ATTEMPTS:
            allowed.append(("failed", kill_reason, kill_code))
        if got not in allowed:
            what = "exited 0" if last.end is not None else "was killed" if last.killed_at is not None else "vanished"
            wrong.append(f"{row.job_id}: attempt {row.attempts} of {MAX_ATTEMPTS} {what}, recorded {got}")
    killed_runs = [r for runs in journal.runs.values() for r in runs if r.killed_at is not None]
    peak = max_overlap(journal.runs)
    outcomes = collections.Counter((str(r.status), r.error_reason) for r in rows)
    resubmits = sum(len(r.history) for r in rows)
    checks = {
        f"every acknowledged job has a row ({len(acked)} acknowledged, {len(rows)} rows)": not lost,
        "every row is terminal, and the last boot's API agrees with the registry": not not_terminal
        and not api_mismatches,
        "every job that ran has a row": not unknown_runs,
        "no job ran twice except as a recorded resubmit (attempts = journal starts, history = earlier ones)": not twice,
        "every outcome is what the job did (a kill as that kill, exit 0 as succeeded)": not wrong,
        f"never more than {plan.slots} at once (journal peak {peak}, registry peak {observer.peak_running_rows})": peak
        <= plan.slots
        and observer.peak_running_rows <= plan.slots,
        "nothing stuck: no job process or container of the run left": not left,
    }
    violations = lost + not_terminal + api_mismatches + unknown_runs + twice + wrong + left
    return {
        "rows": len(rows),
        "acknowledged": len(acked),
        "enqueued_over_api": len(enqueuer.acked),
        "api_requests_refused": enqueuer.refused,
        "api_answers_lost": enqueuer.lost_answers,
        "outside_job_kills": len(killed_runs),
        "outside_kills_missed": observer.missed,
        "outside_kills_raced_exit": raced,
        "resubmits": resubmits,
        "jobs_resubmitted": sum(1 for r in rows if r.history),
        "jobs_out_of_attempts": sum(1 for r in rows if r.error_reason == kill_reason),
        "starts": sum(len(runs) for runs in journal.runs.values()),
        "peak_concurrency_journal": peak,
        "peak_running_rows": observer.peak_running_rows,
        "registry_samples": observer.samples,
        "outcomes": [
            {"status": status, "reason": reason, "count": n}
            for (status, reason), n in sorted(outcomes.items(), key=lambda kv: -kv[1])
        ],
        "checks": [{"name": name, "verdict": "PASS" if ok else "FAIL"} for name, ok in checks.items()],
        "verdict": "PASS" if all(checks.values()) else "FAIL",
        "violations": violations[:50],
    }


def finish(plan: Plan, report: dict[str, Any], results_dir: Path | None) -> int:
    print(
        f"chaos ({plan.mode} mode): {report['rows']} jobs, {plan.slots} slots, supervisor SIGKILLed "
        f"{report['supervisor_kills']} times, jobs SIGKILLed from outside {report['outside_job_kills']} times, "
        f"{report['resubmits']} resubmits, {report['elapsed_s']:.1f} s, seed {plan.seed}"
    )
    figures = ("acknowledged", "api_answers_lost", "outside_kills_missed", "outside_kills_raced_exit")
    figures += ("jobs_resubmitted", "jobs_out_of_attempts", "starts", "supervisor_kills_with_no_work_left")
    figures += ("state_records_left",)
    print("  " + ", ".join(f"{name} {report[name]}" for name in figures))
    for o in report["outcomes"]:
        print(f"  {o['count']:5d}  {o['status']}{'/' + o['reason'] if o['reason'] else ''}")
    for c in report["checks"]:
        print(f"  {c['verdict']}  {c['name']}")
    for v in report["violations"][:20]:
        print(f"    violation: {v}")
    if results_dir is not None:
        data = run_header("chaos", label=None, smoke=plan.smoke)
        data.update(machine=machine(), versions=versions(), revision=git_revision())
        data.update(
            mode=plan.mode,
            args={
                "mode": plan.mode,
                "jobs": plan.jobs,
                "slots": plan.slots,
                "kills": plan.kills,
                "seed": plan.seed,
                "job_kill_every_s": plan.job_kill_every_s,
                "job_seconds": list(plan.job_seconds),
                "supervisor_lifetime_s": list(plan.lifetime_s),
                "max_attempts": MAX_ATTEMPTS,
            },
            command=reproduce(plan),
            **report,
        )
        path = results_dir / results_name(f"{plan.mode}-chaos")
        write_json(path, data)
        print(f"  results: {path}")
    return 0 if report["verdict"] == "PASS" else 1


def reproduce(plan: Plan) -> str:
    if plan.smoke:
        return f".venv/bin/python bench/chaos.py --smoke --mode {plan.mode} --seed {plan.seed}"
    return (
        f".venv/bin/python bench/chaos.py --mode {plan.mode} --jobs {plan.jobs} --slots {plan.slots} "
        f"--kills {plan.kills} --seed {plan.seed} --job-kill-every-s {plan.job_kill_every_s:g}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--kills", type=int, default=200, help="supervisor SIGKILLs")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--job-kill-every-s", type=float, default=1.0, help="mean interval of outside job kills")
    parser.add_argument("--smoke", action="store_true", help="a few jobs and kills: that the script still works")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="where the results JSON goes (default bench/results; --smoke: none)",
    )
    parser.add_argument("--no-write", action="store_true", help="write no results file")
    args = parser.parse_args()
    results_dir = None if args.no_write else args.results_dir or (None if args.smoke else REPO / "bench" / "results")
    status = 0
    for mode in MODES if args.mode == "both" else (args.mode,):
        if args.smoke:
            plan = Plan(mode, 16, 3, 4, args.seed, job_kill_every_s=0.3, min_job_kills=3, smoke=True)
        else:
            plan = Plan(mode, args.jobs, args.slots, args.kills, args.seed, args.job_kill_every_s)
        status = max(status, run(plan, results_dir))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
