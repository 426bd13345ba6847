"""Chaos run: an operator's worst day. The supervisor is SIGKILLed and restarted again and again while jobs are
SIGKILLed from outside at random, in subprocess and in Docker mode, with resubmission on.

Usage: make chaos   (or .venv/bin/python tests/longrun/chaos.py [--mode subprocess|docker|both] [--jobs 1000]
                     [--kills 200] [--slots 3] [--seed 25] [--job-kill-every-s 1.0] [--smoke]
                     [--hosts N [--database-url postgresql://...] [--keep-logs]] [--results-dir DIR] [--no-write])

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
- nothing made twice: every ``POST /api/jobs`` carries its job's own ``Idempotency-Key``, the client throws away
  ``--lose-answers`` of the answers that do come back (the lossy client: a network that loses them) and asks again,
  to the next host, with the key; there are exactly as many rows as acknowledged jobs (ADR 0016: before keys, a
  retried request whose first answer was lost made a second row, 1,001 rows for 1,000 jobs);
- nothing runs twice except as a recorded resubmit: each row's ``attempts`` is the number of its journal starts, its
  ``history`` holds one entry per earlier attempt, and no attempt starts before the previous one ended;
- every outcome is what the job really did: an attempt the bench killed is recorded as that kill
  (``failed/killed_by_SIGKILL``; Docker: ``failed/exit_code_137``) and resubmitted while attempts remain; a job
  whose last attempt exited 0 is ``succeeded``; no other reason appears;
- never more than ``--slots`` jobs at once: the journal's intervals (a killed attempt ends when the bench signalled
  it) and the registry's ``running`` count, sampled throughout;
- nothing stuck: the last boot drains everything; no job process (or container) of the run is left.

With ``--hosts N`` (N >= 2; subprocess mode; ADR 0012) it is a fleet: N supervisors on a fresh schema of
one PostgreSQL server (``--database-url``, default ``$PODCAST_JOB_TEST_DATABASE_URL``; the schema is dropped after),
each with its own data dir, port and ``PODCAST_JOB_HOST_ID`` (h1, h2, ...), a 3 s host lease and the fleet-wide
``--slots``. Each lives 0.5-3 s, is SIGKILLed, stays down 0.2-5 s (past its lease at times: its running jobs keep their
slots, the lead passes on) and is started again with the same host id and data dir, ``--kills`` times in all; the
API enqueues go to each host in turn (on to the next when one refuses). The journal lines name the host that ran
each attempt. On top of the checks above:

- never two leaders: every host's ``/api/health`` is asked at once every 0.1 s; two boots saying they lead within
  20 % of the lease of each other (the gap ADR 0012 §3 leaves between two leads) fail it, and so does a new holder
  of the leader table whose lead began before the previous holder's lease (as last sampled) ran out;
- no host ends what it did not run: every row's ``host_id`` is the host of its last journal start, and every end of
  an attempt in a host's log (a ``job_transition`` out of ``running``) names the process it ended (its ``pid``: a
  resubmission's line too), a process that ran on that host, or one the leader ended from the proof of its end
  (``silent_host_job_ended`` for that job, naming the host it ran on: INV-SILENT-HOST-ENDS-BY-PROOF); a line that
  names no process ended a start that never happened, and is counted apart;
- every host's API (each host's last boot, once it serves) says what the registry says of every row.

Exit status 1 when any check fails, 2 when the run could not be made (the supervisor exited by itself, no engine).
The results (parameters, figures, outcomes, each check's verdict and the first violations) go to
``bench/results/<UTC date>-<mode>[-<N>hosts]-chaos.json`` (``--results-dir``; ``--smoke`` writes only where
``--results-dir`` says; ``--no-write`` nowhere); docs/reliability.md reports them.

The seed fixes the jobs' durations, the supervisor's lifetimes, the moments of the outside kills and the enqueues;
which job a kill hits depends on what runs at that moment, so two runs with one seed differ in detail.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import itertools
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import httpx
import outcome
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import git_revision, machine, versions  # noqa: E402
from results import results_name, run_header, write_json  # noqa: E402

from supervisor import Config, Job, RegistryUnavailable, SqliteRegistry, load_config, load_kinds  # noqa: E402
from supervisor.domain import PageRequest  # noqa: E402
from supervisor.execution.docker import (  # noqa: E402
    ENGINE_ERRORS,
    LABEL_ATTEMPT,
    LABEL_JOB,
    container_name,
    make_client,
)
from supervisor.registry import Host, NewJob, PostgresRegistry  # noqa: E402

MODES = ("subprocess", "docker")
KIND = "work"
# A kind with max_running = 1 (INV-KIND-LIMIT-IS-A-COUNT), every fourth job: never two of them at once, across kills.
SOLO = "solo"


def kind_of(n: int) -> str:
    return SOLO if n % 4 == 0 else KIND

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
    host = os.environ.get("PODCAST_JOB_HOST_ID") or "-"
    line = "%s %s %.6f %d %s\n" % (what, os.environ["PODCAST_JOB_ID"], time.time(), os.getpid(), host)
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
    return "".join(
        f'[kinds.{name}]\nargv = {json.dumps(argv)}\nparams = {{ seconds = "float" }}\n'
        f"max_attempts = {MAX_ATTEMPTS}\nretry_backoff_seconds = 0.2\nretry_backoff_max_seconds = 1.0\n"
        f"retry_on_exit_codes = [137]\n{extra}"
        for name, extra in ((KIND, ""), (SOLO, "max_running = 1\n"))
    )


def call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A registry call from this blocking script: each in a Trio run of its own."""
    return trio.run(functools.partial(method, *args, **kwargs))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the registry, read and written from this blocking script ----------------------------------------------------


class SqliteStore:
    """The one host's SQLite registry: each call in a Trio run of its own (open it in the thread that uses it)."""

    def __init__(self, path: Path) -> None:
        self.registry = SqliteRegistry(path)

    def counts(self) -> dict[str, int]:
        return dict(call(self.registry.counts))

    def leader(self) -> Host | None:
        return None  # one host, no fleet: nobody leads

    def list_jobs(self, limit: int, cursor: str | None) -> tuple[list[Job], str | None]:
        page, after = call(self.registry.list_jobs, PageRequest.parse(limit=limit, cursor=cursor))
        return list(page), after

    def enqueue(self, new: NewJob) -> str:
        enqueued = call(self.registry.enqueue, new)
        return str(enqueued.job.job_id)

    def close(self) -> None:
        self.registry.close()


