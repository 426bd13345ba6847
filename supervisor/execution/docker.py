"""Docker mode: each job is a container on a Docker engine, found again by its labels.

A job's container is created (with the labels ``ps.job_id``, ``ps.boot_id``, ``ps.kind``, ``ps.attempt``) before it
is started, so a boot that dies before it records the container id leaves a labelled container behind, never an
unknown one (INV-IDENTITY-BEFORE-PROGRAM): the next boot finds it by label and adopts it. The row records the
container id; no pid is ever evidence in this mode. No container of the row's attempt, or one only created (never
started): the job never ran, and goes back to the queue.

Containers are not removed automatically: the engine keeps each one's exit code after it ends, which is how a job
that ends while no supervisor runs is still finalized with its true outcome at the next boot (INV-TRUE-OUTCOME).
Once the exit code is read, the container's output is copied into the job's log (its last ``log_max_bytes``), the
row finalized, and only then is the container removed.

Liveness is tri-state and comes from the engine: running → ALIVE; exited → DEAD with its exit code; no container →
DEAD (``orphan_reconciled_no_container``); an engine that is unreachable, errs or times out → UNKNOWN, and the row
keeps its slot (INV-UNKNOWN-KEEPS-SLOT).

Engine trouble (a call refused, timed out, or answered with a server error) is one episode for the whole executor
(``EngineHealth``): one WARNING when the first call fails, one INFO when the engine answers again, and ``fault()``
for the health route meanwhile. While it lasts no job is started (``unavailable()`` probes the engine's container API
before each promotion), and a start the engine could not make, of which nothing runs, raises ``ExecutorUnavailable``:
the job goes back to the queue, its start not counted, instead of failing.

Exit codes: a container's exit code is what its init process (``init=True``: docker-init) reports, and a job killed
by signal N is reported as 128 + N, exactly as a program that exits 128 + N. This mode records the number the engine
gives (``failed/exit_code_137``) and never reads it as a signal: the engine cannot tell the two apart, and a guess
must not become an outcome. The one signal the engine does name is the kernel's OOM killer (``State.OOMKilled``):
that job ends ``failed/killed_out_of_memory``.

The SDK is blocking: every call runs in a worker thread (``trio.to_thread.run_sync``) with a client timeout, under a
capacity limiter; waits for an exit are slices of ``WAIT_SLICE_S``, so no thread is held longer than that.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker
import requests
import trio
import urllib3
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnection, UnixHTTPConnectionPool
from docker.types import LogConfig

from ..domain import (
    Config,
    ExecutorUnavailable,
    IdentityRecord,
    Job,
    SpawnError,
    StartOutcomeUnknown,
    SupervisorError,
    utc_now,
)
from ..observe import get_logger
from ._base import (
    Evidence,
    Executor,
    ExecutorFault,
    ExitStatus,
    JobHandle,
    Launch,
    Leftover,
    Liveness,
    ProofOfEnd,
    check_log_writable,
)
from .shepherd import JOB_OOM_SCORE_ADJ

log = get_logger()

T = TypeVar("T")

# The engine API version this mode speaks (Docker 20.10 and later). Pinned, so that creating a client does no I/O:
# with "auto" the SDK asks the engine at construction, and an unreachable engine would fail the supervisor's start.
API_VERSION = "1.41"
API_TIMEOUT_S = 10.0  # every call but a wait slice (and a stop, which adds its grace period); docker_timeout_s
WAIT_SLICE_S = 10.0  # one blocking wait for a container's exit; the monitor then asks again
RETRY_MIN_S = 0.5  # an unreachable engine is asked again after this, doubling up to RETRY_MAX_S
RETRY_MAX_S = 5.0
MAX_CALLS = 16  # SDK calls at once (a wait slice holds its own limiter)
# A followed container's output is copied into its log at most this often (and only while someone reads it).
LIVE_LOG_EVERY_S = 0.5
MAX_WAITS = 256  # wait slices at once (one per watched job; beyond it a job waits its turn for a thread)
# Engine trouble ends with a start made, or with a call answered once no call has failed for this long: longer than
# any retry's wait (5 s for a job's calls, 10 s for the drainer's), so that an engine answering some calls and failing
# others (its containers listed, never made) is one episode, not a WARNING and an INFO every few seconds.
RECOVERED_AFTER_S = 15.0

LABEL_JOB = "ps.job_id"
LABEL_BOOT = "ps.boot_id"
LABEL_KIND = "ps.kind"
LABEL_ATTEMPT = "ps.attempt"  # which start of the job (none on containers made before resubmission: the first)
ORPHAN_NO_CONTAINER = "orphan_reconciled_no_container"
ALIVE_STATES = frozenset({"running", "paused", "restarting"})
ENDED_STATES = frozenset({"exited", "dead"})

# What an unreachable, failing or slow engine raises: the SDK's own errors, and raw requests errors (with a pinned
# API version the SDK lets them through unwrapped).
ENGINE_ERRORS = (DockerException, requests.exceptions.RequestException)


def describe_error(exc: BaseException) -> str:
    """One line naming what went wrong with the engine."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def engine_trouble(exc: BaseException) -> bool:
    """Whether an engine error says the engine does not work now (refused, timed out, a server error), rather than
    that it answered this one call with a refusal of its own (a 4xx: no such image, a name taken, no such container)."""
    if isinstance(exc, APIError):
        return exc.status_code is None or exc.status_code >= HTTP_SERVER_ERROR
    return isinstance(exc, ENGINE_ERRORS)


