"""The executors the core's contract suite runs against, each with what a test needs to do to its jobs.

A ``World`` is where jobs run: it outlives a supervisor "boot" (a second ``Supervisor`` built from it finds the
first one's jobs), and it can do to a job what the outside world does: kill it, or look whether it has ended.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import trio

from supervisor import Config, Executor, Job, Liveness, Supervisor
from supervisor.domain import PageRequest
from supervisor.execution import create_executor
from supervisor.execution.docker import LABEL_JOB, DockerExecutor, container_id_of, make_client
from supervisor.execution.memory import MemoryJob
from supervisor.execution.subprocess import JobFiles, identity_of, probe, read_exit, read_start
from supervisor.testing import ScriptedExecutor

IMAGE = "podcast-job-supervisor:local"


class World:
    name: str
    killed_reason: str  # how a job killed from outside (SIGKILL) ends: the mode's true outcome of it
    lost_reason: str  # how a job ends whose process went away together with any record of how it ended

    def executor(self, config: Config) -> Executor:
        raise NotImplementedError

    def kill(self, job: Job) -> None:
        raise NotImplementedError

    def ended(self, job: Job) -> bool:
        """The job's process has ended and how it ended is on record."""
        raise NotImplementedError

    def gone(self, job: Job) -> bool:
        """Nothing of the job runs any more."""
        raise NotImplementedError

    def started(self, log_dir: Path, job_id: str) -> bool:
        """The job's program runs (whether or not its identity reached the row)."""
        raise NotImplementedError

    def lose(self, job: Job) -> None:
        """The job ends and takes any record of how it ended with it (its shepherd killed too; its container
        removed by someone else)."""
        raise NotImplementedError

    # The blocking calls above, from Trio (a thread for real engines; the memory world is Trio itself).
    async def akill(self, job: Job) -> None:
        await trio.to_thread.run_sync(self.kill, job)

    async def aended(self, job: Job) -> bool:
        return await trio.to_thread.run_sync(self.ended, job)

    async def agone(self, job: Job) -> bool:
        return await trio.to_thread.run_sync(self.gone, job)

    async def alose(self, job: Job) -> None:
        await trio.to_thread.run_sync(self.lose, job)

    def clean_up(self, jobs: list[Job]) -> None:
        """Stop whatever a failed test left running of ``jobs`` (jobs outlive supervisors by design)."""


class SubprocessWorld(World):
    name = "subprocess"
    killed_reason = "killed_by_SIGKILL"
    lost_reason = "orphan_reconciled_dead_pid"

    run_dir: Path | None = None  # the shepherd's run directory (every boot here shares one data dir)

    def executor(self, config: Config) -> Executor:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_JOB_API_TOKEN")}
        run_dirs = config.run_dirs()
        self.run_dir = run_dirs[0] if run_dirs else None
        return create_executor(config, base_env=env)

    def files(self, job: Job) -> JobFiles:
        return JobFiles.for_job(job, Path("."), self.run_dir)

    @staticmethod
    def pid(job: Job) -> int:
        identity = identity_of(job)
        assert identity is not None
        return identity.pid

    def kill(self, job: Job) -> None:
        os.killpg(self.pid(job), signal.SIGKILL)

    def ended(self, job: Job) -> bool:
        return read_exit(self.files(job), self.pid(job)) is not None

    def gone(self, job: Job) -> bool:
        identity = identity_of(job)
        return identity is not None and probe(identity) is Liveness.DEAD

    def started(self, log_dir: Path, job_id: str) -> bool:
        return read_start(JobFiles.for_log(log_dir / f"{job_id}.log", self.run_dir)) is not None

    def lose(self, job: Job) -> None:
        start = read_start(self.files(job))
        assert start is not None and start.shepherd is not None
        pidfd = os.pidfd_open(start.shepherd.pid)
        try:
            # The shepherd first: a SIGKILLed process runs no more code, so nobody reaps the job and records its end.
            os.kill(start.shepherd.pid, signal.SIGKILL)
            os.killpg(self.pid(job), signal.SIGKILL)
            # Lost means gone: a process dies only once the system call it was in returns (a record being written).
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            assert poller.poll(10_000), "the SIGKILLed shepherd did not die within 10 s"
        finally:
            os.close(pidfd)

    def clean_up(self, jobs: list[Job]) -> None:
        for job in jobs:
            if job.status.is_terminal:
                continue
            identity = identity_of(job)
            if identity is not None and probe(identity) is Liveness.ALIVE:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(identity.pid, signal.SIGKILL)


async def _exit(job: MemoryJob) -> int:
    job.print("bye")
    return int(job.launch.argv[-1])


async def _sleep(job: MemoryJob) -> int:
    await trio.sleep(float(job.launch.argv[-1]))
    return 0


