"""Fixtures for the supervisor core and its executors (``tests/core``, ``tests/execution``; a plugin of
``tests/conftest.py``): a real registry, real kinds, a Supervisor attached to a job nursery."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import trio
from core_helpers import KINDS, poll  # type: ignore[import-not-found]

from supervisor import Config, Executor, SqliteRegistry, Supervisor, load_kinds


@pytest.fixture
def kinds_file(tmp_path: Path) -> Path:
    path = tmp_path / "kinds.toml"
    path.write_text(KINDS)
    return path


@pytest.fixture
def make_config(tmp_path: Path, kinds_file: Path) -> Callable[..., Config]:
    def make(**overrides: object) -> Config:
        values: dict[str, object] = {
            "data_dir": tmp_path / "data",
            "bind_port": 0,
            "kinds_file": kinds_file,
            "cancel_grace_s": 5.0,
        }
        values.update(overrides)
        return Config(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture
async def make_supervisor(make_config: Callable[..., Config]) -> AsyncIterator[Callable[..., Supervisor]]:
    made: list[SqliteRegistry] = []
    supervisors: list[Supervisor] = []
    async with trio.open_nursery() as job_nursery:
        yield _maker(make_config, made, supervisors, job_nursery)
        # A supervisor shutdown never kills jobs (by design); a test must not leave real processes behind.
        for sup in supervisors:
            # SIGKILL at once, through the executor, each job as soon as it has a handle: a start still under way
            # (a drainer round the test's last call woke) gets its handle later, and its job must die too. Then the
            # monitors reap what was killed (an unreaped child is a ResourceWarning, an error here). Bounded: an
            # executor asks a stop again until it is answered, and an engine a test stopped never will.
            stopped: set[str] = set()
            with trio.fail_after(40):
                while len(sup.boot.ledger):  # monitors remove themselves; bounded above
                    for running in sup.boot.ledger.entries():
                        if running.handle is not None and running.job_id not in stopped:
                            stopped.add(running.job_id)
                            await sup.executor.stop(running.handle, 0)
                    await trio.sleep(0.01)
        # Stop every task that may still touch a registry before any registry is closed.
        job_nursery.cancel_scope.cancel()
    for registry in made:
        registry.close()
    # A shepherd a test killed leaves its run directory (tmpfs, outside tmp_path) behind: no next boot will sweep it.
    for sup in supervisors:
        run_dirs = sup.config.run_dirs()
        if run_dirs is not None:
            shutil.rmtree(run_dirs[0], ignore_errors=True)


def _maker(
    make_config: Callable[..., Config],
    made: list[SqliteRegistry],
    supervisors: list[Supervisor],
    job_nursery: trio.Nursery,
) -> Callable[..., Supervisor]:

    def make(
        *,
        attach: bool | trio.Nursery = True,
        boot_id: str | None = None,
        base_env: dict[str, str] | None = None,
        executor: Callable[[Config], Executor] | None = None,
        **overrides: object,
    ) -> Supervisor:
        """A supervisor on the shared job nursery (``attach=True``), on a nursery of the test's own (whose cancel
        is that boot's death), or on none."""
        config = make_config(**overrides)
        boot_id = boot_id or secrets.token_hex(16)
        # As run_supervisor opens it: events are written only when a webhook will send them.
        registry = SqliteRegistry(config.registry_path, boot_id=boot_id, outbox=config.webhook_url is not None)
        made.append(registry)
        sup = Supervisor(
            config,
            load_kinds(config.kinds_file),
            registry,
            boot_id=boot_id,
            base_env=base_env,
            executor=executor(config) if executor is not None else None,
            standalone=True,  # no fleet task here: the drainer alone, as the tests drive it
        )
        if attach is not False:
            nursery = job_nursery if attach is True else attach
            sup.attach(nursery)
            nursery.start_soon(sup.drainer.run)  # what run_supervisor starts in its root nursery
        supervisors.append(sup)
        return sup

    return make


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that is not a job of any supervisor here; killed at teardown."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import threading; threading.Event().wait(60)"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


class Server:
    def __init__(self, proc: trio.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.url = ""


@pytest.fixture
async def start_server(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[Callable[[], trio.Process]]:
    """Start real `supervisor serve` processes with the test module's ``env``; each is killed at the end."""
    servers: list[Server] = []

    async def start(log: Path | None = None) -> Server:
        """``log``: where the server's stderr goes (default: a file of the test's own)."""
        log = log if log is not None else tmp_path / f"supervisor-{len(servers)}.log"
        with log.open("wb") as fh:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=fh
            )
        server = Server(proc, log)
        servers.append(server)

        async def started() -> str | None:
            for line in (await trio.to_thread.run_sync(log.read_text)).splitlines():
                if '"supervisor_started"' in line:
                    return str(json.loads(line)["url"])
            if proc.returncode is not None:
                raise AssertionError(f"supervisor exited {proc.returncode}: {log.read_text()}")
            return None

        server.url = await poll(started, timeout_s=20)
        return server

    yield start  # type: ignore[misc]
    for server in servers:
        if server.proc.returncode is None:
            server.proc.kill()
        await server.proc.wait()