# A registry call handed to the registry's own loop, and where its outcome goes.
Request = tuple[Callable[[], Any], "queue.Queue[outcome.Outcome[Any]]"]


class PostgresStore:
    """The fleet's PostgreSQL registry, open for the whole run on a Trio loop of its own (a thread, with
    trio-asyncio's loop around it, as ``supervisor serve`` runs it). Its calls are blocking and thread-safe: each is
    handed to a task that runs under that loop (a task ``trio.from_thread.run`` starts would run outside it)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._requests: trio.MemorySendChannel[Request] | None = None
        self.unavailable = 0  # calls the registry could not answer at first (asked again)
        self._thread = threading.Thread(target=self._run, args=(dsn, schema), name="registry", daemon=True)
        self._thread.start()
        if not self._ready.wait(60) or self._token is None:
            raise RuntimeError(f"cannot open the PostgreSQL registry (schema {schema})") from self._error

    def _run(self, dsn: str, schema: str) -> None:
        try:
            trio.run(self._main, dsn, schema)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self, dsn: str, schema: str) -> None:
        async with PostgresRegistry.runtime():
            registry = await PostgresRegistry.open(dsn, schema=schema, outbox=False, max_connections=4)
            try:
                send, receive = trio.open_memory_channel[Request](0)
                self._requests = send
                self._token = trio.lowlevel.current_trio_token()
                self.registry = registry
                self._ready.set()
                async with receive:
                    async for work, reply in receive:
                        # One call at a time; each bounded inside the registry (its database timeout, 10 s).
                        reply.put(await outcome.acapture(work))
            finally:
                with trio.CancelScope(shield=True):
                    await registry.aclose()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The call, asked again (a few times) while the registry is unavailable: a session the server ended (other
        test runs on a shared server end every supervisor session of the database) is found by the call that uses
        it, and replaced. Every time it happened is counted."""
        assert self._requests is not None and self._token is not None
        method = getattr(self.registry, name)
        for attempt in itertools.count(1):
            reply: queue.Queue[outcome.Outcome[Any]] = queue.Queue()
            work = functools.partial(method, *args, **kwargs)
            trio.from_thread.run(self._requests.send, (work, reply), trio_token=self._token)
            try:
                return reply.get(timeout=120).unwrap()
            except RegistryUnavailable:
                self.unavailable += 1
                if attempt >= 5:
                    raise
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable")

    def counts(self) -> dict[str, int]:
        return dict(self._call("counts"))

    def leader(self) -> Host | None:
        found: Host | None = self._call("leader")
        return found

    def list_jobs(self, limit: int, cursor: str | None) -> tuple[list[Job], str | None]:
        page, after = self._call("list_jobs", PageRequest.parse(limit=limit, cursor=cursor))
        return list(page), after

    def enqueue(self, new: NewJob) -> str:
        enqueued = self._call("enqueue", new)
        return str(enqueued.job.job_id)

    def close(self) -> None:
        """Closes the registry (once every call handed in has been answered)."""
        if self._requests is not None and self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run(self._requests.aclose, trio_token=self._token)
        self._thread.join(timeout=60)


class Shared:
    """One store used by several threads: each closes nothing, the run closes it once."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    def leader(self) -> Host | None:
        return self.store.leader()

    def close(self) -> None:
        pass


def postgres_sql(dsn: str, query: str) -> None:
    """One statement on a connection of its own (the schema made for a run, and dropped after)."""

    async def run() -> None:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            await conn.execute(query, timeout=30)
        finally:
            await conn.close(timeout=10)

    asyncio.run(run())


def with_schema(dsn: str, schema: str) -> str:
    """The URL a supervisor of the fleet is given: the run's schema as its ``search_path``."""
    return f"{dsn}{'&' if '?' in dsn else '?'}search_path={schema}"


# -- the journal: what the jobs themselves say ran --------------------------------------------------------------


@dataclass
class Run:
    """One start of a job's program: its journal lines, and the bench's kill of it if any."""

    start: float
    pid: int
    host: str = "-"  # the PODCAST_JOB_HOST_ID its supervisor ran with ("-": none, one host)
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
            what, job_id, at_text, pid_text, host = line.split()
            at = float(at_text)
            runs = self.runs.setdefault(job_id, [])
            if what == "start":
                if runs and runs[-1].open:
                    self.anomalies.append(f"{job_id}: start {len(runs) + 1} while start {len(runs)} still ran")
                runs.append(Run(at, int(pid_text), host))
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


class Sampler(Protocol):
    """What the observer reads of the registry: the counts, and who leads the fleet (None: nobody, or no fleet)."""

    def counts(self) -> dict[str, int]: ...

    def leader(self) -> Host | None: ...

    def close(self) -> None: ...


