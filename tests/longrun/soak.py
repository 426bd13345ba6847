"""Soak benchmark: a real ``supervisor serve`` under a light workload for a long time; its resources must
stay flat.

Usage: make soak   (or .venv/bin/python tests/longrun/soak.py [--duration-s 3600] [--sample-s 5] [--plot soak.png]
                    [--results-dir DIR] [--no-write])
       .venv/bin/python tests/longrun/soak.py --from-csv soak.csv [--plot soak.png]   (judge, plot a finished run again)

What runs: the venv's ``supervisor serve`` entry point (or ``python -m supervisor serve`` from ``--source DIR``, to
soak another checkout), with its data directory in a temporary directory, bound to 127.0.0.1 port 0, an API token,
``max_concurrent`` 2 and a kinds file of harmless kinds. A workload thread repeats rounds until the duration is up:

- jobs starting and ending: an ``exit`` job that prints and exits 0, one that exits 3 (a failure), a short ``sleep``,
  and a ``beat`` job that POSTs heartbeats with its own ``PODCAST_JOB_TOKEN`` to ``PODCAST_JOB_HEARTBEAT_URL``
  (urllib, with a timeout); with 2 slots some of them queue and are promoted when a slot frees;
- log reads (``tail_bytes`` and ``offset``), listings (jobs, a filtered page, queue, health, metrics), and a burst of
  16 concurrent listings (registry calls overlap, so the connection pool reaches its size during warm-up);
- every third round a pause, a job enqueued while paused (it must stay queued), and a resume;
- a long ``sleep`` job cancelled while it runs (SIGTERM to its process group; it must end ``cancelled``);
- beside them for the whole run, ``--misbehaving-clients`` (default 20) connections at a time that misuse HTTP
  (``tests/longrun/_misbehave.py``: heads and bodies cut, pipelining, hang-ups around the edge's timeouts, with and
  without tokens, on every route kind but the queue's resume, which would lift the workload's own pause; ADR 0019);
- then an idle gap, cycling through ``--idle-gaps-s`` (default 12, 15 and 31 s): all longer than the 10 s after which
  Trio's thread cache retires an idle worker thread, so the next registry call lands on a fresh thread. That is
  what exposed the leak before the registry's pool (a connection, two descriptors, per fresh thread).

Every outcome is checked (statuses, exit reasons, heartbeat units, log contents); an unexpected one, an HTTP error or
a 5xx counts as a workload error.

What is sampled every ``--sample-s`` (and written to a CSV as it goes, so a long run can be watched): the
supervisor process's open descriptors (``/proc/<pid>/fd``; those on the registry file, its WAL and its shared-memory
index are told apart by their link, and the ones on the file itself count its SQLite connections), threads
(``Threads`` in ``/proc/<pid>/status``), RSS (``VmRSS``), CPU seconds, and the size of the registry file and its WAL.

The verdict (exit 1 on FAIL): samples taken during the warm-up (``--warmup-s``, default a fifth of the run, at most
300 s) are ignored; of the rest, the median of the last quarter minus the median of the first quarter is each
metric's growth.

- Descriptors other than the registry's, threads and RSS fail when their growth exceeds an absolute slack
  (``--fd-slack`` 4, ``--thread-slack`` 3, ``--rss-slack-mib`` 16: the pool's four SQLite page caches may
  legitimately fill to 2 MiB each as the file grows; the rest is allocator noise).
- SQLite connections fail when any sample exceeds a bound (``--max-connections`` 4, the registry pool's size), not
  on growth: the pool opens its connections lazily and keeps them, so a step up to its size is no leak. A leak of
  one connection per idle gap (the leak the registry's pool ended) passes the bound within a few gaps.
- The registry file grows with its rows, so it is reported (bytes per row), not judged; so is the total of
  descriptors.
- A dead supervisor, too few samples to judge, or any workload error also fail the run.

The results (the options, the workload's counts, each metric's trend and verdict, the samples) are written to
``bench/results/<UTC date of the start>-soak.json`` (``--results-dir``; ``--no-write``: none; a ``--from-csv`` run
writes nothing); bench/report.py shows the latest soaks in docs/performance.md, with the plot when ``--plot`` put it
under docs/.
"""

from __future__ import annotations

import argparse
import csv
import http.server
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))  # the results files' helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _misbehave

import _misbehave  # noqa: E402
from _common import git_revision, machine, versions  # noqa: E402
from results import RESULTS_DIR, SCHEMA, results_name, write_json  # noqa: E402

HTTP_TIMEOUT_S = 10.0  # every call the workload makes; the supervisor answers in milliseconds
START_TIMEOUT_S = 30.0
JOB_TIMEOUT_S = 60.0  # a round's jobs run for about a second; a minute means something is stuck
STOP_TIMEOUT_S = 15.0
TRIO_IDLE_TIMEOUT_S = 10.0  # trio._core._thread_cache.IDLE_TIMEOUT
BURST = 16  # concurrent listings per round
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "stale"})

