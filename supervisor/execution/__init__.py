"""How jobs run: one executor interface (``Executor``, in ``_base``) and its members.

- ``subprocess``: processes on this machine, children of this boot's shepherd (``shepherd.py``, run as a script);
- ``docker``: containers on a Docker engine, found again by their labels;
- ``memory``: Trio tasks, for tests of the core's rules (not an exec mode).

Each mode's module is its executor; its parts sit beside it, private: ``_shepherd_client`` (this boot's shepherd, seen
from the supervisor), ``_job_files`` (the shepherd's records, read) and ``_identity`` (a process's identity) for
``subprocess``; ``_shepherd_jobs`` and ``_shepherd_files`` for the shepherd; ``_docker_container``, ``_docker_engine``
and ``_docker_evidence`` for ``docker``.

Each executor owns the identity record it writes into a job's row (``JobHandle.record``): a process's pid,
start time and kernel boot, a container's id. The core stores and passes it, and never reads inside it.

The exec mode is read once, here, when the supervisor is built; nothing else branches on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import assert_never

from ..domain import Config
from ._base import (
    ORPHAN_DEAD_PID,
    Evidence,
    Executor,
    ExecutorFault,
    ExitStatus,
    JobHandle,
    Launch,
    Leftover,
    ProofOfEnd,
    Unwatchable,
)

__all__ = [
    "ORPHAN_DEAD_PID",
    "Evidence",
    "Executor",
    "ExecutorFault",
    "ExitStatus",
    "JobHandle",
    "Launch",
    "Leftover",
    "ProofOfEnd",
    "Unwatchable",
    "create_executor",
]


def create_executor(config: Config, *, base_env: Mapping[str, str]) -> Executor:
    """The executor of ``config.exec_mode`` (its module is imported only when chosen)."""
    mode = config.exec_mode
    if mode == "subprocess":
        from .subprocess import SubprocessExecutor

        run_dirs = config.run_dirs()
        trace = config.shepherd_trace_file
        return SubprocessExecutor(
            base_env=base_env,
            log_dir=config.jobs_log_dir.resolve(),
            shepherd_log=config.viewer_dir.resolve() / "shepherd.log",
            run_dir=run_dirs[0] if run_dirs else None,
            run_dir_private_from=run_dirs[1] if run_dirs else None,
            trace=trace.resolve() if trace is not None else None,
        )
    if mode == "docker":
        from .docker import DockerExecutor

        return DockerExecutor.from_config(config)
    assert_never(mode)