async def _gated(job: MemoryJob) -> int:
    gate = Path(job.launch.argv[-2])
    while not await trio.to_thread.run_sync(gate.exists):  # noqa: ASYNC110 - a file, as the real program
        await trio.sleep(0.01)  # the simulated program polls its gate file
    job.print("gate open")
    return int(job.launch.argv[-1])


async def _term_ignorer(job: MemoryJob) -> int:
    job.ignores_sigterm = True
    job.print("ready")
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def _zero(job: MemoryJob) -> int:
    return 0


PROGRAMS = {
    "exit": _exit,
    "sleep": _sleep,
    "gated": _gated,
    "done": _zero,
    "first": _exit,
    "term_ignorer": _term_ignorer,
    "retried_sleep": _sleep,
    "patient_sleep": _sleep,
    "retried_exit": _exit,
    "budget": lambda job: _const(10),
    "nothing_to_do": lambda job: _const(3),
}


async def _const(code: int) -> int:
    return code


class MemoryWorld(World):
    """The scenario kit's executor (``supervisor.testing.ScriptedExecutor``), running the contract's programs: the
    kit's machine passes the suite the real executors pass, so a scenario cannot drift from them."""

    name = "memory"
    killed_reason = "killed_by_SIGKILL"
    lost_reason = "orphan_reconciled_dead_pid"

    def __init__(self, nursery: trio.Nursery) -> None:
        self.machine = ScriptedExecutor(PROGRAMS, nursery)

    def executor(self, config: Config) -> Executor:
        return self.machine  # the same "machine" for every boot

    def kill(self, job: Job) -> None:
        self.machine.kill(job.job_id)

    def ended(self, job: Job) -> bool:
        return self.machine.jobs[job.job_id].status is not None

    def gone(self, job: Job) -> bool:
        return self.ended(job)

    def started(self, log_dir: Path, job_id: str) -> bool:
        return job_id in self.machine.jobs

    def lose(self, job: Job) -> None:
        self.machine.lose(job.job_id)

    async def akill(self, job: Job) -> None:
        self.kill(job)

    async def alose(self, job: Job) -> None:
        self.lose(job)

    async def aended(self, job: Job) -> bool:
        return self.ended(job)

    async def agone(self, job: Job) -> bool:
        return self.gone(job)


class DockerWorld(World):
    """Job containers on the real engine, the data dir bind-mounted; `docker kill` reports exit 137 (not a signal)."""

    name = "docker"
    killed_reason = "exit_code_137"
    lost_reason = "orphan_reconciled_no_container"

    def __init__(self) -> None:
        self.client = make_client()

    def executor(self, config: Config) -> Executor:
        return DockerExecutor(
            image=IMAGE,
            data_volume=str(config.data_dir.resolve()),
            log_dir=config.jobs_log_dir.resolve(),
            log_max_bytes=config.log_max_bytes,
        )

    def containers(self, job: Job) -> list[dict[str, object]]:
        return list(self.client.containers(all=True, filters={"label": f"{LABEL_JOB}={job.job_id}"}))

    @staticmethod
    def container(job: Job) -> str:
        container_id = container_id_of(job)
        assert container_id is not None
        return container_id

    def kill(self, job: Job) -> None:
        self.client.kill(self.container(job))

    def state(self, job: Job) -> str | None:
        found = self.containers(job)
        return str(found[0]["State"]) if found else None

    def ended(self, job: Job) -> bool:
        return self.state(job) == "exited"

    def gone(self, job: Job) -> bool:
        return self.state(job) in (None, "exited", "removing", "dead")

    def started(self, log_dir: Path, job_id: str) -> bool:
        found = self.client.containers(filters={"label": f"{LABEL_JOB}={job_id}"})
        return bool(found) and found[0]["State"] == "running"

    def lose(self, job: Job) -> None:
        self.client.remove_container(self.container(job), force=True)  # with it, the exit code the engine kept

    def clean_up(self, jobs: list[Job]) -> None:
        ids = {job.job_id for job in jobs}
        for container in self.client.containers(all=True, filters={"label": LABEL_JOB}):
            if container["Labels"].get(LABEL_JOB) in ids:
                with contextlib.suppress(Exception):
                    self.client.remove_container(container["Id"], force=True)
        self.client.close()


def docker_cli(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=True).stdout


@contextlib.asynccontextmanager
async def supervisors_in(
    world: World, make_supervisor: Callable[..., Supervisor], executor: Callable[[Config], Executor] | None = None
) -> AsyncIterator[Callable[..., Supervisor]]:
    """``make_supervisor`` with ``executor`` (the world's by default); whatever a failed test left running in the
    world is stopped at the end (jobs outlive supervisors by design)."""
    made: list[Supervisor] = []

    def make_(**kwargs: object) -> Supervisor:
        sup = make_supervisor(executor=executor or world.executor, **kwargs)
        made.append(sup)
        return sup

    yield make_
    for sup in made:
        jobs, _ = await sup.registry.list_jobs(PageRequest.parse(limit=1000))
        await trio.to_thread.run_sync(world.clean_up, jobs)