@dataclass
class Observer:
    """Reads the journal and samples the registry all along; kills a running job every so often while ``killing``.

    ``open_sampler`` is called in the observer's own thread (a SQLite registry is used in the thread that made it).
    In a fleet it also samples the leader table: each change of holder (host and boot) is kept with the lease the
    previous holder was last seen to hold."""

    mode: str
    journal: Journal
    open_sampler: Callable[[], Sampler]
    rng: random.Random
    kill_every_s: float
    retry_bias: float = 0.6  # how often a kill prefers an attempt that is itself a resubmission (to spend attempts)
    killing: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    kills: list[dict[str, Any]] = field(default_factory=list)
    missed: int = 0  # kills aimed at a job that had ended meanwhile
    peak_running_rows: int = 0
    samples: int = 0
    leaders: list[Host] = field(default_factory=list)  # the leader table's holders in order, as last seen each
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        sampler = self.open_sampler()
        client = make_client(timeout=30) if self.mode == "docker" else None
        next_kill = time.monotonic() + self.rng.expovariate(1 / self.kill_every_s)
        try:
            while not self.stop.is_set():
                self.journal.read()
                counts = sampler.counts()
                self.peak_running_rows = max(self.peak_running_rows, counts["running"])
                self.samples += 1
                self._note_leader(sampler.leader())
                # A kill that finds no job running waits for one (the supervisor may be booting).
                if self.killing.is_set() and time.monotonic() >= next_kill and self._kill_one(client):
                    next_kill = time.monotonic() + self.rng.expovariate(1 / self.kill_every_s)
                self.stop.wait(0.05)
        finally:
            sampler.close()
            if client is not None:
                client.close()

    def _note_leader(self, leader: Host | None) -> None:
        if leader is None:
            return
        if self.leaders and (self.leaders[-1].host_id, self.leaders[-1].boot_id) == (leader.host_id, leader.boot_id):
            self.leaders[-1] = leader  # the same holder, renewed: keep its latest lease
        else:
            self.leaders.append(leader)

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
    """Enqueues jobs through ``POST /api/jobs`` while the supervisors come and go: through each host in turn, and on
    to the next one when a host refuses the connection or loses the answer."""

    urls: list[str]
    durations: list[float]
    gap_s: float
    rng: random.Random
    # The lossy client (ADR 0016): this share of the answers that do come back is thrown away, as a network that
    # loses them would, and the request sent again with its Idempotency-Key (every request carries one).
    lose_answers: float = 0.0
    acked: list[str] = field(default_factory=list)
    acked_by: collections.Counter[str] = field(default_factory=collections.Counter)  # per host URL
    refused: int = 0  # no connection: nothing was sent, the same job is asked again (of the next host)
    lost_answers: int = 0  # sent, no answer: the job may exist (checked as a row like any other), asked again
    dropped_answers: int = 0  # answers that came back and the lossy client threw away: asked again with the key
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    _next: int = 0

    def run(self) -> None:
        try:
            with httpx.Client(timeout=10.0) as client:
                for n, seconds in enumerate(self.durations):
                    self._one(client, seconds, f"chaos-{n}", kind_of(n))
                    if self.stop.wait(self.rng.uniform(0, 2 * self.gap_s)):
                        return
            self.done.set()
        except BaseException as exc:
            self.error = exc

    def _one(self, client: httpx.Client, seconds: float, key: str, kind: str) -> None:
        while not self.stop.is_set():
            url = self.urls[self._next % len(self.urls)]
            self._next += 1  # round-robin; a refused or lost request goes on to the next host
            try:
                answer = client.post(
                    f"{url}/api/jobs",
                    json={"kind": kind, "params": {"seconds": seconds}},
                    headers={"Idempotency-Key": key},
                    timeout=10.0,
                )
            except httpx.ConnectError:
                self.refused += 1
            except httpx.TransportError:
                self.lost_answers += 1
            else:
                if answer.status_code == 202 and self.rng.random() < self.lose_answers:
                    self.dropped_answers += 1  # as if the network lost it: the same request again, same key
                elif answer.status_code == 202:
                    self.acked.append(answer.json()["job_id"])
                    self.acked_by[url] += 1
                    return
                elif answer.status_code < 500:
                    raise RuntimeError(f"enqueue refused: {answer.status_code} {answer.text}")
                else:
                    self.lost_answers += 1  # a 5xx: the registry may or may not have it
            if len(self.urls) == 1 or self._next % len(self.urls) == 0:
                self.stop.wait(0.1)  # every host asked once: a pause before the next round


@dataclass(frozen=True)
class Claim:
    """A host's own word, in ``/api/health``, that it leads: true at some instant between ``sent`` and ``answered``
    (monotonic seconds of this script)."""

    host_id: str
    boot_id: str
    sent: float
    answered: float


@dataclass
class LeaderWatch:
    """Asks every host's ``/api/health`` at once, round after round, and keeps each "I lead" answer."""

    urls: dict[str, str]  # host id -> base URL
    every_s: float = 0.1
    claims: list[Claim] = field(default_factory=list)
    rounds: int = 0
    answers: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as exc:
            self.error = exc

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:
            while not self.stop.is_set():
                async with trio.open_nursery() as nursery:
                    for host_id, url in self.urls.items():
                        nursery.start_soon(self._ask, client, host_id, url)
                self.rounds += 1
                await trio.sleep(self.every_s)

    async def _ask(self, client: httpx.AsyncClient, host_id: str, url: str) -> None:
        sent = time.monotonic()
        try:
            answer = await client.get(f"{url}/api/health", timeout=2.0)
        except httpx.TransportError:
            return  # down, booting, or just killed: no word from it
        answered = time.monotonic()
        if answer.status_code != 200:
            return
        body = answer.json()
        if body.get("host_id") != host_id:
            raise RuntimeError(f"{url} answered as host {body.get('host_id')!r}, not {host_id!r}")
        self.answers += 1
        if body.get("leader"):
            self.claims.append(Claim(host_id, str(body["boot_id"]), sent, answered))


def overlapping_claims(
    claims: list[Claim], window_s: float, successions: frozenset[tuple[str, str]] = frozenset()
) -> list[str]:
    """Two different boots each saying "I lead" within ``window_s`` of each other (from the first's request to the
    second's answer). ADR 0012 §3: a leader stops saying so by its last renewal's request + 80 % of the lease; the
    next takes the lead only once the database lease, counted from a later commit, has expired, and says so only
    after that renewal: at least 20 % of the lease lies between the last word of one and the first of the next.
    ``successions``: (dead boot, new boot) pairs of one host, the new one's data dir lock proving the dead one gone
    (ADR 0012 §9, its ``host_restarted`` line): the new boot may lead at once, the old one's last word being before
    its death."""
    found = []
    ordered = sorted(claims, key=lambda c: c.sent)
    for i, first in enumerate(ordered):
        for other in ordered[i + 1 :]:
            if other.sent - first.sent >= window_s:
                break
            span = max(first.answered, other.answered) - first.sent
            succeeded = (first.boot_id, other.boot_id) in successions and first.host_id == other.host_id
            if (other.host_id, other.boot_id) != (first.host_id, first.boot_id) and span < window_s and not succeeded:
                found.append(
                    f"two leaders within {span:.3f} s: {first.host_id} (boot {first.boot_id[:8]}) and "
                    f"{other.host_id} (boot {other.boot_id[:8]})"
                )
    return found