def _never_reached(exc: BaseException) -> bool:
    """The request provably never reached the engine: its socket refused the connection, or was not there."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if id(item) in seen or not isinstance(item, BaseException):
            continue
        seen.add(id(item))
        if isinstance(item, ConnectionRefusedError | FileNotFoundError | urllib3.exceptions.NewConnectionError):
            return True
        todo.extend([*item.args, item.__cause__, item.__context__])
    return False


class EngineHealth:
    """Whether the engine answers now, whichever part of the executor asked it last (ADR 0005 §8).

    One WARNING (``docker_engine_unavailable``) when a call first fails with engine trouble, one INFO
    (``docker_engine_reachable``) when it is over: an outage is one episode, not a line per probe, per sweep or per
    job. It is over when a start is made, or when a call is answered after ``RECOVERED_AFTER_S`` without a failure:
    an engine may answer some calls while it fails others (a ping, a list), and a WARNING and an INFO at each of its
    answers would be a line per probe again. Thread-safe: the evidence is gathered in a worker thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fault: ExecutorFault | None = None
        self._last_failure = -math.inf  # time.monotonic(): the evidence's thread has no Trio clock

    def failed(self, exc: BaseException, *, call: str) -> None:
        reason = describe_error(exc)
        with self._lock:
            first = self.fault is None
            since = utc_now() if self.fault is None else self.fault.since
            count = 1 if self.fault is None else self.fault.failed_calls + 1
            self.fault = ExecutorFault(since, reason, count)
            self._last_failure = time.monotonic()
        if first:
            log.warning("docker_engine_unavailable", call=call, error=reason, liveness="unknown", starts="held")

    def answered(self, *, start: bool = False) -> None:
        with self._lock:
            fault = self.fault
            if fault is None or (not start and time.monotonic() - self._last_failure < RECOVERED_AFTER_S):
                return
            self.fault = None
        down_s = (utc_now() - fault.since).total_seconds()
        log.info("docker_engine_reachable", failed_calls=fault.failed_calls, down_s=round(down_s, 3))

    def judge(self, exc: BaseException, *, call: str) -> None:
        """After a failed call: engine trouble, or an answer (a 4xx is the engine working)."""
        if engine_trouble(exc):
            self.failed(exc, call=call)
        else:
            self.answered()


class _ClosingUnixConnection(UnixHTTPConnection):  # type: ignore[misc]
    """The SDK's unix-socket connection leaves its socket open when ``connect`` fails (the engine is down): it is
    then closed by the garbage collector, at any time, with a ResourceWarning. This one closes it at once."""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_socket)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _ClosingUnixPool(UnixHTTPConnectionPool):  # type: ignore[misc]
    def _new_conn(self) -> _ClosingUnixConnection:
        return _ClosingUnixConnection(self.base_url, self.socket_path, self.timeout)


class _ClosingUnixAdapter(UnixHTTPAdapter):  # type: ignore[misc]
    def get_connection(self, url: str, proxies: Any = None) -> _ClosingUnixPool:
        with self.pools.lock:
            pool = self.pools.get(url)
            if pool is None:
                pool = _ClosingUnixPool(url, self.socket_path, self.timeout, maxsize=self.max_pool_size)
                self.pools[url] = pool
            return pool