# Harmless kinds. The beat job is the job side of the heartbeat contract: its token and URL come from the
# environment the supervisor gives it, and every call carries a timeout.
BEAT_CODE = """\
import json, os, sys, threading, urllib.request
count, gap = int(sys.argv[1]), float(sys.argv[2])
url, token = os.environ["PODCAST_JOB_HEARTBEAT_URL"], os.environ["PODCAST_JOB_TOKEN"]
for done in range(1, count + 1):
    body = json.dumps({"completed_units": done, "total_units": count, "stage": "soak"}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 204, answer.status
    print("beat", done, flush=True)
    threading.Event().wait(gap)
"""
EXIT_CODE = "import sys\nfor i in range(20):\n    print('soak line', i)\nsys.exit(int(sys.argv[1]))\n"
SLEEP_CODE = "import sys, threading\nthreading.Event().wait(float(sys.argv[1]))\n"


def kinds_toml() -> str:
    def kind(name: str, code: str, params: dict[str, str]) -> str:
        # A JSON string is a valid TOML basic string (the escapes used here, \\n and \\", are shared).
        argv = ", ".join(json.dumps(a) for a in ["{python}", "-c", code, *(f"{{{p}}}" for p in params)])
        table = ", ".join(f"{p} = {json.dumps(t)}" for p, t in params.items())
        return f"[kinds.{name}]\nargv = [{argv}]\nparams = {{ {table} }}\n"

    return "\n".join(
        [
            kind("exit", EXIT_CODE, {"code": "int"}),
            kind("sleep", SLEEP_CODE, {"seconds": "float"}),
            kind("beat", BEAT_CODE, {"count": "int", "gap": "float"}),
        ]
    )


# -- sampling -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    elapsed_s: float
    fds: int
    registry_fds: int  # on the registry file, its WAL and its shared-memory index
    registry_conns: int  # on the registry file itself: one per open SQLite connection
    threads: int
    rss_kib: int
    cpu_s: float
    registry_bytes: int
    wal_bytes: int
    jobs: int  # rows the workload has created so far
    rounds: int


