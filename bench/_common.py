"""What every benchmark script shares: a real ``supervisor serve`` in a temp dir, a lean HTTP load client, statistics,
the peers' binaries, and the machine's description.

Nothing here is a test: figures are printed, and kept as structured results (bench/results.py: figures with their
runs and units, tables, targets) in a results JSON file that bench/report.py renders; targets are PASS/MISS lines.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The structured results: the scenarios build these, the results file holds them, the markdown derives from them.
from results import (
    Column,
    Figure,
    Measure,
    Section,
    Table,
    Target,
    add_sections,
    default_path,
    run_header,
    verdict,
    write_json,
)

__all__ = ["Column", "Figure", "Measure", "Section", "Table", "Target", "verdict"]

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "bench"
# RQ (and py-spy) live in their own venv: they are the bench's tools, never the project's runtime dependencies.
BENCH_VENV = REPO / os.environ.get("BENCH_VENV", ".venv-bench")

# Every HTTP call of the bench is bounded; a wedged server fails the run instead of hanging it.
HTTP_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
RAW_REQUEST_TIMEOUT_S = 30.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0

# The kinds every scenario uses. ``noop`` is the fork/exec floor; ``nap`` sleeps; ``token_nap`` prints its job token
# (the load generator reads it back through the log route) and then becomes a plain ``sleep``.
KINDS_TOML = """\
[kinds.noop]
argv = ["/bin/true"]

[kinds.nap]
argv = ["/bin/sleep", "{seconds}"]
params = { seconds = "float" }

