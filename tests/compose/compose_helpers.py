"""What the compose tests share: one compose project on the real engine (its names, files and environment; its
commands, bounded; its teardown, which leaves nothing behind, and the check of that), and the skip-or-fail rule for a
missing tool. ``test_compose_stack`` runs the local file, ``test_compose_fleet`` the fleet file."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from supervisor.execution.docker import LABEL_BOOT, LABEL_JOB

# Any one docker / docker-compose command; `up` of the fleet file waits for PostgreSQL's healthcheck.
CLI_TIMEOUT_S = 90.0


def needs(problem: str | None) -> None:
    """A tool the test needs is missing: in CI a failure, elsewhere a skip that says why."""
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {problem}", pytrace=False)
    pytest.skip(problem)


@dataclass
class ComposeProject:
    """One compose project: its names, its files, the environment its commands run with. ``stop_first``: the
    services that start jobs, stopped before anything is removed (none: every service)."""

    project: str
    network: str
    volumes: Sequence[str]
    files: Sequence[Path]
    token: str
    env: dict[str, str]
    stop_first: Sequence[str] = ()
    since: float = field(default_factory=time.time)  # before `up`: the engine's events of this project are later
    boot_ids: set[str] = field(default_factory=set)

    def compose_argv(self, *args: str) -> list[str]:
        argv = ["docker-compose", "-p", self.project]
        for f in self.files:
            argv += ["-f", str(f)]
        return [*argv, *args]

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """A blocking command, bounded (for the fixture and the teardown)."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
        )

    async def cli(self, argv: Sequence[str]) -> str:
        """A docker / docker-compose command from the test, bounded; its stdout, and it must succeed."""
        with trio.fail_after(CLI_TIMEOUT_S):
            done = await trio.run_process(
                list(argv), env=self.env, capture_stdout=True, capture_stderr=True, check=False
            )
        assert done.returncode == 0, f"{argv} exited {done.returncode}: {done.stderr.decode()}"
        return done.stdout.decode()

    def job_containers(self) -> list[str]:
        """The supervisors' job containers of this project: on its network, or of one of its boots."""
        found: set[str] = set()
        queries = [["--filter", f"label={LABEL_JOB}", "--filter", f"network={self.network}"]]
        queries += [["--filter", f"label={LABEL_BOOT}={boot}"] for boot in sorted(self.boot_ids)]
        for query in queries:
            listed = self.run(["docker", "ps", "-aq", "--no-trunc", *query])
            found.update(listed.stdout.split())
        return sorted(found)

    def teardown(self) -> list[str]:
        """Everything down, idempotently; what could not be done, as text."""
        problems: list[str] = []
        # Stop first, so that no supervisor starts a job between the removal of its containers and `down`.
        stopped = self.run(self.compose_argv("stop", "-t", "5", *self.stop_first))
        if stopped.returncode != 0:
            problems.append(f"compose stop: {stopped.stderr.strip()}")
        if leftovers := self.job_containers():
            removed = self.run(["docker", "rm", "-f", "-v", *leftovers])
            if removed.returncode != 0:
                problems.append(f"docker rm {leftovers}: {removed.stderr.strip()}")
        down = self.run(self.compose_argv("down", "-v", "--remove-orphans", "-t", "5"))
        if down.returncode != 0:
            problems.append(f"compose down: {down.stderr.strip()}")
        return problems

    def leftovers(self) -> list[str]:
        """What of this project is still on the engine."""
        left = [f"job container {c[:12]}" for c in self.job_containers()]
        listed = self.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"])
        left += [f"compose container {c}" for c in listed.stdout.split()]
        if self.run(["docker", "network", "inspect", self.network]).returncode == 0:
            left.append(f"network {self.network}")
        left += [f"volume {v}" for v in self.volumes if self.run(["docker", "volume", "inspect", v]).returncode == 0]
        return left