CSV_FIELDS = [f.name for f in fields(Sample)]


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise ProcessLookupError(f"no {name} in /proc/{pid}/status: the process has exited")  # a zombie has no VmRSS


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    after_name = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
    utime, stime = int(after_name[11]), int(after_name[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _descriptors_on(pid: int, paths: Sequence[str]) -> dict[str, int]:
    """How many of the process's descriptors are open on each of ``paths``. SQLite opens the registry file and
    its WAL once per connection, and its shared-memory index once per process."""
    counts = dict.fromkeys(paths, 0)
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed since the listing
        if target in counts:
            counts[target] += 1
    return counts


def take_sample(pid: int, registry: Path, elapsed_s: float, jobs: int, rounds: int) -> Sample:
    """One reading of the supervisor process. Raises OSError when the process is gone (or a zombie)."""
    registry_file = str(registry.resolve())
    counts = _descriptors_on(pid, [registry_file, registry_file + "-wal", registry_file + "-shm"])
    return Sample(
        elapsed_s=round(elapsed_s, 1),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        registry_fds=sum(counts.values()),
        registry_conns=counts[registry_file],
        threads=_status_field(pid, "Threads"),
        rss_kib=_status_field(pid, "VmRSS"),
        cpu_s=round(_cpu_seconds(pid), 2),
        registry_bytes=_size(registry),
        wal_bytes=_size(registry.with_name(registry.name + "-wal")),
        jobs=jobs,
        rounds=rounds,
    )


def read_csv(path: Path) -> list[Sample]:
    with path.open(newline="") as fh:
        return [
            Sample(
                elapsed_s=float(row["elapsed_s"]),
                fds=int(row["fds"]),
                registry_fds=int(row["registry_fds"]),
                registry_conns=int(row["registry_conns"]),
                threads=int(row["threads"]),
                rss_kib=int(row["rss_kib"]),
                cpu_s=float(row["cpu_s"]),
                registry_bytes=int(row["registry_bytes"]),
                wal_bytes=int(row["wal_bytes"]),
                jobs=int(row["jobs"]),
                rounds=int(row["rounds"]),
            )
            for row in csv.DictReader(fh)
        ]


# -- the verdict ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trend:
    metric: str
    first: float  # median of the first quarter after warm-up
    last: float  # median of the last quarter
    low: float
    high: float
    slack: float | None  # allowed growth; None: growth not judged
    samples: int  # after warm-up
    limit: float | None = None  # an absolute bound on every sample after warm-up; None: none

    @property
    def growth(self) -> float:
        return self.last - self.first

    @property
    def judged(self) -> bool:
        return self.slack is not None or self.limit is not None

    @property
    def ok(self) -> bool:
        return (self.slack is None or self.growth <= self.slack) and (self.limit is None or self.high <= self.limit)


MIN_JUDGED_SAMPLES = 8


def trend(values: Sequence[float], metric: str, slack: float | None, limit: float | None = None) -> Trend:
    """Growth of a metric after warm-up: median of the last quarter minus median of the first quarter."""
    if len(values) < MIN_JUDGED_SAMPLES:
        raise ValueError(f"{len(values)} samples after warm-up: at least {MIN_JUDGED_SAMPLES} are needed to judge")
    quarter = len(values) // 4
    return Trend(
        metric=metric,
        first=statistics.median(values[:quarter]),
        last=statistics.median(values[-quarter:]),
        low=min(values),
        high=max(values),
        slack=slack,
        samples=len(values),
        limit=limit,
    )


@dataclass(frozen=True)
class Slack:
    fds: float = 4
    threads: float = 3
    rss_mib: float = 16
    max_connections: float = 4  # supervisor.registry.sqlite's default pool size


def judge(samples: Sequence[Sample], warmup_s: float, slack: Slack) -> list[Trend]:
    kept = [s for s in samples if s.elapsed_s >= warmup_s]
    metrics: list[tuple[str, Callable[[Sample], float], float | None, float | None]] = [
        # Descriptors other than the registry's must not trend up; the registry's come with its connections, which
        # the pool opens lazily up to its size and keeps: for them a bound, not a trend.
        ("other_fds", lambda s: s.fds - s.registry_fds, slack.fds, None),
        ("registry_conns", lambda s: s.registry_conns, None, slack.max_connections),
        ("fds", lambda s: s.fds, None, None),
        ("threads", lambda s: s.threads, slack.threads, None),
        ("rss_mib", lambda s: s.rss_kib / 1024, slack.rss_mib, None),
        ("registry_kib", lambda s: s.registry_bytes / 1024, None, None),
        ("wal_kib", lambda s: s.wal_bytes / 1024, None, None),
    ]
    return [trend([get(s) for s in kept], name, grow, bound) for name, get, grow, bound in metrics]


def default_warmup_s(duration_s: float) -> float:
    return min(300.0, duration_s / 5)


# -- the workload -----------------------------------------------------------------------------------------------


class WorkloadError(Exception):
    """The supervisor answered something the workload did not expect."""


@dataclass
class Counts:
    rounds: int = 0
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    heartbeats: int = 0
    log_reads: int = 0
    listings: int = 0
    pauses: int = 0
    cancels: int = 0
    idle_gaps: int = 0
    errors: list[str] = field(default_factory=list)


class Workload:
    """Rounds of jobs, reads and listings separated by idle gaps; runs in its own thread until ``stop`` is set."""

    def __init__(self, base_url: str, token: str, idle_gaps_s: Sequence[float], stop: threading.Event) -> None:
        self.base_url = base_url
        self.token = token
        self.idle_gaps_s = list(idle_gaps_s)
        self.stop = stop
        self.counts = Counts()
        self.beats_per_job = 5

    # HTTP: one short-lived client per round, so no keep-alive connection is held across an idle gap (the
    # supervisor's descriptors then count only what it owns, not the bench's idle sockets).
    def _call(self, client: httpx.Client, method: str, path: str, *, body: Any = None, expect: int = 200) -> Any:
        if method == "GET":
            answer = client.get(path, timeout=HTTP_TIMEOUT_S)
        else:
            answer = client.post(path, json=body, timeout=HTTP_TIMEOUT_S)
        if answer.status_code != expect:
            raise WorkloadError(f"{method} {path}: HTTP {answer.status_code} {answer.text[:200]}")
        if answer.headers.get("content-type", "").startswith("application/json"):
            return answer.json()
        return answer.text

    def _enqueue(self, client: httpx.Client, kind: str, params: dict[str, Any]) -> str:
        job_id: str = self._call(client, "POST", "/api/jobs", body={"kind": kind, "params": params}, expect=202)[
            "job_id"
        ]
        self.counts.jobs += 1
        return job_id

    def _wait_terminal(self, client: httpx.Client, job_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while True:
            row: dict[str, Any] = self._call(client, "GET", f"/api/jobs/{job_id}")
            if row["status"] in TERMINAL:
                return row
            if time.monotonic() > deadline:
                raise WorkloadError(f"job {job_id} still {row['status']} after {JOB_TIMEOUT_S} s")
            self.stop.wait(0.2)  # polling a job's state is what an operator's script does

    def _expect(self, row: dict[str, Any], status: str, reason: str | None = None) -> None:
        if row["status"] != status or row["error_reason"] != reason:
            raise WorkloadError(
                f"job {row['job_id']} ({row['kind']}): {row['status']}/{row['error_reason']}, "
                f"expected {status}/{reason}"
            )
        if status == "succeeded":
            self.counts.succeeded += 1
        elif status == "failed":
            self.counts.failed += 1

    def _cancel_a_running_job(self, client: httpx.Client) -> str:
        """A job cancelled while it runs: SIGTERM to its group, reaped by its monitor, status cancelled."""
        job_id = self._enqueue(client, "sleep", {"seconds": 60.0})
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while (row := self._call(client, "GET", f"/api/jobs/{job_id}"))["status"] == "queued":
            if time.monotonic() > deadline:
                raise WorkloadError(f"job {job_id} still queued after {JOB_TIMEOUT_S} s")
            self.stop.wait(0.1)
        if row["status"] != "running":
            raise WorkloadError(f"job {job_id} {row['status']} before it was cancelled")
        self._call(client, "POST", f"/api/jobs/{job_id}/cancel")
        self._expect(self._wait_terminal(client, job_id), "cancelled", "cancelled")
        self.counts.cancels += 1
        return job_id

    def _burst(self, client: httpx.Client) -> None:
        """Several clients at once (a dashboard, scripts): registry calls overlap, so the connection pool opens
        all the connections it may (early, during warm-up) instead of one more whenever two calls first collide."""
        with ThreadPoolExecutor(max_workers=BURST) as pool:
            pages = list(pool.map(lambda _: self._call(client, "GET", "/api/jobs?limit=1000"), range(BURST)))
        if any(not page["jobs"] for page in pages):
            raise WorkloadError("an empty listing in the burst")
        self.counts.listings += BURST

    def one_round(self, number: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=HTTP_TIMEOUT_S) as client:
            ok = self._enqueue(client, "exit", {"code": 0})
            bad = self._enqueue(client, "exit", {"code": 3})
            nap = self._enqueue(client, "sleep", {"seconds": 0.3})
            beat = self._enqueue(client, "beat", {"count": self.beats_per_job, "gap": 0.2})
            held = None
            if number % 3 == 1:
                self._call(client, "POST", "/api/queue/pause")
                self.counts.pauses += 1
                held = self._enqueue(client, "sleep", {"seconds": 0.1})
                queue = self._call(client, "GET", "/api/queue")
                row = self._call(client, "GET", f"/api/jobs/{held}")
                if not queue["paused"] or row["status"] != "queued":
                    raise WorkloadError(f"paused queue {queue} promoted job {held}: {row['status']}")
                self._call(client, "POST", "/api/queue/resume")

            self._expect(self._wait_terminal(client, ok), "succeeded")
            self._expect(self._wait_terminal(client, bad), "failed", "exit_code_3")
            self._expect(self._wait_terminal(client, nap), "succeeded")
            beat_row = self._wait_terminal(client, beat)
            self._expect(beat_row, "succeeded")
            if beat_row["completed_units"] != self.beats_per_job:
                raise WorkloadError(f"beat job {beat}: completed_units {beat_row['completed_units']}")
            self.counts.heartbeats += self.beats_per_job
            if held is not None:
                self._expect(self._wait_terminal(client, held), "succeeded")
            long = self._cancel_a_running_job(client)

            tail = self._call(client, "GET", f"/api/jobs/{ok}/log?tail_bytes=100")
            whole = self._call(client, "GET", f"/api/jobs/{bad}/log?offset=0")
            beats = self._call(client, "GET", f"/api/jobs/{beat}/log?offset=0")
            self.counts.log_reads += 3
            if "soak line 19" not in tail or "soak line 0" not in whole or f"beat {self.beats_per_job}" not in beats:
                raise WorkloadError(f"unexpected log contents: {tail[-60:]!r} / {whole[:60]!r} / {beats[-60:]!r}")

            listed = self._call(client, "GET", "/api/jobs?limit=100")
            if not listed["jobs"] or listed["jobs"][0]["job_id"] != long:
                raise WorkloadError("the newest listed job is not one of this round's")
            self._call(client, "GET", "/api/jobs?status=failed&limit=10")
            queue = self._call(client, "GET", "/api/queue")
            if queue["paused"] or queue["running"] or queue["queued"]:
                raise WorkloadError(f"queue not idle after the round: {queue}")
            self._call(client, "GET", "/api/health")
            self._call(client, "GET", "/metrics")
            self.counts.listings += 5
            self._burst(client)

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            try:
                self.one_round(number)
            except (WorkloadError, httpx.HTTPError, KeyError, ValueError) as exc:
                self.counts.errors.append(f"round {number}: {type(exc).__name__}: {exc}")
                print(f"soak: workload error in round {number}: {exc}", file=sys.stderr, flush=True)
            number += 1
            self.counts.rounds = number
            gap = self.idle_gaps_s[number % len(self.idle_gaps_s)]
            if not self.stop.wait(gap):
                self.counts.idle_gaps += 1


# -- the supervisor process ------------------------------------------------------------------------------------


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    base_url: str
    token: str
    registry: Path
    log_path: Path


class WebhookReceiver:
    """A loopback webhook receiver (``--webhook``): answers 204 to every POST and counts them, so the soak also
    holds the supervisor's webhook sender and its HTTP client for the whole run."""

    def __init__(self) -> None:
        received = self.received = [0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received[0] += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, name="soak-webhook", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_supervisor(
    work: Path,
    source: Path | None,
    sweep_s: float | None,
    exec_mode: str = "subprocess",
    webhook_url: str | None = None,
) -> Served:
    data = work / "data"
    data.mkdir()
    kinds = work / "kinds.toml"
    kinds.write_text(kinds_toml())
    token = secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PODCAST_JOB_DATA_DIR=str(data),
        PODCAST_JOB_BIND="127.0.0.1:0",
        PODCAST_JOB_API_TOKEN=token,
        PODCAST_JOB_KINDS_FILE=str(kinds),
        PODCAST_JOB_MAX_CONCURRENT="2",
    )
    if sweep_s is not None:
        env["PODCAST_JOB_SWEEP_SECONDS"] = str(sweep_s)
    if exec_mode == "docker":
        # Jobs in containers on the host network reach the server's loopback address for their heartbeats.
        env.update(PODCAST_PIPELINE_EXEC_MODE="docker", PODCAST_JOB_DOCKER_NETWORK="host")
    if webhook_url is not None:
        env.update(PODCAST_JOB_WEBHOOK_URL=webhook_url, PODCAST_JOB_WEBHOOK_SECRET=secrets.token_hex(16))
    if source is None:
        entry = Path(sys.executable).parent / "supervisor"  # the venv's console script
        argv = [str(entry), "serve"]
    else:
        env["PYTHONPATH"] = str(source.resolve())
        argv = [sys.executable, "-m", "supervisor", "serve"]
    log_path = work / "supervisor.log"
    with log_path.open("wb") as log:
        # Its own session: a Ctrl-C meant for the bench must not reach it; the bench stops it with SIGTERM.
        process = subprocess.Popen(
            argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in log_path.read_text(errors="replace").splitlines():
            if '"supervisor_started"' in line:
                url = json.loads(line)["url"]
                return Served(process, url, token, data / ".viewer" / "jobs.sqlite3", log_path)
        if process.poll() is not None:
            break
        time.sleep(0.1)  # waiting for the server's start line, under the deadline above
    process.kill()
    process.wait()
    raise SystemExit(f"soak: supervisor did not start:\n{log_path.read_text(errors='replace')[-3000:]}")


def stop_supervisor(served: Served) -> int | None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S. Returns the exit code."""
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait()
    return served.process.returncode


def wait_queue_idle(served: Served) -> None:
    """Let the last round's jobs end before the supervisor stops (a stopped supervisor leaves its jobs running)."""
    headers = {"Authorization": f"Bearer {served.token}"}
    deadline = time.monotonic() + JOB_TIMEOUT_S
    with httpx.Client(base_url=served.base_url, headers=headers, timeout=HTTP_TIMEOUT_S) as client:
        while time.monotonic() < deadline:
            try:
                queue = client.get("/api/queue", timeout=HTTP_TIMEOUT_S).json()
            except (httpx.HTTPError, ValueError):
                return
            if not queue["running"] and not queue["queued"]:
                return
            time.sleep(0.2)  # polling the queue under the deadline above


# -- reporting --------------------------------------------------------------------------------------------------


def print_summary(trends: Sequence[Trend], warmup_s: float, samples: Sequence[Sample]) -> None:
    print(f"\nafter a {warmup_s:.0f} s warm-up: median of the first vs the last quarter of {trends[0].samples} samples")
    print(
        f"{'metric':<16}{'first q':>10}{'last q':>10}{'growth':>10}{'slack':>8}{'min':>10}{'max':>10}{'bound':>8}"
        "  verdict"
    )
    for t in trends:
        slack = "-" if t.slack is None else f"{t.slack:g}"
        bound = "-" if t.limit is None else f"{t.limit:g}"
        verdict = "reported" if not t.judged else ("PASS" if t.ok else "FAIL")
        print(
            f"{t.metric:<16}{t.first:>10.1f}{t.last:>10.1f}{t.growth:>+10.1f}{slack:>8}{t.low:>10.1f}{t.high:>10.1f}"
            f"{bound:>8}  {verdict}"
        )
    last = samples[-1]
    per_row = f" ({last.registry_bytes / last.jobs:.0f} bytes per row)" if last.jobs else ""
    print(
        f"registry: {last.registry_bytes} bytes for {last.jobs} rows{per_row}; WAL {last.wal_bytes} bytes (at most "
        f"{max(s.wal_bytes for s in samples)}: SQLite checkpoints it at about 4 MiB and reuses the file); "
        f"supervisor CPU {last.cpu_s:.1f} s in {last.elapsed_s:.0f} s"
    )


def markdown_table(samples: Sequence[Sample], step_s: float) -> str:
    """One row per ``step_s`` (the first sample at or after each step), and the last sample."""
    rows = [
        "| t (min) | fds | SQLite conns | threads | RSS MiB | registry KiB | WAL KiB | jobs | CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    picked: list[Sample] = []
    mark = 0.0
    for s in samples:
        if s.elapsed_s >= mark:
            picked.append(s)
            mark = (s.elapsed_s // step_s + 1) * step_s
    if samples and picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    for s in picked:
        rows.append(
            f"| {s.elapsed_s / 60:.1f} | {s.fds} | {s.registry_conns} | {s.threads} | {s.rss_kib / 1024:.1f} | "
            f"{s.registry_bytes / 1024:.0f} | {s.wal_bytes / 1024:.0f} | {s.jobs} | {s.cpu_s:.1f} |"
        )
    return "\n".join(rows)


def plot(samples: Sequence[Sample], trends: Sequence[Trend], warmup_s: float, out: Path, title: str) -> None:
    import matplotlib  # optional: `make soak` installs it into the venv; the project does not depend on it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.elapsed_s / 60 for s in samples]
    by_metric = {t.metric: t for t in trends}
    panels: list[tuple[str, list[tuple[str, list[float]]], Trend | None]] = [
        (
            "open descriptors",
            [
                ("all", [s.fds for s in samples]),
                ("other than the registry's", [s.fds - s.registry_fds for s in samples]),
                ("SQLite connections", [s.registry_conns for s in samples]),
            ],
            by_metric["other_fds"],
        ),
        ("threads", [("threads", [s.threads for s in samples])], by_metric["threads"]),
        ("RSS (MiB)", [("RSS", [s.rss_kib / 1024 for s in samples])], by_metric["rss_mib"]),
        (
            "registry (KiB)",
            [("file", [s.registry_bytes / 1024 for s in samples]), ("WAL", [s.wal_bytes / 1024 for s in samples])],
            None,
        ),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 9), sharex=True)
    for ax, (label, lines, judged) in zip(axes, panels, strict=True):
        for name, values in lines:
            ax.plot(minutes, values, linewidth=0.8, label=name if len(lines) > 1 else None)
        ax.axvspan(0, warmup_s / 60, color="0.9", label="warm-up")
        if judged is not None and judged.slack is not None:
            ax.axhline(judged.first + judged.slack, color="tab:red", linestyle="--", linewidth=0.8, label="fail above")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("minutes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def report(args: argparse.Namespace, samples: Sequence[Sample], warmup_s: float, title: str) -> bool:
    """Print the verdict (and the plot); True when every judged metric is flat."""
    slack = Slack(
        fds=args.fd_slack, threads=args.thread_slack, rss_mib=args.rss_slack_mib, max_connections=args.max_connections
    )
    try:
        trends = judge(samples, warmup_s, slack)
    except ValueError as exc:
        print(f"soak: FAIL: {exc}")
        return False
    print_summary(trends, warmup_s, samples)
    if args.table_step_s:
        print(f"\nsamples every {args.table_step_s:g} s:\n{markdown_table(samples, args.table_step_s)}")
    if args.plot:
        plot(samples, trends, warmup_s, args.plot, title)
        print(f"plot: {args.plot}")
    return all(t.ok for t in trends)


# -- main -------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration-s", type=float, default=3600.0, help="how long the workload runs (default 3600)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="sampling period (default 5)")
    parser.add_argument("--warmup-s", type=float, help="ignored at the start (default: a fifth of the run, <= 300 s)")
    parser.add_argument(
        "--idle-gaps-s",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[12.0, 15.0, 31.0],
        help="idle gaps between rounds, cycled (default 12,15,31: longer than Trio's 10 s worker idle timeout)",
    )
    parser.add_argument("--sweep-s", type=float, help="PODCAST_JOB_SWEEP_SECONDS (default: the supervisor's, 30)")
    parser.add_argument("--fd-slack", type=float, default=Slack.fds, help="allowed growth of open descriptors")
    parser.add_argument("--thread-slack", type=float, default=Slack.threads, help="allowed growth of threads")
    parser.add_argument("--rss-slack-mib", type=float, default=Slack.rss_mib, help="allowed growth of RSS (MiB)")
    parser.add_argument(
        "--max-connections", type=float, default=Slack.max_connections, help="bound on open SQLite connections"
    )
    parser.add_argument("--csv", type=Path, help="samples file (default: soak-<time>.csv in the temp directory)")
    parser.add_argument("--plot", type=Path, help="write a PNG of the samples (needs matplotlib)")
    parser.add_argument("--table-step-s", type=float, default=0, help="also print a markdown table, a row every N s")
    parser.add_argument("--source", type=Path, help="run `python -m supervisor` from this checkout instead")
    parser.add_argument("--from-csv", type=Path, help="judge (and plot) a finished run's CSV; run nothing")
    parser.add_argument(
        "--exec-mode",
        choices=("subprocess", "docker"),
        default="subprocess",
        help="how jobs run (docker: needs scripts/docker-engine.sh up; jobs use the host network)",
    )
    parser.add_argument("--webhook", action="store_true", help="send every job event to a loopback receiver")
    parser.add_argument(
        "--misbehaving-clients",
        type=int,
        default=20,
        help="connections at a time that misuse HTTP beside the workload for the whole run (0: none; default 20)",
    )
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS_DIR, help="where the results JSON goes (default bench/results)"
    )
    parser.add_argument("--no-write", action="store_true", help="write no results file")
    args = parser.parse_args(argv)
    if args.duration_s <= 0 or args.sample_s <= 0:
        parser.error("--duration-s and --sample-s must be positive")
    if not args.idle_gaps_s or min(args.idle_gaps_s) < 0:
        parser.error("--idle-gaps-s needs non-negative numbers")
    if min(args.idle_gaps_s) <= TRIO_IDLE_TIMEOUT_S and args.from_csv is None:
        print(
            f"soak: note: an idle gap of {min(args.idle_gaps_s):g} s does not outlast Trio's {TRIO_IDLE_TIMEOUT_S:g} s "
            "worker idle timeout; that path (a connection per fresh thread) is exercised only by the longer gaps",
            file=sys.stderr,
        )
    return args


def results(
    args: argparse.Namespace,
    started: datetime,
    samples: Sequence[Sample],
    warmup_s: float,
    counts: Counts,
    deliveries: int | None,
    problems: Sequence[str],
    ok: bool,
    csv_path: Path,
    misbehaved: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The run as a results file: what ran, the workload's counts, each metric's trend and verdict, the samples."""
    slack = Slack(
        fds=args.fd_slack, threads=args.thread_slack, rss_mib=args.rss_slack_mib, max_connections=args.max_connections
    )
    try:
        trends = judge(samples, warmup_s, slack)
    except ValueError:
        trends = []
    last = samples[-1] if samples else None

    def rel(path: Path | None) -> str | None:
        if path is None:
            return None
        path = path.resolve()
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)

    return {
        "schema": SCHEMA,
        "kind": "soak",
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ended": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": "measured",
        "label": None,
        "machine": machine(),
        "versions": versions(),
        "revision": git_revision() if args.source is None else {"commit": "?", "supervisor": f"from {args.source}"},
        "args": {
            "duration_s": args.duration_s,
            "sample_s": args.sample_s,
            "warmup_s": warmup_s,
            "idle_gaps_s": args.idle_gaps_s,
            "sweep_s": args.sweep_s,
            "exec_mode": args.exec_mode,
            "webhook": args.webhook,
            "slack": asdict(slack),
        },
        "workload": {**{k: v for k, v in asdict(counts).items() if k != "errors"}, "errors": len(counts.errors)},
        "workload_errors": counts.errors[:10],
        "webhook_deliveries": deliveries,
        "misbehaving_connections": misbehaved or {},
        "trends": [
            {
                "metric": t.metric,
                "first": round(t.first, 3),
                "last": round(t.last, 3),
                "growth": round(t.growth, 3),
                "slack": t.slack,
                "limit": t.limit,
                "min": round(t.low, 3),
                "max": round(t.high, 3),
                "samples": t.samples,
                "verdict": "reported" if not t.judged else ("PASS" if t.ok else "FAIL"),
            }
            for t in trends
        ],
        "registry": {
            "bytes": last.registry_bytes if last else None,
            "rows": last.jobs if last else None,
            "wal_max_bytes": max((s.wal_bytes for s in samples), default=None),
        },
        "cpu_s": last.cpu_s if last else None,
        "problems": list(problems),
        "verdict": "PASS" if ok else "FAIL",
        "csv": rel(csv_path),
        "plot": rel(args.plot),
        "samples": {"columns": CSV_FIELDS, "rows": [list(asdict(s).values()) for s in samples]},
    }


def _misbehave_until(served: Served, at_once: int, stop: threading.Event, tally: dict[str, int]) -> None:
    """The misbehaving clients (ADR 0019), ``at_once`` connections at a time until ``stop``; the edge's timeouts are
    the server's defaults, which they hang up around."""
    from supervisor.api import HttpLimits

    limits = HttpLimits()
    timeouts = _misbehave.Timeouts(limits.keep_alive_timeout_s, limits.body_timeout_s, limits.response_timeout_s)
    port = int(served.base_url.rsplit(":", 1)[1])
    answer = httpx.post(
        f"{served.base_url}/api/jobs",
        json={"kind": "exit", "params": {"code": 0}},
        headers={"Authorization": f"Bearer {served.token}"},
        timeout=HTTP_TIMEOUT_S,
    )
    job_id = answer.json()["job_id"]
    # Not the queue's resume: it would lift the workload's own pause, which the workload checks.
    routes = [r for r in _misbehave.routes(job_id, {"kind": "exit", "params": {"code": 0}}) if "resume" not in r.path]
    tokens = [None, served.token, "wrong-token"]

    async def until_stopped() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: _misbehave.keep_misbehaving(
                    random.Random(52), port, routes, tokens, timeouts, tally, at_once=at_once
                )
            )
            await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(until_stopped)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_csv is not None:
        recorded = read_csv(args.from_csv)
        duration = recorded[-1].elapsed_s if recorded else 0.0
        warmup_s = default_warmup_s(duration) if args.warmup_s is None else args.warmup_s
        ok = report(args, recorded, warmup_s, f"soak {args.from_csv.name}")
        print(f"\nsoak: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1

    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run early through the same clean stop.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    warmup_s = default_warmup_s(args.duration_s) if args.warmup_s is None else args.warmup_s
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    deliveries: int | None = None
    csv_path: Path = args.csv or Path(tempfile.gettempdir()) / f"soak-{stamp}.csv"
    samples: list[Sample] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        receiver = WebhookReceiver() if args.webhook else None
        served = start_supervisor(
            Path(tmp), args.source, args.sweep_s, args.exec_mode, receiver.url if receiver else None
        )
        pid = served.process.pid
        print(
            f"soak: supervisor pid {pid} at {served.base_url}, {args.exec_mode} mode"
            f"{', webhooks on' if receiver else ''}, {args.duration_s:g} s, samples -> {csv_path}"
        )
        stop = threading.Event()
        workload = Workload(served.base_url, served.token, args.idle_gaps_s, stop)
        worker = threading.Thread(target=workload.run, name="soak-workload", daemon=True)
        misbehaved: dict[str, int] = {}
        troublemakers = threading.Thread(
            target=_misbehave_until, args=(served, args.misbehaving_clients, stop, misbehaved), daemon=True
        )
        t0 = time.monotonic()
        worker.start()
        if args.misbehaving_clients > 0:
            troublemakers.start()
        try:
            with csv_path.open("w", newline="") as fh:
                out = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
                out.writeheader()
                tick = 0
                while True:
                    elapsed = time.monotonic() - t0
                    try:
                        counts = workload.counts
                        sample = take_sample(pid, served.registry, elapsed, counts.jobs, counts.rounds)
                    except OSError:
                        problems.append(f"the supervisor died after {elapsed:.0f} s")
                        break
                    samples.append(sample)
                    out.writerow(asdict(sample))
                    fh.flush()
                    if served.process.poll() is not None:
                        problems.append(f"the supervisor exited ({served.process.returncode}) after {elapsed:.0f} s")
                        break
                    if elapsed >= args.duration_s:
                        break
                    tick += 1
                    # Samples on a fixed schedule (no drift); the sampler sleeps, the workload thread works.
                    stop.wait(max(0.0, t0 + min(tick * args.sample_s, args.duration_s) - time.monotonic()))
        except KeyboardInterrupt:
            problems.append("interrupted")
        finally:
            stop.set()
            worker.join(timeout=JOB_TIMEOUT_S + HTTP_TIMEOUT_S)
            if troublemakers.is_alive():
                troublemakers.join(timeout=HTTP_TIMEOUT_S)
            if served.process.poll() is None:
                wait_queue_idle(served)
            code = stop_supervisor(served)
            if code != 0 and not problems:
                problems.append(f"the supervisor exited {code} on SIGTERM")
            if problems:
                tail = served.log_path.read_text(errors="replace").splitlines()[-20:]
                print("soak: the supervisor's last log lines:\n" + "\n".join(tail), file=sys.stderr)
            if receiver is not None:
                receiver.close()
                deliveries = receiver.received[0]
                print(f"soak: webhook receiver got {receiver.received[0]} deliveries")
                if receiver.received[0] == 0 and not problems:
                    problems.append("webhooks were on and none was delivered")

    counts = workload.counts
    print(
        f"\nworkload: {counts.rounds} rounds, {counts.jobs} jobs ({counts.succeeded} succeeded, {counts.failed} failed "
        f"as planned), {counts.cancels} cancelled while running, {counts.heartbeats} heartbeats, "
        f"{counts.log_reads} log reads, {counts.listings} listings, {counts.pauses} pause/resume, "
        f"{counts.idle_gaps} idle gaps, {len(counts.errors)} errors"
    )
    if misbehaved:
        ways = ", ".join(f"{k} {v}" for k, v in sorted(misbehaved.items()))
        print(f"misbehaving connections: {sum(misbehaved.values())} ({ways})")
    for error in counts.errors[:10]:
        print(f"  {error}")
    if counts.errors:
        problems.append(f"{len(counts.errors)} workload errors")
    ok = report(args, samples, warmup_s, f"supervisor serve soak, {args.duration_s / 60:g} min, {stamp} UTC")
    for problem in problems:
        print(f"soak: FAIL: {problem}")
    ok = ok and not problems
    if not args.no_write:
        path = args.results_dir / results_name("soak", started)
        write_json(
            path, results(args, started, samples, warmup_s, counts, deliveries, problems, ok, csv_path, misbehaved)
        )
        print(f"soak: results {path}")
    print(f"\nsoak: {'PASS' if ok else 'FAIL'} (samples: {csv_path})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