def make_client(*, timeout: float = API_TIMEOUT_S, max_pool_size: int = MAX_CALLS + MAX_WAITS) -> docker.APIClient:
    """A low-level client for the engine named by ``DOCKER_HOST`` (default: the local unix socket). No I/O.

    ``max_pool_size``: the connections kept for reuse; by default as many as the executor's threads can hold at once.
    A smaller pool still opens one per concurrent call, then closes what it cannot keep, with a urllib3 WARNING
    ("connection pool is full") per connection: with more jobs watched than it keeps, every wait slice did."""
    client = docker.APIClient(
        version=API_VERSION, timeout=timeout, max_pool_size=max_pool_size, **docker.utils.kwargs_from_env()
    )
    current = client.adapters.get("http+docker://")
    if isinstance(current, UnixHTTPAdapter):
        client.mount(
            "http+docker://",
            _ClosingUnixAdapter(f"http+unix://{current.socket_path}", timeout, max_pool_size=max_pool_size),
        )
        current.close()
    return client


RECORD_KIND = "container"
HTTP_CONFLICT = 409
HTTP_SERVER_ERROR = 500


def container_name(job_id: str, attempt: int) -> str:
    """A job's container name: ``ps-job-<id>`` for its first attempt, ``ps-job-<id>-<n>`` for a resubmission's
    (the earlier one may not be removed yet, and a name is unique on the engine)."""
    return f"ps-job-{job_id}" if attempt <= 1 else f"ps-job-{job_id}-{attempt}"


def container_record(container_id: str) -> IdentityRecord:
    """A row's identity in this mode: the container's id (what the API shows as ``container_id``)."""
    return IdentityRecord(RECORD_KIND, {"container_id": container_id})


def container_id_of(job: Job) -> str | None:
    """The container id the row records; None when it records none (or another executor's identity)."""
    record = job.identity
    if record is None or record.kind != RECORD_KIND:
        return None
    value = record.fields.get("container_id")
    return value if isinstance(value, str) else None


@dataclass
class ContainerHandle(JobHandle):
    """A job's container: its id, and where its output goes when it ends."""

    job_id: str
    container_id: str
    log: Path
    log_max_bytes: int
    collected: bool = False

    @property
    def record(self) -> IdentityRecord:
        return container_record(self.container_id)

    def log_fields(self) -> dict[str, object]:
        return {"container_id": self.container_id[:12]}


class _Outage:
    """One job's call asked again while the engine does not answer: after 0.5 s, doubling to 5 s. The episode itself
    is said once by ``EngineHealth``; each job says it only at DEBUG (its first failure of the episode)."""

    def __init__(self, event: str, **fields: object) -> None:
        self._event = event
        self._fields = fields
        self.failing = False
        self.delay = RETRY_MIN_S

    def failed(self, exc: BaseException) -> float:
        if not self.failing:
            log.debug(self._event, **self._fields, error=describe_error(exc), liveness="unknown")
            self.failing = True
        delay, self.delay = self.delay, min(self.delay * 2, RETRY_MAX_S)
        return delay

    def recovered(self) -> None:
        self.failing = False
        self.delay = RETRY_MIN_S


class LiveLogs:
    """A followed container's output, copied into its log while the job runs (``refresh``, at most every
    ``LIVE_LOG_EVERY_S`` and only while someone reads it), and the end's copy (``DockerExecutor.collect``), taking
    turns per job (``turn``) so that no live append lands after the end's copy. The end's copy stays the record: past
    the cap it keeps the newest output, where the live copy stopped at the cap."""

    def __init__(self, client: docker.APIClient, log_max_bytes: int) -> None:
        self.client = client
        self.log_max_bytes = log_max_bytes
        self._turns: dict[str, trio.Lock] = {}
        self._copied_at: dict[str, float] = {}

    def turn(self, job_id: str) -> trio.Lock:
        return self._turns.setdefault(job_id, trio.Lock())

    def forget(self, job_id: str) -> None:
        self._turns.pop(job_id, None)
        self._copied_at.pop(job_id, None)

    async def refresh(self, job: Job, call: Callable[[Callable[[], None]], Awaitable[None]]) -> None:
        """``call``: how the executor runs a blocking engine call (a worker thread, bounded). An engine that does not
        answer leaves the log as it is: no fault of the job's, and the end's copy comes anyway."""
        container_id = container_id_of(job)
        if container_id is None or job.log_path is None:
            return
        async with self.turn(job.job_id):
            now = trio.current_time()
            if now - self._copied_at.get(job.job_id, -math.inf) < LIVE_LOG_EVERY_S:
                return
            self._copied_at[job.job_id] = now
            path = Path(job.log_path)
            with contextlib.suppress(NotFound, OSError, *ENGINE_ERRORS):
                await call(lambda: self._append(container_id, path))

    def _append(self, container_id: str, path: Path) -> None:
        """What the container printed past the log's size, up to the cap (blocking). The engine's log is the same
        bytes in the same order until it rotates, past the cap: the live copy stops at the cap."""
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        # Only while it runs: once it stopped, the end's copy (in its turn) is the log, never appended to.
        if size >= self.log_max_bytes or not self.client.inspect_container(container_id)["State"]["Running"]:
            return
        output = self.client.logs(container_id, stdout=True, stderr=True, stream=False)
        if len(output) > size:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as fh:
                fh.write(output[size : self.log_max_bytes])