def leader_handovers(leaders: list[Host], successions: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """Each new holder of the leader table took it no earlier than the previous holder's lease (as last seen) ran
    out: the registry's side of INV-ONE-LEADER. But a boot that succeeds the previous holder, a boot of its own host
    proved gone (``successions``, ADR 0012 §9), takes it at once."""
    found = []
    for before, after in itertools.pairwise(leaders):
        succeeded = before.host_id == after.host_id and (before.boot_id, after.boot_id) in successions
        if after.started_at < before.lease_expires_at and not succeeded:
            found.append(
                f"{after.host_id} (boot {after.boot_id[:8]}) led from {after.started_at.isoformat()} while "
                f"{before.host_id} (boot {before.boot_id[:8]}) held it until {before.lease_expires_at.isoformat()}"
            )
    return found


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
    lifetime_s: tuple[float, float] = (0.5, 3.0)  # a supervisor's life between its start and its SIGKILL
    min_job_kills: int = 0  # the chaos phase goes on (up to 4 x kills boots) until this many outside kills landed
    smoke: bool = False
    hosts: int = 1  # more than one: a fleet on one PostgreSQL schema (subprocess mode)
    database_url: str | None = None  # the PostgreSQL server a fleet's schema is made on
    lease_s: float = 3.0  # a fleet host's lease (PODCAST_JOB_HOST_LEASE_SECONDS): short, so that leads change hands
    down_s: tuple[float, float] = (0.2, 5.0)  # a killed host's time down before its restart: past its lease at times
    keep_logs: bool = False  # keep every boot's log (a failed run keeps them anyway)
    lose_answers: float = 0.1  # the lossy client: the share of 202 answers it throws away and asks again for


def start_supervisor(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=fh
        )


SERVING_LIMIT_S = 120.0  # a boot's start on a loaded machine: seconds, never this


def wait_serving(proc: subprocess.Popen[bytes], url: str) -> str | None:
    """Until the boot answers ``/api/health`` (it serves: its startup is done); None then, else why not."""
    deadline = time.monotonic() + SERVING_LIMIT_S
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"it exited ({proc.returncode}) before it served"
            try:
                if client.get(f"{url}/api/health", timeout=5.0).status_code == 200:
                    return None
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    return f"it did not answer {url}/api/health within {SERVING_LIMIT_S:.0f} s"


def keep_logs(logs: list[Path]) -> Path:
    """Copies of the logs, out of the run's temp dir (removed at its end): a failure's evidence stays."""
    kept = Path(tempfile.mkdtemp(prefix="chaos-logs-"))
    for log in logs:
        if log.exists():
            shutil.copy2(log, kept / log.name)
    return kept


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


class Store(Protocol):
    def counts(self) -> dict[str, int]: ...

    def list_jobs(self, limit: int, cursor: str | None) -> tuple[list[Job], str | None]: ...

    def enqueue(self, new: NewJob) -> str: ...


def all_rows(store: Store) -> list[Job]:
    rows: list[Job] = []
    cursor = None
    while True:
        page, cursor = store.list_jobs(limit=100, cursor=cursor)
        rows += page
        if cursor is None:
            return rows


def enqueue_direct(store: Store, kinds: Path, durations: list[float], python: str) -> list[str]:
    """Jobs written straight into the registry before the first boot, as a CLI in another process would."""
    catalog = load_kinds(kinds)
    acked = []
    for n, seconds in enumerate(durations):
        kind = catalog.get(kind_of(n + 1))  # odd places: the API's enqueuer takes the others' turn
        params = kind.validate_params({"seconds": seconds})
        argv = kind.render_argv(params, python=python)
        acked.append(store.enqueue(NewJob(kind.name, params, argv, max_attempts=kind.max_attempts)))
    return acked


def jobs_left(journal_path: Path, mode: str, rows: list[Job]) -> list[str]:
    """A job wrongly judged never started, or adopted twice, would still run now: what is left of the run's jobs
    (processes, containers) once every row is final, after a bounded wait for the last few to go."""
    left: list[str] = []
    deadline = time.monotonic() + GONE_LIMIT_S
    while time.monotonic() < deadline:
        left = [str(p) for p in job_processes(journal_path)]
        if mode == "docker":
            containers = our_containers({r.job_id for r in rows})
            left += ["(the engine does not answer)"] if containers is None else containers
        if not left:
            break
        time.sleep(0.5)
    return left


def run(plan: Plan, results_dir: Path | None) -> int:
    if plan.hosts > 1:
        return run_fleet(plan, results_dir)
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
        url = f"http://127.0.0.1:{port}"
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
        registry_path = data / ".viewer" / "jobs.sqlite3"
        store = SqliteStore(registry_path)
        python = sys.executable if plan.mode == "subprocess" else "python3"

        durations = [round(rng.uniform(*plan.job_seconds), 3) for _ in range(plan.jobs)]
        direct, over_api = durations[: plan.jobs // 2], durations[plan.jobs // 2 :]
        acked = enqueue_direct(store, kinds, direct, python)
        lifetimes = [rng.uniform(*plan.lifetime_s) for _ in range(plan.kills)]
        chaos_s = sum(lifetimes)
        journal = Journal(journal_path)
        observer = Observer(
            plan.mode,
            journal,
            functools.partial(SqliteStore, registry_path),
            random.Random(rng.random()),
            plan.job_kill_every_s,
        )
        enqueuer = Enqueuer(
            [url], over_api, 0.8 * chaos_s / max(1, len(over_api)), random.Random(rng.random()), plan.lose_answers
        )
        threads = [threading.Thread(target=observer.run), threading.Thread(target=enqueuer.run)]
        log = root / "supervisor.log"
        last_log = root / "supervisor-last-boot.log"
        idle_kills = 0  # supervisor kills that found no job queued or running (the run's work ended before its kills)
        started = time.monotonic()
        observer.killing.set()
        for thread in threads:
            thread.start()
        api_mismatches: list[str] = []
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
                counts = store.counts()
                if counts["queued"] + counts["running"] == 0 and enqueuer.done.is_set():
                    idle_kills += 1
                if observer.error or enqueuer.error:
                    raise RuntimeError("a bench thread failed") from observer.error or enqueuer.error
            observer.killing.clear()
            chaos_elapsed = time.monotonic() - started
            last = start_supervisor(env, last_log)
            try:
                drained = drain(plan, store, enqueuer, observer, [last])
                # The work may all have ended before the last boot serves: ask its API only once it answers.
                not_serving = wait_serving(last, url) if drained else None
                if not_serving is not None:
                    api_mismatches.append(f"the last boot: {not_serving}")
                elif drained:
                    api_mismatches = compare_with_api(url, all_rows(store))
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
            kept = keep_logs([log, last_log])
            print(
                f"chaos ({plan.mode}): not drained in {DRAIN_LIMIT_S:.0f} s; logs kept in {kept}; the last boot's:\n"
                f"{last_log.read_text()[-3000:]}"
            )
            return 1
        if api_mismatches:
            print(f"chaos ({plan.mode}): the last boot's API: logs kept in {keep_logs([log, last_log])}")
        for error in (observer.error, enqueuer.error):
            if error is not None:
                raise RuntimeError("a bench thread failed") from error
        acked += enqueuer.acked
        rows = all_rows(store)
        store.close()
        left = jobs_left(journal_path, plan.mode, rows)
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


# -- a fleet: several hosts on one PostgreSQL schema -------------------------------------------------------------


@dataclass
class FleetHost:
    """One host of the fleet: its own data dir, port and host id, kept across its boots (each logged apart)."""

    host_id: str
    port: int
    env: dict[str, str]
    logs: Path
    proc: subprocess.Popen[bytes] | None = None
    boots: int = 0
    kills: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.logs / f"{self.host_id}-boot{self.boots}.log"

    @property
    def up(self) -> bool:
        return self.proc is not None

    def start(self) -> None:
        self.boots += 1
        self.proc = start_supervisor(self.env, self.log)

    def sigkill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.proc = None
        self.kills += 1

    def terminate(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=60)
            self.proc = None


def database_problem(dsn: str | None) -> str | None:
    if not dsn:
        return "--hosts needs --database-url postgresql://... (or PODCAST_JOB_TEST_DATABASE_URL)"
    if not dsn.startswith(("postgresql://", "postgres://")):
        return "--database-url must be a postgresql:// URL (a fleet shares one PostgreSQL registry)"
    return None


def run_fleet(plan: Plan, results_dir: Path | None) -> int:
    """``plan.hosts`` supervisors on a fresh schema, each SIGKILLed at random and restarted with its host id."""
    problem = database_problem(plan.database_url) or (
        None if plan.mode == "subprocess" else "--hosts runs in subprocess mode only (--mode subprocess)"
    )
    if problem is not None:
        print(f"chaos: {problem}")
        return 2
    assert plan.database_url is not None
    schema = f"chaos_{uuid.uuid4().hex[:16]}"
    postgres_sql(plan.database_url, f'CREATE SCHEMA "{schema}"')
    try:
        return run_fleet_in(plan, results_dir, schema)
    finally:
        postgres_sql(plan.database_url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run_fleet_in(plan: Plan, results_dir: Path | None, schema: str) -> int:
    assert plan.database_url is not None
    rng = random.Random(plan.seed)
    with tempfile.TemporaryDirectory(prefix="chaos-fleet-") as tmp:
        root = Path(tmp).resolve()
        journal_path = root / "journal"  # one for the fleet: every host's jobs append to it
        journal_path.touch(mode=0o666)
        kinds = root / "kinds.toml"
        kinds.write_text(kinds_toml(journal_path))
        logs = root / "logs"
        logs.mkdir()
        base = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
        hosts: list[FleetHost] = []
        for n in range(1, plan.hosts + 1):
            host_id, port = f"h{n}", free_port()
            env = dict(base)
            env.update(
                PODCAST_JOB_DATA_DIR=str(root / host_id / "data"),
                PODCAST_JOB_BIND=f"127.0.0.1:{port}",
                PODCAST_JOB_KINDS_FILE=str(kinds),
                PODCAST_JOB_MAX_CONCURRENT=str(plan.slots),  # fleet-wide: one value for every host
                PODCAST_JOB_SWEEP_SECONDS="1",
                PODCAST_PIPELINE_EXEC_MODE=plan.mode,
                PODCAST_JOB_DATABASE_URL=with_schema(plan.database_url, schema),
                PODCAST_JOB_HOST_ID=host_id,
                PODCAST_JOB_HOST_LEASE_SECONDS=f"{plan.lease_s:g}",
            )
            hosts.append(FleetHost(host_id, port, env, logs))
        store = PostgresStore(plan.database_url, schema)
        try:
            return fleet_chaos(plan, results_dir, rng, store, hosts, journal_path, kinds)
        finally:
            for host in hosts:
                host.terminate()
            store.close()
            for host in hosts:
                run_dirs = load_config(host.env)[0].run_dirs()
                if run_dirs is not None:  # outside the temp dir (tmpfs): nothing else will sweep it
                    shutil.rmtree(run_dirs[0], ignore_errors=True)


def fleet_chaos(
    plan: Plan,
    results_dir: Path | None,
    rng: random.Random,
    store: PostgresStore,
    hosts: list[FleetHost],
    journal_path: Path,
    kinds: Path,
) -> int:
    durations = [round(rng.uniform(*plan.job_seconds), 3) for _ in range(plan.jobs)]
    direct, over_api = durations[: plan.jobs // 2], durations[plan.jobs // 2 :]
    acked = enqueue_direct(store, kinds, direct, sys.executable)
    # Each host lives a random while, is SIGKILLed, stays down a random while (past its lease at times: its jobs keep
    # their slots, the lead passes on) and is started again with its host id and data dir.
    mean_cycle = (sum(plan.lifetime_s) + sum(plan.down_s)) / 2
    chaos_s = plan.kills * mean_cycle / plan.hosts
    journal = Journal(journal_path)
    observer = Observer(
        plan.mode, journal, functools.partial(Shared, store), random.Random(rng.random()), plan.job_kill_every_s
    )
    enqueuer = Enqueuer(
        [h.url for h in hosts],
        over_api,
        0.8 * chaos_s / max(1, len(over_api)),
        random.Random(rng.random()),
        plan.lose_answers,
    )
    watch = LeaderWatch({h.host_id: h.url for h in hosts})
    threads = [threading.Thread(target=t.run) for t in (observer, enqueuer, watch)]
    life = random.Random(rng.random())
    idle_kills = 0
    started = time.monotonic()
    api_mismatches: list[str] = []
    observer.killing.set()
    for thread in threads:
        thread.start()
    drained = False
    try:
        due = {}
        for host in hosts:
            host.start()
            due[host.host_id] = time.monotonic() + life.uniform(*plan.lifetime_s)
        kills, target = 0, plan.kills
        while True:
            if kills >= target:
                # Past --kills: more only while fewer outside job kills than the plan's minimum landed (bounded).
                if len(observer.kills) >= plan.min_job_kills or kills >= 4 * plan.kills:
                    break
                target += 1
            host = min(hosts, key=lambda h: due[h.host_id])
            time.sleep(max(0.0, due[host.host_id] - time.monotonic()))
            if host.up:
                assert host.proc is not None
                if host.proc.poll() is not None:
                    print(f"{host.host_id} exited by itself ({host.proc.returncode}); see {host.log}:")
                    print(host.log.read_text()[-3000:])
                    return 2
                host.sigkill()
                kills += 1
                counts = store.counts()
                if counts["queued"] + counts["running"] == 0 and enqueuer.done.is_set():
                    idle_kills += 1
                due[host.host_id] = time.monotonic() + life.uniform(*plan.down_s)
            else:
                host.start()
                due[host.host_id] = time.monotonic() + life.uniform(*plan.lifetime_s)
            for thread_error in (observer.error, enqueuer.error, watch.error):
                if thread_error is not None:
                    raise RuntimeError("a bench thread failed") from thread_error
        observer.killing.clear()
        chaos_elapsed = time.monotonic() - started
        for host in hosts:  # every killed host comes back: its running rows keep their slots until it does
            if not host.up:
                host.start()
        last_boots = [h.log for h in hosts]
        for host in hosts:
            assert host.proc is not None
            not_serving = wait_serving(host.proc, host.url)
            if not_serving is not None:
                api_mismatches.append(f"{host.host_id}'s last boot: {not_serving}")
        procs = [h.proc for h in hosts if h.proc is not None]
        drained = not api_mismatches and drain(plan, store, enqueuer, observer, procs)
        if drained:
            rows = all_rows(store)
            for host in hosts:  # every host's API says what the registry says, of every row
                api_mismatches += [f"{host.host_id}: {m}" for m in compare_with_api(host.url, rows)]
    finally:
        enqueuer.stop.set()
        observer.killing.clear()
        # The watchers stop before the hosts: a clean shutdown hands the lead on at once, by design.
        observer.stop.set()
        watch.stop.set()
        for thread in threads:
            thread.join(timeout=60)
    for host in hosts:
        host.terminate()
    elapsed = time.monotonic() - started
    logs = sorted(hosts[0].logs.glob("*.log"))
    if not drained or api_mismatches:
        kept = keep_logs(logs)
        print(f"chaos ({plan.mode}, {plan.hosts} hosts): logs kept in {kept}")
        for log in last_boots:
            print(f"-- {log.name}:\n{log.read_text()[-2000:]}")
        if not drained:
            print(f"chaos: not drained in {DRAIN_LIMIT_S:.0f} s: {api_mismatches}")
            return 1
    elif plan.keep_logs:
        print(f"chaos ({plan.mode}, {plan.hosts} hosts): logs kept in {keep_logs(logs)}")
    for error in (observer.error, enqueuer.error, watch.error):
        if error is not None:
            raise RuntimeError("a bench thread failed") from error
    acked += enqueuer.acked
    rows = all_rows(store)
    left = jobs_left(journal_path, plan.mode, rows)
    journal.read()
    records = [p for h in hosts for p in state_records_left(h.env)]
    fleet = judge_fleet(plan, rows, journal, observer, watch, logs)
    report = judge(plan, rows, acked, journal, observer, enqueuer, left, api_mismatches, fleet=fleet)
    report.update(
        state_records_left=len(records),
        elapsed_s=round(elapsed, 1),
        chaos_phase_s=round(chaos_elapsed, 1),
        supervisor_kills=sum(h.kills for h in hosts),
        supervisor_kills_with_no_work_left=idle_kills,
        host_kills={h.host_id: h.kills for h in hosts},
        acknowledged_through={h.host_id: enqueuer.acked_by[h.url] for h in hosts},
        bench_registry_calls_unavailable=store.unavailable,
    )
    return finish(plan, report, results_dir)


def log_lines(log: Path, event: str) -> list[dict[str, Any]]:
    """A boot's JSON log lines of one event (a line cut short by the SIGKILL is skipped)."""
    found = []
    for line in log.read_text().splitlines():
        if f'"{event}"' in line:
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


# The reasons of an end that a process's exit (or its disappearance) gave: its line must name that process.
PROCESS_ENDS = re.compile(r"(resubmitted: )?(killed_by_|exit_code_)")


@dataclass
class Ends:
    """The ends of attempts (transitions out of ``running``) in the hosts' logs, judged against the journal."""

    seen: int = 0
    by_proof: int = 0
    violations: list[str] = field(default_factory=list)
    unmatched: list[dict[str, Any]] = field(default_factory=list)  # a pid the journal never saw start
    no_process: list[dict[str, Any]] = field(default_factory=list)  # an attempt that never had a process


def judge_ends(logs: list[Path], runs_of: Mapping[str, list[Run]]) -> Ends:
    """INV-OWNER-JUDGES over the logs: every line that ends an attempt names the process it ended (pid), and that
    process ran on the line's host -- or, INV-SILENT-HOST-ENDS-BY-PROOF, on a silent host whose end the line's host
    proved and said so. A line that names no process ended an attempt that never had one (its start never happened,
    or failed): it is counted, never matched to another attempt's run by time (an earlier attempt may have run
    anywhere). A line of a process's exit that names no process is a violation of its own."""
    ends = Ends()
    for log in logs:
        host_id = log.name.split("-boot")[0]
        # The leader records a silent host's job from the proof of its end (the exit record that host's shepherd
        # left): an end of another host's process, said as such, naming that host.
        proven = {(str(e.get("job_id")), str(e.get("host_id"))) for e in log_lines(log, "silent_host_job_ended")}
        for line in log_lines(log, "job_transition"):
            if line.get("from") != "running":
                continue
            ends.seen += 1
            fields = {k: line.get(k) for k in ("job_id", "pid", "to", "reason", "timestamp")}
            if line.get("pid") is None:
                if line.get("to") == "succeeded" or PROCESS_ENDS.match(str(line.get("reason"))):
                    ends.violations.append(f"{line['job_id']}: an end of its process names none ({log.name}: {fields})")
                else:
                    ends.no_process.append(fields)
                continue
            ended = [r for r in runs_of.get(str(line.get("job_id")), []) if r.pid == line["pid"]]
            if not ended:
                ends.unmatched.append(fields)  # a process the journal never saw start (a violation of its own)
            elif ended[-1].host != host_id and (str(line.get("job_id")), ended[-1].host) in proven:
                ends.by_proof += 1
            elif ended[-1].host != host_id:
                ran_on = ended[-1].host
                ends.violations.append(f"{line['job_id']}: its process on {ran_on} ended by {host_id} ({log.name})")
    return ends


@dataclass
class FleetFacts:
    """What a fleet run adds to the checks: the leaders seen, and who finalized what."""

    checks: dict[str, bool]
    violations: list[str]
    figures: dict[str, Any]


def judge_fleet(
    plan: Plan, rows: list[Job], journal: Journal, observer: Observer, watch: LeaderWatch, logs: list[Path]
) -> FleetFacts:
    # INV-ONE-LEADER: never two hosts saying they lead within the margin the design leaves between two leads, and
    # the leader table never handed on before the holder's lease (as last seen) ran out.
    margin_s = 0.2 * plan.lease_s  # ADR 0012 §3: a leader lets go at 80 % of its lease
    # A restarted host's boot that took its dead boot's lead at once, proved gone by the data dir's lock (§9).
    successions = frozenset(
        (str(line.get("previous_boot_id")), str(line.get("boot_id")))
        for log in logs
        for line in log_lines(log, "host_restarted")
    )
    two_leaders = overlapping_claims(watch.claims, margin_s, successions) + leader_handovers(
        observer.leaders, successions
    )
    # INV-OWNER-JUDGES: the row's host is the host that ran its last attempt, and every end in a host's log is of a
    # process that ran on that host.
    not_owner: list[str] = []
    for row in rows:
        runs = journal.runs.get(row.job_id, [])
        if runs and row.host_id != runs[-1].host:
            not_owner.append(f"{row.job_id}: row's host {row.host_id}, its last attempt ran on {runs[-1].host}")
    ends = judge_ends(logs, journal.runs)
    not_owner += ends.violations
    silent = sum(len(log_lines(log, "host_silent")) for log in logs)
    taken_over = sum(len(log_lines(log, "host_id_taken_over")) for log in logs)
    checks = {
        f"never two leaders ({len(watch.claims)} leader answers in {watch.rounds} rounds of every host's health, "
        f"{len(observer.leaders)} holders of the leader table)": not two_leaders,
        f"no attempt ended by a host that did not run it ({ends.seen} ends in the logs), "
        "every row's host ran its last attempt": not not_owner,
    }
    figures = {
        "leader_holders": len(observer.leaders),
        "leader_answers": len(watch.claims),
        "health_rounds": watch.rounds,
        "health_answers": watch.answers,
        "ends_in_logs": ends.seen,
        "ends_of_silent_hosts_jobs_by_proof": ends.by_proof,
        "ends_in_logs_without_journal_run": len(ends.unmatched),
        "ends_in_logs_without_journal_run_first": ends.unmatched[:10],
        "ends_in_logs_of_no_process": len(ends.no_process),
        "ends_in_logs_of_no_process_first": ends.no_process[:10],
        "host_silent_errors": silent,
        "host_id_taken_over_warnings": taken_over,
        "ran_on": dict(collections.Counter(r.host for runs in journal.runs.values() for r in runs)),
    }
    return FleetFacts(checks, two_leaders + not_owner, figures)


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
    store: Store,
    enqueuer: Enqueuer,
    observer: Observer,
    last: list[subprocess.Popen[bytes]],
) -> bool:
    """Until every job is enqueued and every row terminal (and, in Docker mode, every container of the run removed)."""
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in last):
            return False
        if observer.error or enqueuer.error:
            return False
        counts = store.counts()
        if enqueuer.done.is_set() and counts["queued"] == 0 and counts["running"] == 0:
            break
        time.sleep(0.2)
    else:
        return False
    if plan.mode == "docker":
        # Each container is removed just after its row is final: wait for the last few removals (one left for good
        # is reported by the "nothing stuck" check).
        settle = time.monotonic() + GONE_LIMIT_S
        ids = {r.job_id for r in all_rows(store)}
        while time.monotonic() < settle and our_containers(ids) != []:
            time.sleep(0.2)
    return True


def compare_with_api(base_url: str, rows: list[Job]) -> list[str]:
    """Every row as a boot's API shows it: the same status, reason, exit code, attempts, history (and host)."""
    mismatches = []
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        for row in rows:
            try:
                shown = client.get(f"/api/jobs/{row.job_id}", timeout=30.0)
            except httpx.TransportError as exc:
                return [*mismatches, f"{base_url} did not answer: {type(exc).__name__}: {exc}"]
            if shown.status_code != 200:
                mismatches.append(f"{row.job_id}: API answered {shown.status_code} {shown.text[:200]}")
                continue
            body = shown.json()
            want = row.public()
            for key in ("status", "error_reason", "exit_code", "attempts", "max_attempts", "history", "host_id"):
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
    *,
    fleet: FleetFacts | None = None,
) -> dict[str, Any]:
    """Every row against what its job really did: the journal's starts and ends, and the bench's kills (in a fleet,
    with ``fleet``'s checks: the leaders, and who ended what)."""
    kill_reason, kill_code = KILLED[plan.mode]
    by_id = {r.job_id: r for r in rows}
    lost = [job_id for job_id in acked if job_id not in by_id]
    # INV-KEY-ONCE (ADR 0016): every request carries a key, so a retry after a lost answer never makes a second row.
    unacknowledged = sorted(set(by_id) - set(acked))
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
    solo = {row.job_id for row in rows if row.kind == SOLO}
    solo_peak = max_overlap({job_id: runs for job_id, runs in journal.runs.items() if job_id in solo})
    outcomes = collections.Counter((str(r.status), r.error_reason) for r in rows)
    resubmits = sum(len(r.history) for r in rows)
    checks = {
        f"every acknowledged job has a row ({len(acked)} acknowledged, {len(rows)} rows)": not lost,
        "as many rows as acknowledged jobs: no retried request made a second row": not unacknowledged
        and len(set(acked)) == len(acked),
        (
            "every row is terminal, and every host's API agrees with the registry"
            if fleet is not None
            else "every row is terminal, and the last boot's API agrees with the registry"
        ): not not_terminal and not api_mismatches,
        "every job that ran has a row": not unknown_runs,
        "no job ran twice except as a recorded resubmit (attempts = journal starts, history = earlier ones)": not twice,
        "every outcome is what the job did (a kill as that kill, exit 0 as succeeded)": not wrong,
        f"never more than {plan.slots} at once (journal peak {peak}, registry peak {observer.peak_running_rows})": peak
        <= plan.slots
        and observer.peak_running_rows <= plan.slots,
        "nothing stuck: no job process or container of the run left": not left,
        f"never more than 1 {SOLO} job at once, its max_running ({len(solo)} of them, journal peak {solo_peak})": (
            solo_peak <= 1
        ),
    }
    violations = lost + [f"{job_id}: a row no answer acknowledged" for job_id in unacknowledged]
    violations += not_terminal + api_mismatches + unknown_runs + twice + wrong + left
    if fleet is not None:
        checks.update(fleet.checks)
        violations += fleet.violations
    return {
        **(fleet.figures if fleet is not None else {}),
        "rows": len(rows),
        "acknowledged": len(acked),
        "enqueued_over_api": len(enqueuer.acked),
        "api_requests_refused": enqueuer.refused,
        "api_answers_lost": enqueuer.lost_answers,
        "api_answers_dropped_by_the_lossy_client": enqueuer.dropped_answers,
        "rows_no_answer_acknowledged": len(unacknowledged),
        "outside_job_kills": len(killed_runs),
        "outside_kills_missed": observer.missed,
        "outside_kills_raced_exit": raced,
        "resubmits": resubmits,
        "jobs_resubmitted": sum(1 for r in rows if r.history),
        "jobs_out_of_attempts": sum(1 for r in rows if r.error_reason == kill_reason),
        "starts": sum(len(runs) for runs in journal.runs.values()),
        "peak_concurrency_journal": peak,
        "peak_solo_journal": solo_peak,
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
    where = f"{plan.mode} mode" + (f", {plan.hosts} hosts on PostgreSQL" if plan.hosts > 1 else "")
    print(
        f"chaos ({where}): {report['rows']} jobs, {plan.slots} slots, supervisor SIGKILLed "
        f"{report['supervisor_kills']} times, jobs SIGKILLed from outside {report['outside_job_kills']} times, "
        f"{report['resubmits']} resubmits, {report['elapsed_s']:.1f} s, seed {plan.seed}"
    )
    figures = ("acknowledged", "api_answers_lost", "outside_kills_missed", "outside_kills_raced_exit")
    figures += ("jobs_resubmitted", "jobs_out_of_attempts", "starts", "supervisor_kills_with_no_work_left")
    figures += ("state_records_left",)
    if plan.hosts > 1:
        figures += ("host_kills", "ran_on", "leader_holders", "leader_answers", "host_silent_errors")
        figures += ("host_id_taken_over_warnings", "ends_in_logs", "ends_in_logs_without_journal_run")
        figures += ("ends_in_logs_of_no_process",)
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
        args: dict[str, Any] = {
            "mode": plan.mode,
            "jobs": plan.jobs,
            "slots": plan.slots,
            "kills": plan.kills,
            "seed": plan.seed,
            "job_kill_every_s": plan.job_kill_every_s,
            "job_seconds": list(plan.job_seconds),
            "supervisor_lifetime_s": list(plan.lifetime_s),
            "max_attempts": MAX_ATTEMPTS,
        }
        if plan.hosts > 1:
            args.update(hosts=plan.hosts, host_lease_s=plan.lease_s, host_down_s=list(plan.down_s))
        data.update(mode=plan.mode, args=args, command=reproduce(plan), **report)
        path = results_dir / results_name(f"{plan.mode}{f'-{plan.hosts}hosts' if plan.hosts > 1 else ''}-chaos")
        write_json(path, data)
        print(f"  results: {path}")
    return 0 if report["verdict"] == "PASS" else 1


def reproduce(plan: Plan) -> str:
    hosts = f" --hosts {plan.hosts}" if plan.hosts > 1 else ""  # the database: --database-url, or the test one
    if plan.smoke:
        return f".venv/bin/python tests/longrun/chaos.py --smoke --mode {plan.mode}{hosts} --seed {plan.seed}"
    return (
        f".venv/bin/python tests/longrun/chaos.py --mode {plan.mode}{hosts} --jobs {plan.jobs} --slots {plan.slots} "
        f"--kills {plan.kills} --seed {plan.seed} --job-kill-every-s {plan.job_kill_every_s:g}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode", choices=(*MODES, "both"), default=None, help="default: both; with --hosts, subprocess"
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=3, help="PODCAST_JOB_MAX_CONCURRENT (fleet-wide with --hosts)")
    parser.add_argument("--kills", type=int, default=200, help="supervisor SIGKILLs (of any host, with --hosts)")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--job-kill-every-s", type=float, default=1.0, help="mean interval of outside job kills")
    parser.add_argument("--hosts", type=int, default=1, help="a fleet of this many supervisors on PostgreSQL (>= 2)")
    parser.add_argument(
        "--database-url",
        default=None,
        help="with --hosts: the PostgreSQL server (a fresh schema per run; default $PODCAST_JOB_TEST_DATABASE_URL)",
    )
    parser.add_argument("--smoke", action="store_true", help="a few jobs and kills: that the script still works")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="where the results JSON goes (default bench/results; --smoke: none)",
    )
    parser.add_argument("--no-write", action="store_true", help="write no results file")
    parser.add_argument("--keep-logs", action="store_true", help="with --hosts: keep every boot's log (a failure does)")
    parser.add_argument(
        "--lose-answers",
        type=float,
        default=0.1,
        help="the share of 202 answers the API client throws away and asks again for, with the request's "
        "Idempotency-Key (the lossy client: ADR 0016)",
    )
    args = parser.parse_args()
    if not 0 <= args.lose_answers < 1:
        parser.error(f"--lose-answers must be in [0, 1), not {args.lose_answers}")
    if args.hosts < 1:
        parser.error(f"--hosts must be 1 or more, not {args.hosts}")
    database_url = args.database_url or os.environ.get("PODCAST_JOB_TEST_DATABASE_URL") or None
    if args.hosts > 1:
        problem = database_problem(database_url)
        if problem is not None:
            parser.error(problem)
        if args.mode not in (None, "subprocess"):
            parser.error(f"--hosts runs in subprocess mode only, not --mode {args.mode}")
    elif args.database_url is not None:
        parser.error("--database-url goes with --hosts N (N >= 2): one host runs on SQLite")
    mode_arg = args.mode or ("subprocess" if args.hosts > 1 else "both")
    results_dir = None if args.no_write else args.results_dir or (None if args.smoke else REPO / "bench" / "results")
    fleet: dict[str, Any] = {"lose_answers": args.lose_answers}
    if args.hosts > 1:
        fleet.update(hosts=args.hosts, database_url=database_url, keep_logs=args.keep_logs)
    status = 0
    for mode in MODES if mode_arg == "both" else (mode_arg,):
        if args.smoke:
            # Jobs of 0.3-1 s: on a loaded machine, 16 jobs of 0.05-0.5 s could all end between two of the observer's
            # looks (a smoke run that landed no outside kill at all, seen twice while a fleet run shared the machine).
            plan = Plan(mode, 16, 3, 4, args.seed, 0.3, job_seconds=(0.3, 1.0), min_job_kills=3, smoke=True, **fleet)
        else:
            plan = Plan(mode, args.jobs, args.slots, args.kills, args.seed, args.job_kill_every_s, **fleet)
        status = max(status, run(plan, results_dir))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
