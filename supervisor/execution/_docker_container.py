"""A job's container: its name and labels (how a boot finds it again), its identity record (the container id), its
handle, its exit status as the engine states it, and how it is made (``ContainerStarter``: the spec, the create, the
start; INV-IDENTITY-BEFORE-PROGRAM: created with its labels before it is started).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import LogConfig

from ..domain import ExecutorUnavailable, IdentityRecord, Job, SpawnError, StartOutcomeUnknown
from ..observe import get_logger
from ._base import ExitStatus, JobHandle, Launch, check_log_writable
from ._docker_engine import ENGINE_ERRORS, describe_error, engine_trouble, never_reached
from ._shepherd_jobs import JOB_OOM_SCORE_ADJ

log = get_logger()

LABEL_JOB = "ps.job_id"
LABEL_BOOT = "ps.boot_id"
LABEL_KIND = "ps.kind"
LABEL_ATTEMPT = "ps.attempt"  # which start of the job (none on containers made before resubmission: the first)
ORPHAN_NO_CONTAINER = "orphan_reconciled_no_container"
ALIVE_STATES = frozenset({"running", "paused", "restarting"})
ENDED_STATES = frozenset({"exited", "dead"})
RECORD_KIND = "container"
HTTP_CONFLICT = 409


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


def exit_status(state: Mapping[str, Any]) -> ExitStatus | None:
    """A container's exit status from its ``State``; None while it runs."""
    if state.get("Running") or state.get("Restarting") or state.get("Status") in ALIVE_STATES:
        return None
    code = state.get("ExitCode")
    if not isinstance(code, int) or isinstance(code, bool):
        raise DockerException(f"container state without an exit code: {dict(state)!r}"[:300])
    return ExitStatus(code=code, oom_killed=bool(state.get("OOMKilled")))


class ContainerStarter:
    """Makes a job's container from its ``Launch`` and starts it (blocking: the executor runs it in a worker thread).

    Each step says how it failed in the executor's terms: a refusal of the engine's (a missing image) is a
    ``SpawnError``; engine trouble, with nothing of the job running, is ``ExecutorUnavailable`` (back to the queue);
    a container that may yet start is ``StartOutcomeUnknown`` (never a failure).
    """

    def __init__(self, client: docker.APIClient, *, image: str, data_volume: str, network: str | None) -> None:
        self.client = client
        self.image = image
        self.data_volume = data_volume
        self.network = network

    def create_and_start(self, launch: Launch) -> str:
        """The job's container id, created with its labels, then started."""
        # INV-NO-START-WITHOUT-LOG: the output is copied into the log at the end; a log that cannot be written
        # there would lose it, so the job is not started (spawn_failed, naming the path).
        check_log_writable(launch.log)
        container_id = self.create(launch)
        self.start(container_id, launch.job_id)
        return container_id

    def host_config(self, launch: Launch) -> dict[str, Any]:
        """The container's spec on the host: init, the data volume, the network, its log's bound, its OOM score and
        the kind's memory bound."""
        # The engine's own log of the container is bounded too: a json-file rotated at the cap, two files kept. It
        # keeps the newest output (a rotation drops the oldest file), so that is what the job's log gets.
        config: dict[str, Any] = self.client.create_host_config(
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
        return config

    def create(self, launch: Launch) -> str:
        """Create the job's labelled container (not started); its id."""
        labels = {LABEL_JOB: launch.job_id, LABEL_BOOT: launch.boot_id, LABEL_KIND: launch.kind}
        labels[LABEL_ATTEMPT] = str(launch.attempt)
        name = container_name(launch.job_id, launch.attempt)
        host_config = self.host_config(launch)

        def create() -> Any:
            return self.client.create_container(
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
                if exc.status_code != HTTP_CONFLICT or not self.remove_if_never_started(name, launch.job_id):
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
        return str(created["Id"])

    def start(self, container_id: str, job_id: str) -> None:
        """Start the created container; one whose start failed is removed, so no job runs without a row."""
        try:
            self.client.start(container_id)
        except ENGINE_ERRORS as exc:
            # A start that failed (or timed out, and may yet happen) must not leave a job running without a row.
            # The engine answered that it failed, or never got the request: the container was never started.
            never_started = isinstance(exc, APIError) or never_reached(exc)
            self.remove_after_failed_start(container_id, job_id, exc, never_started=never_started)
            if engine_trouble(exc):
                raise ExecutorUnavailable(f"docker start: {describe_error(exc)}") from exc
            raise SpawnError(f"docker start: {describe_error(exc)}") from exc

    def remove_after_failed_start(
        self, container_id: str, job_id: str, exc: BaseException, *, never_started: bool
    ) -> None:
        """Remove a container whose start failed; one that could not be removed and may yet start makes the start's
        outcome unknown (``StartOutcomeUnknown``)."""
        try:
            self.client.remove_container(container_id, force=True, v=True)
        except NotFound:
            pass
        except ENGINE_ERRORS as cleanup:
            if not never_started:
                log.error(
                    "container_left_behind",
                    job_id=job_id,
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
                job_id=job_id,
                container_id=container_id[:12],
                error=describe_error(cleanup),
                why="created and never started; the job's next start removes it",
            )

    def remove_if_never_started(self, name: str, job_id: str) -> bool:
        """Remove the container called ``name`` if it is this job's and was never started (blocking)."""
        state = self.client.inspect_container(name)
        labels = (state.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_JOB) != job_id or (state.get("State") or {}).get("Status") != "created":
            return False
        log.warning("container_never_started_removed", job_id=job_id, container_id=str(state.get("Id"))[:12])
        self.client.remove_container(name, force=True, v=True)
        return True