class DockerExecutor(Executor):
    """Jobs as containers of ``image`` on the engine, with the data volume mounted at the supervisor's data dir."""

    mode = "docker"
    orphan_reason = ORPHAN_NO_CONTAINER

    def __init__(
        self,
        *,
        image: str,
        data_volume: str,
        log_dir: Path,
        log_max_bytes: int,
        network: str | None = None,
        client: docker.APIClient | None = None,
        timeout_s: float = API_TIMEOUT_S,
    ) -> None:
        self.python = "python3"  # the image's interpreter, on its PATH
        self.image = image
        self.network = network
        self.data_volume = data_volume
        self._log_dir = log_dir
        self.log_max_bytes = log_max_bytes
        self.client = client if client is not None else make_client(timeout=timeout_s)
        self.health = EngineHealth()
        self._calls = trio.CapacityLimiter(MAX_CALLS)
        # One wait slice per watched job at most; slices end every WAIT_SLICE_S, so a job beyond the limit waits its
        # turn instead of a thread.
        self._waits = trio.CapacityLimiter(MAX_WAITS)
        # Jobs whose start runs in a worker thread now: evidence says UNKNOWN for them, never "no container". The
        # thread removes its job itself when it ends, even after its caller was cancelled (an SDK call is abandoned,
        # not stopped: it may still make and start the container).
        self._starting: set[str] = set()
        self._reader = ContainerReader(self.client, self.health, log_dir, log_max_bytes)
        self._live = LiveLogs(self.client, log_max_bytes)

    @classmethod
    def from_config(cls, config: Config) -> DockerExecutor:
        data_dir = config.data_dir.resolve()
        return cls(
            image=config.docker_image,
            network=config.docker_network,
            # Default: the supervisor's own data dir, bind-mounted (a supervisor running on the host). A supervisor
            # in a container names the volume it has at its data dir instead (compose does).
            data_volume=config.docker_data_volume or str(data_dir),
            log_dir=config.jobs_log_dir.resolve(),
            log_max_bytes=config.log_max_bytes,
            timeout_s=config.docker_timeout_s,
        )

    async def _call(
        self, fn: Callable[[], T], *, call: str, limiter: trio.CapacityLimiter | None = None, report: bool = True
    ) -> T:
        """A blocking SDK call in a worker thread, bounded by the client's timeout; its outcome goes to ``health``
        (``report``) as engine trouble or an answer."""
        try:
            # abandon_on_cancel: a shutdown never waits on the engine; the call ends by its own client timeout.
            result = await trio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=limiter or self._calls)
        except ENGINE_ERRORS as exc:
            if report:
                self.health.judge(exc, call=call)
            raise
        if report:
            self.health.answered()
        return result

    def fault(self) -> ExecutorFault | None:
        return self.health.fault

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self.client.close)

    # -- start ----------------------------------------------------------------------------------------

    async def unavailable(self) -> str | None:
        # The probe is the container API itself, not /_ping: an engine whose daemon answers a ping while its
        # containers cannot be listed (or made) must hold the queue too.
        try:
            await self._call(self._probe, call="probe")
        except ENGINE_ERRORS as exc:
            return f"the Docker engine does not answer: {describe_error(exc)}"
        return None

    def _probe(self) -> None:
        self.client.containers(limit=1, filters={"label": LABEL_JOB})

    async def start(self, launch: Launch) -> ContainerHandle:
        def create_and_start() -> str:
            try:
                return self._create_and_start(launch)
            finally:
                self._starting.discard(launch.job_id)

        self._starting.add(launch.job_id)
        try:
            container_id = await self._call(create_and_start, call="start", report=False)
        except (ExecutorUnavailable, StartOutcomeUnknown) as exc:
            self.health.failed(exc.__cause__ or exc, call="start")
            raise
        except SpawnError:
            self.health.answered(start=True)  # the engine answered: this job cannot start (a missing image, say)
            raise
        self.health.answered(start=True)
        return ContainerHandle(launch.job_id, container_id, launch.log, launch.log_max_bytes)

    def _create_and_start(self, launch: Launch) -> str:
        # INV-NO-START-WITHOUT-LOG: the output is copied into the log at the end; a log that cannot be written
        # there would lose it, so the job is not started (spawn_failed, naming the path).
        check_log_writable(launch.log)
        api = self.client
        # The engine's own log of the container is bounded too: a json-file rotated at the cap, two files kept. It
        # keeps the newest output (a rotation drops the oldest file), so that is what the job's log gets.
        host_config = api.create_host_config(
            init=True,  # docker-init as PID 1: forwards SIGTERM to the job and reaps what it leaves
            binds={self.data_volume: {"bind": str(launch.data_dir), "mode": "rw"}},
            network_mode=self.network,
            log_config=LogConfig(type="json-file", config={"max-size": str(launch.log_max_bytes), "max-file": "2"}),
            oom_score_adj=JOB_OOM_SCORE_ADJ,  # the job, never the engine or the supervisor, is the OOM killer's pick
            # The kind's memory_max_mb, swap included: past it the kernel kills the job (killed_out_of_memory).
            **(
                {"mem_limit": f"{launch.memory_max_mb}m", "memswap_limit": f"{launch.memory_max_mb}m"}
                if launch.memory_max_mb is not None
                else {}
            ),
        )
        labels = {LABEL_JOB: launch.job_id, LABEL_BOOT: launch.boot_id, LABEL_KIND: launch.kind}
        labels[LABEL_ATTEMPT] = str(launch.attempt)
        name = container_name(launch.job_id, launch.attempt)

        def create() -> Any:
            return api.create_container(
                self.image,
                command=list(launch.argv),
                name=name,
                labels=labels,
                environment=dict(launch.env),
                working_dir=str(launch.data_dir),
                host_config=host_config,
            )

        try:
            try:
                created = create()
            except APIError as exc:
                # A container of this attempt that was created and never started (a boot that died in between, its
                # create reaching the engine after the job was found unstarted): its program never ran, so it goes.
                if exc.status_code != HTTP_CONFLICT or not self._remove_if_never_started(name, launch.job_id):
                    raise
                created = create()
        except ImageNotFound as exc:
            raise SpawnError(
                f"image {self.image!r} is not on the Docker engine (PODCAST_JOB_DOCKER_IMAGE; build or pull it)"
            ) from exc
        except ENGINE_ERRORS as exc:
            if engine_trouble(exc):
                # Nothing of the job runs: a create that timed out may have made its container, never started; the
                # next attempt's create meets its name and removes it (above).
                raise ExecutorUnavailable(f"docker create: {describe_error(exc)}") from exc
            raise SpawnError(f"docker create: {describe_error(exc)}") from exc
        container_id = str(created["Id"])
        try:
            api.start(container_id)
        except ENGINE_ERRORS as exc:
            # A start that failed (or timed out, and may yet happen) must not leave a job running without a row.
            # The engine answered that it failed, or never got the request: the container was never started.
            never_started = isinstance(exc, APIError) or _never_reached(exc)
            try:
                api.remove_container(container_id, force=True, v=True)
            except NotFound:
                pass
            except ENGINE_ERRORS as cleanup:
                if not never_started:
                    log.error(
                        "container_left_behind",
                        job_id=launch.job_id,
                        container_id=container_id[:12],
                        error=describe_error(cleanup),
                        why="its start failed and it could not be removed; remove it by hand",
                    )
                    # It may yet start: its outcome is unknown, never a failure (the job would run unwatched, and a
                    # kind that resubmits would run it twice). The row keeps its slot; the evidence (its labelled
                    # container) says later whether it started.
                    raise StartOutcomeUnknown(f"docker start: {describe_error(exc)}") from exc
                log.warning(
                    "container_left_behind",
                    job_id=launch.job_id,
                    container_id=container_id[:12],
                    error=describe_error(cleanup),
                    why="created and never started; the job's next start removes it",
                )
            if engine_trouble(exc):
                raise ExecutorUnavailable(f"docker start: {describe_error(exc)}") from exc
            raise SpawnError(f"docker start: {describe_error(exc)}") from exc
        return container_id

    def _remove_if_never_started(self, name: str, job_id: str) -> bool:
        """Remove the container called ``name`` if it is this job's and was never started (blocking)."""
        state = self.client.inspect_container(name)
        labels = (state.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_JOB) != job_id or (state.get("State") or {}).get("Status") != "created":
            return False
        log.warning("container_never_started_removed", job_id=job_id, container_id=str(state.get("Id"))[:12])
        self.client.remove_container(name, force=True, v=True)
        return True

    # -- wait, collect, release -----------------------------------------------------------------------

    async def wait(self, handle: JobHandle) -> ExitStatus | None:
        assert isinstance(handle, ContainerHandle)
        outage = _Outage("job_liveness_unknown", job_id=handle.job_id, container_id=handle.container_id[:12])
        while True:
            try:
                state = await self._call(
                    lambda: self.wait_slice(handle.container_id), call="wait", limiter=self._waits
                )
            except NotFound:
                outage.recovered()
                return None  # removed by someone else: nobody has its exit code
            except ENGINE_ERRORS as exc:
                # INV-UNKNOWN-KEEPS-SLOT: the engine is unreachable or failing; the job may well be running.
                await trio.sleep(outage.failed(exc))
                continue
            outage.recovered()
            if state is None:
                continue  # still running: the slice ended
            await self.collect(handle)
            return state

    def wait_slice(self, container_id: str) -> ExitStatus | None:
        """Wait up to one slice (``WAIT_SLICE_S``) for the container to stop; its exit status if it has, else None
        (blocking: a worker thread's). A monitor's wait is a loop of these, so that no engine call is unbounded."""
        try:
            self.client.wait(container_id, timeout=WAIT_SLICE_S)
        except requests.exceptions.ReadTimeout:
            pass  # the slice ended; the state below says whether it is still running
        except requests.exceptions.ConnectionError as exc:
            # Over the unix socket a read timeout arrives as a ConnectionError wrapping urllib3's ReadTimeoutError.
            if not any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args):
                raise
        # The state decides, not the wait's answer: an engine shutting down may answer a wait without an exit.
        return _exit_status(self.client.inspect_container(container_id)["State"])

    async def refresh_log(self, job: Job) -> None:
        """A running container's output so far into its log (``LiveLogs.refresh``), for a reader that follows it."""
        await self._live.refresh(job, lambda fn: self._call(fn, call="logs", report=False))

    async def collect(self, handle: JobHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        if handle.collected:
            return
        async with self._live.turn(handle.job_id):  # after any live copy under way: never appended to after this
            await self._collect(handle)
        self._live.forget(handle.job_id)

    async def _collect(self, handle: ContainerHandle) -> None:
        outage = _Outage("job_output_unavailable", job_id=handle.job_id, container_id=handle.container_id[:12])
        while True:
            try:
                await self._call(lambda: self._copy_output(handle), call="logs")
            except NotFound:
                break  # gone: its output with it
            except ENGINE_ERRORS as exc:
                # The output matters less than the outcome, but is worth a few tries of the engine.
                if outage.delay >= RETRY_MAX_S:
                    log.warning("job_output_not_copied", job_id=handle.job_id, error=describe_error(exc))
                    break
                await trio.sleep(outage.failed(exc))
                continue
            except OSError as exc:
                # This host's own disk (a log path it cannot write: read-only, full, or another host's path when the
                # leader ends a silent host's job): asking the engine again would not help, and the end waits.
                log.warning("job_output_not_copied", job_id=handle.job_id, log=str(handle.log), error=repr(exc))
                break
            break
        handle.collected = True

    def _copy_output(self, handle: ContainerHandle) -> None:
        """The container's stdout and stderr into the job's log, capped (blocking).

        Unlike subprocess mode (the first ``log_max_bytes``), this keeps the *last* ``log_max_bytes``: the engine
        rotates its own log and keeps the newest output, so the start of a long output is gone already.
        """
        output = self.client.logs(handle.container_id, stdout=True, stderr=True, stream=False)
        cap = handle.log_max_bytes
        handle.log.parent.mkdir(parents=True, exist_ok=True)
        with handle.log.open("wb") as fh:  # one container per job id: its output is the whole log
            if len(output) > cap:
                fh.write(f"[log capped at {cap} bytes; earlier output discarded]\n".encode())
                output = output[-cap:]
            fh.write(output)

    async def release(self, handle: JobHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        try:
            # v=True: an anonymous volume the image declares (compose/Dockerfile has VOLUME /data) goes with it.
            await self._call(lambda: self.client.remove_container(handle.container_id, v=True), call="remove")
        except NotFound:
            pass
        except ENGINE_ERRORS as exc:
            # Its row is final: the container is only a leftover now (labelled, stopped). Say so; never retry forever.
            log.warning(
                "container_not_removed",
                job_id=handle.job_id,
                container_id=handle.container_id[:12],
                error=describe_error(exc),
            )

    def leftovers(self) -> list[Leftover] | None:
        """Every job container that is not running (exited, dead, or created and never started), by its labels.

        A boot that dies after recording a job's end and before removing its container leaves it behind (the row is
        written first, so that the exit code the engine keeps is never lost): the next boot removes it once its row
        says that attempt ended (``core``). Another supervisor's containers on the same engine are listed too; their
        jobs are not in this registry, and they are left alone.
        """
        try:
            listed = self.client.containers(
                all=True, filters={"label": LABEL_JOB, "status": ["exited", "dead", "created"]}
            )
        except ENGINE_ERRORS as exc:
            log.warning("docker_leftovers_unlisted", error=describe_error(exc))
            return None
        found = []
        for container in listed:
            labels = container.get("Labels") or {}
            attempt = str(labels.get(LABEL_ATTEMPT, "1"))
            if not attempt.isdigit():
                continue  # not a label this supervisor wrote
            job_id = str(labels[LABEL_JOB])
            handle = ContainerHandle(job_id, str(container["Id"]), self._log_dir / f"{job_id}.log", self.log_max_bytes)
            found.append(Leftover(job_id, int(attempt), handle))
        return found

    # -- stop -----------------------------------------------------------------------------------------

    async def stop(self, handle: JobHandle, grace_s: float) -> None:
        """``docker stop`` by container id: SIGTERM to the job (through its init), SIGKILL after the grace period.

        INV-NEVER-BLIND-SIGNAL: the engine signals the container with this id, never a pid number. An unreachable
        engine is asked again until it answers or the job's monitor ends.
        """
        assert isinstance(handle, ContainerHandle)
        grace = math.ceil(grace_s)  # the engine takes whole seconds
        log.info("job_cancel_stop", job_id=handle.job_id, container_id=handle.container_id[:12], grace_s=grace)
        outage = _Outage("job_stop_unanswered", job_id=handle.job_id, container_id=handle.container_id[:12])
        while True:
            try:
                # The client's timeout grows by the grace period for this call (the SDK adds it).
                await self._call(lambda: self.client.stop(handle.container_id, timeout=grace), call="stop")
            except NotFound:
                return
            except ENGINE_ERRORS as exc:
                await trio.sleep(outage.failed(exc))
                continue
            outage.recovered()
            return

    # -- evidence -------------------------------------------------------------------------------------

    def gather_evidence(self, jobs: Sequence[Job], *, boot_id: str) -> list[Evidence]:
        if not jobs:
            return []
        starting = set(self._starting)
        if starting and any(job.job_id in starting and not job.spawned for job in jobs):
            # A start still under way in a worker thread (its caller gave up on it): its container may appear at any
            # moment, so no listing taken now says it never will (INV-UNKNOWN-KEEPS-SLOT).
            rest = [job for job in jobs if job.job_id not in starting or job.spawned]
            found = iter(self.gather_evidence(rest, boot_id=boot_id))
            detail = "its start is still under way in the engine"
            return [
                Evidence(Liveness.UNKNOWN, detail=detail) if job.job_id in starting and not job.spawned else next(found)
                for job in jobs
            ]
        try:
            listed = self.client.containers(all=True, filters={"label": LABEL_JOB})
        except ENGINE_ERRORS as exc:
            # INV-UNKNOWN-KEEPS-SLOT: an engine that cannot be asked says nothing of its containers.
            self.health.judge(exc, call="containers")
            detail = describe_error(exc)
            return [Evidence(Liveness.UNKNOWN, detail=detail, outage=engine_trouble(exc)) for _ in jobs]
        self.health.answered()
        by_job: dict[str, list[Mapping[str, Any]]] = {}
        for container in listed:
            labels = container.get("Labels") or {}
            by_job.setdefault(str(labels.get(LABEL_JOB)), []).append(container)
        return [self._reader.evidence(job, by_job.get(job.job_id, [])) for job in jobs]

    def proof_of_end(self, jobs: Sequence[Job]) -> list[ProofOfEnd | None]:
        """INV-SILENT-HOST-ENDS-BY-PROOF: the container with the row's recorded id, on this host's engine (finding that
        exact id proves the engine is shared), labelled as the row's job, and exited: its exit code. A container not
        found, running, or an engine that does not answer is no proof (None). Its output is collected into the row's
        log only when this host can write that path."""
        return [self._reader.proof(job) for job in jobs]


class ContainerReader:
    """What the engine says of a job's containers, read into the executor's terms: a row's evidence from a listing,
    and proof of a recorded container's end. Blocking (Docker SDK calls): the executor runs it in worker threads."""

    def __init__(self, client: docker.APIClient, health: EngineHealth, log_dir: Path, log_max_bytes: int) -> None:
        self.client = client
        self.health = health
        self._log_dir = log_dir
        self.log_max_bytes = log_max_bytes

    def evidence(self, job: Job, containers: list[Mapping[str, Any]]) -> Evidence:
        """What ``containers`` (the engine's listing of the job's) say of the row's attempt."""
        recorded = container_id_of(job)
        if recorded is not None:
            containers = [c for c in containers if c.get("Id") == recorded]
        else:
            # An earlier attempt's container (left behind by a failed removal) is not this attempt's evidence.
            attempt = str(max(1, job.attempts))
            containers = [c for c in containers if (c.get("Labels") or {}).get(LABEL_ATTEMPT, "1") == attempt]
        if not containers:
            # No container: a spawned job's is gone with its exit code; an unspawned row's never existed.
            return Evidence(Liveness.DEAD if job.spawned else None)
        # One container per job id (its name is unique); prefer a running one should there ever be two.
        container = sorted(containers, key=lambda c: c.get("State") not in ALIVE_STATES)[0]
        container_id = str(container["Id"])
        log_path = Path(job.log_path) if job.log_path else self._log_dir / f"{job.job_id}.log"
        handle = ContainerHandle(job.job_id, container_id, log_path, self.log_max_bytes)
        # INV-IDENTITY-BEFORE-PROGRAM: a prior boot created it (labelled) and died before recording its id.
        found = container_record(container_id) if recorded is None else None
        state = str(container.get("State"))
        if state == "created":
            # Created, never started: its program never ran. Its handle lets a finalize remove it.
            return Evidence(None if not job.spawned else Liveness.DEAD, handle=handle)
        if state in ALIVE_STATES:
            return Evidence(Liveness.ALIVE, handle=handle, found=found)
        if state == "removing":
            return Evidence(Liveness.DEAD, found=found)
        if state not in ENDED_STATES:
            return Evidence(Liveness.UNKNOWN, detail=f"container state {state!r}")
        try:
            status = _exit_status(self.client.inspect_container(container_id)["State"])
        except NotFound:
            return Evidence(Liveness.DEAD, found=found)
        except ENGINE_ERRORS as exc:
            self.health.judge(exc, call="inspect")
            return Evidence(Liveness.UNKNOWN, detail=describe_error(exc), outage=engine_trouble(exc))
        if status is None:  # it started again meanwhile (nothing here restarts containers)
            return Evidence(Liveness.ALIVE, handle=handle, found=found)
        return Evidence(Liveness.DEAD, exit_status=status, handle=handle, found=found)

    def proof(self, job: Job) -> ProofOfEnd | None:
        """The row's recorded container, exited on this engine: its exit status (``DockerExecutor.proof_of_end``)."""
        recorded = container_id_of(job)
        if recorded is None:
            return None
        try:
            state = self.client.inspect_container(recorded)
        except NotFound:
            return None  # not on this engine (or removed): nothing proven
        except ENGINE_ERRORS as exc:
            self.health.judge(exc, call="inspect")
            return None
        labels = (state.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_JOB) != job.job_id or str((state.get("State") or {}).get("Status")) not in ENDED_STATES:
            return None
        try:
            status = _exit_status(state["State"])
        except DockerException:
            return None
        if status is None:
            return None
        handle = None
        if job.log_path is not None:
            try:
                check_log_writable(Path(job.log_path))
                handle = ContainerHandle(job.job_id, recorded, Path(job.log_path), self.log_max_bytes)
            except SupervisorError:
                pass  # another host's path, not mounted here: the outcome is recorded, its output left where it is
        return ProofOfEnd(status, f"container {recorded[:12]} exited", handle)


def _exit_status(state: Mapping[str, Any]) -> ExitStatus | None:
    """A container's exit status from its ``State``; None while it runs."""
    if state.get("Running") or state.get("Restarting") or state.get("Status") in ALIVE_STATES:
        return None
    code = state.get("ExitCode")
    if not isinstance(code, int) or isinstance(code, bool):
        raise DockerException(f"container state without an exit code: {dict(state)!r}"[:300])
    return ExitStatus(code=code, oom_killed=bool(state.get("OOMKilled")))
