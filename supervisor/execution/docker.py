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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import docker
import requests
import trio
import urllib3
from docker.errors import NotFound

from ..domain import Config, ExecutorUnavailable, Job, SpawnError, StartOutcomeUnknown
from ..observe import get_logger
from ._base import Evidence, Executor, ExecutorFault, ExitStatus, JobHandle, Launch, Leftover, Liveness, ProofOfEnd
from ._docker_container import (
    LABEL_ATTEMPT,
    LABEL_BOOT,
    LABEL_JOB,
    LABEL_KIND,
    ORPHAN_NO_CONTAINER,
    ContainerHandle,
    ContainerStarter,
    container_id_of,
    container_name,
    container_record,
    exit_status,
)
from ._docker_engine import (
    API_TIMEOUT_S,
    ENGINE_ERRORS,
    MAX_CALLS,
    MAX_WAITS,
    RETRY_MAX_S,
    EngineHealth,
    Outage,
    describe_error,
    engine_trouble,
    make_client,
)
from ._docker_evidence import ContainerReader

__all__ = [
    "ENGINE_ERRORS",
    "LABEL_ATTEMPT",
    "LABEL_BOOT",
    "LABEL_JOB",
    "LABEL_KIND",
    "ContainerHandle",
    "ContainerReader",
    "DockerExecutor",
    "EngineHealth",
    "LiveLogs",
    "container_id_of",
    "container_name",
    "container_record",
    "make_client",
]

log = get_logger()

T = TypeVar("T")

WAIT_SLICE_S = 10.0  # one blocking wait for a container's exit; the monitor then asks again
# A followed container's output is copied into its log at most this often (and only while someone reads it).
LIVE_LOG_EVERY_S = 0.5



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
        self._starter = ContainerStarter(self.client, image=image, data_volume=data_volume, network=network)
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
                return self._starter.create_and_start(launch)
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

    # -- wait, collect, release -----------------------------------------------------------------------

    async def wait(self, handle: JobHandle) -> ExitStatus | None:
        assert isinstance(handle, ContainerHandle)
        outage = Outage("job_liveness_unknown", job_id=handle.job_id, container_id=handle.container_id[:12])
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
        return exit_status(self.client.inspect_container(container_id)["State"])

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
        outage = Outage("job_output_unavailable", job_id=handle.job_id, container_id=handle.container_id[:12])
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
        outage = Outage("job_stop_unanswered", job_id=handle.job_id, container_id=handle.container_id[:12])
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
