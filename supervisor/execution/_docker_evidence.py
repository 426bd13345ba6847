"""What the engine says of a job's containers, read into the executor's terms (``ContainerReader``): a row's evidence
from a listing (tri-state: an engine that cannot be asked says UNKNOWN), and proof of a recorded container's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
from docker.errors import DockerException, NotFound

from ..domain import Job, SupervisorError
from ._base import Evidence, Liveness, ProofOfEnd, check_log_writable
from ._docker_container import (
    ALIVE_STATES,
    ENDED_STATES,
    LABEL_ATTEMPT,
    LABEL_JOB,
    ContainerHandle,
    container_id_of,
    container_record,
    exit_status,
)
from ._docker_engine import ENGINE_ERRORS, EngineHealth, describe_error, engine_trouble


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
            status = exit_status(self.client.inspect_container(container_id)["State"])
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
            status = exit_status(state["State"])
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