[kinds.token_nap]
argv = ["/bin/sh", "-c", "echo \\"$PODCAST_JOB_TOKEN\\"; exec /bin/sleep \\"$1\\"", "token_nap", "{seconds}"]
params = { seconds = "float" }
"""


# -- statistics ---------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a value that was observed, never an interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# -- processes and files ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: with the pid, a process's identity."""
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes().decode("ascii", "replace")
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive_as(pid: int, start_time: int | None) -> bool:
    """True while ``pid`` is still the recorded process (not a recycled number, not a zombie)."""
    if start_time is None or proc_start_time(pid) != start_time:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (``/proc/<pid>/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """CPU time every core of the machine has spent busy so far (``/proc/stat``: user, nice, system, irq, softirq;
    not idle, I/O wait, or steal, which is time the hypervisor gave to someone else)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def speed_probe() -> dict[str, float]:
    """Three small timings that tell two machines apart where it matters here, each the median of several tries:

    - ``python_ms``: a fixed piece of pure-Python work (what the supervisor, its shepherd and RQ's workers mostly do);
    - ``spawn_us``: start ``/bin/true`` and wait for it (what ``xargs`` mostly does);
    - ``handoff_us``: hand a value to another thread and get it back (a context switch each way: what a worker
      thread's hop and a woken process cost).

    A ratio against ``xargs`` or RQ moves from one machine to another when these move apart: a machine slow at
    Python and quick at spawning makes every Python tool look worse against ``xargs``.
    """
    import queue
    import threading

    def python_work() -> float:
        t0 = time.perf_counter()
        total, table = 0, {}
        for i in range(200_000):
            total += i * i % 7
            table[i % 1000] = i
        return (time.perf_counter() - t0) * 1e3

    def spawn() -> float:
        t0 = time.perf_counter()
        subprocess.run(["/bin/true"], check=True, timeout=30)
        return (time.perf_counter() - t0) * 1e6

    requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    answers: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        while (item := requests.get()) is not None:
            answers.put(item)

    worker = threading.Thread(target=echo, daemon=True)
    worker.start()

    def handoff() -> float:
        t0 = time.perf_counter()
        for i in range(200):
            requests.put(i)
            answers.get(timeout=30)
        return (time.perf_counter() - t0) / 200 * 1e6

    try:
        return {
            "python_ms": statistics.median(python_work() for _ in range(7)),
            "spawn_us": statistics.median(spawn() for _ in range(101)),
            "handoff_us": statistics.median(handoff() for _ in range(7)),
        }
    finally:
        requests.put(None)
        worker.join(timeout=30)


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, comm) for every process visible now."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        table[int(entry.name)] = (ppid, comm)
    return table


def descendants(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def iso_ts(text: str) -> float:
    """An ISO-8601 UTC timestamp (the registry's and the shepherd's) as epoch seconds."""
    return datetime.fromisoformat(text).timestamp()


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{prefix}-") as tmp:
        yield Path(tmp)


# -- the supervisor under test ------------------------------------------------------------------------


@dataclass
class JobState:
    """What the shepherd saw of one job: its start and its exit, on the shepherd's clock (from its trace)."""

    job_id: str
    pid: int
    start_time: int | None
    started_at: float
    shepherd_pid: int | None
    shepherd_start_time: int | None
    ended_at: float | None = None


@dataclass
class Supervisor:
    """A real ``supervisor serve`` on a loopback port 0, its data dir in ``root``; the URL read from its log."""

    root: Path
    max_concurrent: int
    extra_env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / ".viewer" / "jobs"

    @property
    def registry_path(self) -> Path:
        return self.data_dir / ".viewer" / "jobs.sqlite3"

    @property
    def stderr_path(self) -> Path:
        return self.root / "supervisor.stderr"

    @property
    def trace_path(self) -> Path:
        """The shepherd's trace (PODCAST_JOB_SHEPHERD_TRACE_FILE): on tmpfs where there is one, like the shepherd's
        own records, so that tracing adds no journal work the measured supervisor would not do."""
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() else self.root
        return base / f"bench-shepherd-trace-{self.root.name}.ndjson"

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    def start(self) -> Supervisor:
        kinds = self.root / "kinds.toml"
        kinds.write_text(KINDS_TOML)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
        env.update(
            PODCAST_JOB_DATA_DIR=str(self.data_dir),
            PODCAST_JOB_BIND="127.0.0.1:0",
            PODCAST_JOB_MAX_CONCURRENT=str(self.max_concurrent),
            PODCAST_JOB_KINDS_FILE=str(kinds),
            PODCAST_JOB_SHEPHERD_TRACE_FILE=str(self.trace_path),
        )
        env.update(self.extra_env)
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervisor", "serve"],
                env=env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.url:
            for line in self.stderr_path.read_text(errors="replace").splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "supervisor_started":
                    self.url = str(event["url"])
            if self.url:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.stderr_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"supervisor serve did not start (exit {self.proc.returncode}):\n{tail}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """SIGTERM the supervisor, then end the jobs it leaves running (by design) and wait for its shepherd."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        states = self.job_states()
        for state in states:
            if state.ended_at is None and alive_as(state.pid, state.start_time):
                try:
                    os.killpg(state.pid, signal.SIGKILL)  # the job leads its own session and group
                except ProcessLookupError:
                    pass
        shepherds = {(s.shepherd_pid, s.shepherd_start_time) for s in states if s.shepherd_pid is not None}
        for pid, start in shepherds:
            assert pid is not None
            try:
                wait_until(lambda p=pid, s=start: not alive_as(p, s), STOP_TIMEOUT_S, "the shepherd to exit")
            except TimeoutError:
                if alive_as(pid, start):
                    os.kill(pid, signal.SIGKILL)
        self.trace_path.unlink(missing_ok=True)

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def rss(self) -> int | None:
        return rss_bytes(self.proc.pid) if self.proc is not None else None

    def job_states(self) -> list[JobState]:
        """Every job the shepherd started, and when it ended, from the shepherd's trace.

        (Its state records are no source: they are dropped once a job's row is final.)
        """
        states: dict[str, JobState] = {}
        try:
            lines = self.trace_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written as we read
            job_id = str(event.get("job_id"))
            if event.get("ev") == "started":
                shepherd = event.get("shepherd") or {}
                states[job_id] = JobState(
                    job_id=job_id,
                    pid=int(event["pid"]),
                    start_time=event.get("start_time"),
                    started_at=iso_ts(event["started_at"]),
                    shepherd_pid=shepherd.get("pid"),
                    shepherd_start_time=shepherd.get("start_time"),
                )
            elif event.get("ev") == "exited" and job_id in states:
                states[job_id].ended_at = iso_ts(event["ended_at"])
        return list(states.values())

    def log_events(self) -> dict[str, dict[str, float]]:
        """job id -> {event: epoch seconds} from the supervisor's JSON log: ``queued->running`` (promoted),
        ``running->succeeded`` (finalized), ``job_spawned``... — the supervisor's clock, microseconds."""
        out: dict[str, dict[str, float]] = {}
        for line in self.stderr_path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or not event.get("job_id") or "timestamp" not in event:
                continue
            name = str(event.get("event"))
            if name == "job_transition":
                name = f"{event.get('from')}->{event.get('to')}"
            out.setdefault(str(event["job_id"]), {})[name] = iso_ts(str(event["timestamp"]).replace("Z", "+00:00"))
        return out

    def registry_query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Read the supervisor's registry directly (read-only; WAL lets a reader run beside the writer)."""
        conn = sqlite3.connect(f"file:{self.registry_path}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def status_counts(self) -> dict[str, int]:
        return {str(s): int(n) for s, n in self.registry_query("SELECT status, count(*) FROM jobs GROUP BY status")}


async def has_batch_route(client: httpx.AsyncClient) -> bool:
    """Whether this server offers ``POST /api/jobs/batch`` (its OpenAPI document says so)."""
    answer = await client.get("/api/openapi.json", timeout=HTTP_TIMEOUT)
    answer.raise_for_status()
    return "/api/jobs/batch" in answer.json().get("paths", {})


BATCH_FALLBACK_NOTE = (
    "this server has no POST /api/jobs/batch: each batch was sent as concurrent single POSTs "
    "(8 connections) — rebase onto the batch route and run again"
)


async def enqueue_jobs(
    client: httpx.AsyncClient, jobs: Sequence[dict[str, Any]], *, batch_size: int | None, batch_route: bool
) -> list[str]:
    """Enqueue ``jobs`` ({"kind", "params"}): one POST each (``batch_size`` None), or by batches.

    Returns the job ids in order. Without the batch route, a batch is sent as concurrent single POSTs.
    """
    ids: list[str] = []
    if batch_size is None:
        for job in jobs:
            answer = await client.post("/api/jobs", json=job, timeout=HTTP_TIMEOUT)
            answer.raise_for_status()
            ids.append(answer.json()["job_id"])
        return ids
    for start in range(0, len(jobs), batch_size):
        chunk = list(jobs[start : start + batch_size])
        if batch_route:
            answer = await client.post("/api/jobs/batch", json={"jobs": chunk}, timeout=HTTP_TIMEOUT)
            answer.raise_for_status()
            ids.extend(j["job_id"] for j in answer.json()["jobs"])
            continue
        got: list[str | None] = [None] * len(chunk)
        limiter = trio.CapacityLimiter(8)

        async def post(i: int, job: dict[str, Any], got: list[str | None] = got, limiter: Any = limiter) -> None:
            async with limiter:
                answer = await client.post("/api/jobs", json=job, timeout=HTTP_TIMEOUT)
                answer.raise_for_status()
                got[i] = answer.json()["job_id"]

        async with trio.open_nursery() as nursery:
            for i, job in enumerate(chunk):
                nursery.start_soon(post, i, job)
        ids.extend(str(g) for g in got)
    return ids


async def wait_idle(client: httpx.AsyncClient, timeout_s: float, interval_s: float = 0.05) -> None:
    """Until nothing is queued or running (``GET /api/queue``)."""
    with trio.fail_after(timeout_s):
        while True:
            answer = await client.get("/api/queue", timeout=HTTP_TIMEOUT)
            answer.raise_for_status()
            state = answer.json()
            if state["queued"] == 0 and state["running"] == 0:
                return
            await trio.sleep(interval_s)


async def read_tokens(client: httpx.AsyncClient, ids: Sequence[str], timeout_s: float) -> list[tuple[str, str]]:
    """(job id, job token) of ``token_nap`` jobs: each prints its token as its first line."""
    tokens: list[tuple[str, str]] = []
    with trio.fail_after(timeout_s):
        for job_id in ids:
            while True:
                answer = await client.get(f"/api/jobs/{job_id}/log", timeout=HTTP_TIMEOUT)
                answer.raise_for_status()
                if answer.text.endswith("\n"):
                    tokens.append((job_id, answer.text.strip()))
                    break
                await trio.sleep(0.02)
    return tokens


async def wait_running(client: httpx.AsyncClient, n: int, timeout_s: float, interval_s: float = 0.05) -> None:
    with trio.fail_after(timeout_s):
        while True:
            answer = await client.get("/api/queue", timeout=HTTP_TIMEOUT)
            answer.raise_for_status()
            if answer.json()["running"] >= n:
                return
            await trio.sleep(interval_s)


# -- a lean HTTP/1.1 client for load generation -------------------------------------------------------


class RawHttp:
    """One keep-alive HTTP/1.1 connection, hand-formatted requests: a load generator that costs the shared CPU far
    less per request than a full client, so the figure is the server's, not the generator's."""

    def __init__(self, stream: trio.SocketStream, host: str, port: int) -> None:
        self._stream = stream
        self._address = (host, port)
        self._host = f"{host}:{port}"
        self._buf = b""
        self._must_reconnect = False  # the last answer said Connection: close (hypercorn: every 1,000th request)

    @classmethod
    async def connect(cls, host: str, port: int) -> RawHttp:
        with trio.fail_after(RAW_REQUEST_TIMEOUT_S):
            stream = await trio.open_tcp_stream(host, port)
        return cls(stream, host, port)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def request(self, method: str, path: str, body: bytes = b"", token: str | None = None) -> tuple[int, bytes]:
        if self._must_reconnect:  # as any HTTP/1.1 client does after a Connection: close answer
            await self._stream.aclose()
            with trio.fail_after(RAW_REQUEST_TIMEOUT_S):
                self._stream = await trio.open_tcp_stream(*self._address)
            self._buf, self._must_reconnect = b"", False
        head = f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\nContent-Length: {len(body)}\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        if token is not None:
            head += f"Authorization: Bearer {token}\r\n"
        with trio.fail_after(RAW_REQUEST_TIMEOUT_S):
            await self._stream.send_all(head.encode() + b"\r\n" + body)
            while b"\r\n\r\n" not in self._buf:
                await self._fill()
            header, _, rest = self._buf.partition(b"\r\n\r\n")
            lines = header.split(b"\r\n")
            status = int(lines[0].split()[1])
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value.strip())
                elif name == b"connection" and b"close" in value.lower():
                    self._must_reconnect = True
                elif name == b"transfer-encoding":
                    raise RuntimeError("chunked responses are not supported by this load client")
            self._buf = rest
            while len(self._buf) < length:
                await self._fill()
            payload, self._buf = self._buf[:length], self._buf[length:]
        return status, payload

    async def _fill(self) -> None:
        data = await self._stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buf += data


# -- peers and the machine ----------------------------------------------------------------------------


def which(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def task_spooler() -> str | None:
    """task-spooler's binary: ``tsp`` (Debian), or ``ts`` where it is not moreutils' timestamp filter."""
    tsp = which("tsp")
    if tsp is not None:
        return tsp
    ts = which("ts")
    if ts is not None and "task spooler" in _first_line([ts, "-V"]).lower():
        return ts
    return None


def bench_python() -> Path | None:
    """The bench venv's interpreter when it has RQ, else None."""
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import rq, redis"], capture_output=True, timeout=60, check=False)
    return python if probe.returncode == 0 else None


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else "?"


def cpu_model() -> str:
    try:
        done = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30, check=False)
        for line in done.stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return platform.processor() or "unknown CPU"


def filesystem_of(path: Path) -> str:
    try:
        done = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, timeout=30, check=False)
        return done.stdout.splitlines()[1].split()[1]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "?"


def memory_gib() -> float | None:
    """MemTotal of /proc/meminfo, GiB."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine() -> dict[str, Any]:
    """What the figures were measured on: the CPU, nproc, the kernel, the memory and the temp dir's filesystem."""
    nproc = _first_line(["nproc"])
    return {
        "cpu": cpu_model(),
        "nproc": int(nproc) if nproc.isdigit() else nproc,
        "kernel": platform.release(),
        "memory_gib": memory_gib(),
        "tmp_filesystem": filesystem_of(Path(tempfile.gettempdir())),
    }


def versions() -> dict[str, str]:
    """Python, the supervisor and the libraries whose code is on the measured paths (installed versions)."""
    from importlib.metadata import PackageNotFoundError, version

    def pkg(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    out = {"python": platform.python_version(), "supervisor": pkg("podcast-job-supervisor")}
    for name in ("trio", "hypercorn", "quart", "quart-trio", "h11", "httpx", "docker"):
        out[name] = pkg(name)
    out["sqlite"] = sqlite3.sqlite_version
    return out


def peers() -> dict[str, str]:
    """The versions of the tools the supervisor is measured against ("absent" when not installed)."""
    info = {"xargs": _first_line(["xargs", "--version"])}
    tsp = task_spooler()
    info["task-spooler"] = _first_line([tsp, "-V"]) if tsp else "absent"
    parallel = which("parallel")
    info["parallel"] = _first_line([parallel, "--version"]) if parallel else "absent"
    redis = which("redis-server")
    info["redis-server"] = _first_line([redis, "--version"]) if redis else "absent"
    python = bench_python()
    if python is not None:
        info["rq"] = _first_line([str(python), "-c", "import rq, redis; print(rq.__version__, redis.__version__)"])
        info["rq"] = "rq {} · redis-py {}".format(*info["rq"].split()) if len(info["rq"].split()) == 2 else info["rq"]
    else:
        info["rq"] = "absent"
    return info


def build_revision(python: str) -> str:
    """The short commit of the checkout whose venv ``python`` is (``<tree>/.venv/bin/python``): a side-by-side
    run's other build."""
    tree = Path(python).absolute().parents[2]
    git = ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"]
    out = subprocess.run(git, capture_output=True, text=True, timeout=30, check=False)
    return out.stdout.strip() or "?"


def child_figures(python: str, script: str, *args: str) -> dict[str, float]:
    """Run ``script --child *args`` under another build's interpreter (``python``: its venv's) and return the figures
    it prints as its last line (JSON). Run from the temporary directory: never this tree's supervisor for the other
    build."""
    done = subprocess.run(
        [python, str(Path(script).resolve()), "--child", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise SystemExit(f"{python}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def write_side_by_side(kind: str, label: str, builds: dict[str, str], what: str, **data: Any) -> Path:
    """A side-by-side run's results (``bench/results/<UTC date>-<kind>-<label>.json``): its header, what was
    measured, each build's revision (``builds``: name -> the build's interpreter), ``data``, and this checkout's."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%MZ")
    out = BENCH_DIR / "results" / f"{stamp}-{kind}-{label}.json"
    revisions = {name: build_revision(python) for name, python in builds.items()}
    write_json(out, {**run_header(kind), "what": what, "revisions": revisions, **data, "revision": git_revision()})
    print(f"wrote {out}")
    return out


def git_revision() -> dict[str, Any]:
    """The code measured: the checkout's commit, the last commit that touched supervisor/, and whether supervisor/
    has changes not committed (then the figures are of no commit)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip()

    last = git("log", "-1", "--format=%h %s", "--", "supervisor")
    if len(last) > 90:
        last = last[:90].rsplit(" ", 1)[0] + " …"
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "?",
        "supervisor": last or "?",
        "modified": bool(git("status", "--porcelain", "--untracked-files=no", "--", "supervisor")),
    }


def progress(text: str) -> None:
    print(f"  … {text}", file=sys.stderr, flush=True)


def save_sections(
    kind: str, sections: Sequence[Section], *, results: Path | None, smoke: bool, no_write: bool
) -> Path | None:
    """Add a script's scenarios to ``results`` (``make bench`` names one file for every script), else to a new dated
    file of their own; none for a smoke run or ``--no-write``. The path written, printed too."""
    path = results or (None if smoke or no_write else default_path(kind))
    if path is None:
        return None
    header = run_header(kind, label=None, smoke=smoke, runs=1)
    header.update(machine=machine(), versions=versions(), revision=git_revision())
    add_sections(path, sections, header)
    print(f"results: {path}")
    return path
