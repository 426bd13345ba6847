"""sd_notify spoken by the supervisor: READY/STOPPING over a fake NOTIFY_SOCKET, and a watchdog that stops pinging
when the sweeper is wedged (INV-WATCHDOG-WATCHES-THE-SWEEPER)."""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from core_helpers import KINDS  # type: ignore[import-not-found]
from structlog.testing import capture_logs

from supervisor import Config, load_kinds, run_supervisor
from supervisor.core import run_sweeper
from supervisor.observe import Notifier, run_watchdog


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield path, sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


class RecordingNotifier(Notifier):
    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env)
        self.sent: list[tuple[float, str]] = []

    def send(self, state: str) -> bool:
        self.sent.append((trio.current_time(), state))
        return super().send(state)


class WedgingSweeper:
    """Completes its first three sweeps, then wedges in the fourth (a call that never returns)."""

    def __init__(self) -> None:
        self.last_sweep_done: float | None = None
        self.sweeps = 0

    async def sweep(self) -> None:
        self.sweeps += 1
        if self.sweeps == 4:
            await trio.sleep_forever()
        self.last_sweep_done = trio.current_time()


async def test_watchdog_pings_stop_when_the_sweeper_is_wedged_INV_WATCHDOG_WATCHES_THE_SWEEPER(
    autojump_clock: trio.testing.MockClock, notify_socket: tuple[str, socket.socket]
) -> None:
    path, sock = notify_socket
    notifier = RecordingNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000000"})  # WatchdogSec=20
    assert notifier.watchdog_interval_s == 10.0
    target = WedgingSweeper()
    start = trio.current_time()
    datagrams: list[str] = []

    async def read_socket() -> None:  # as systemd would: a datagram queue is short
        while True:
            await trio.lowlevel.wait_readable(sock)
            datagrams.extend(received(sock))

    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_socket)
            await nursery.start(run_sweeper, target, 30.0)  # sweeps at 0, 30, 60; wedged from 90 on
            await nursery.start(run_watchdog, notifier, lambda: target.last_sweep_done, 30.0)
            await trio.sleep(300)
            nursery.cancel_scope.cancel()
    pings = [t - start for t, state in notifier.sent if state == "WATCHDOG=1"]
    # The last sweep completed at 60: pings go on while that is within 2 x 30 s (up to 120), then stop for good.
    assert pings == [float(t) for t in range(0, 121, 10)]
    assert datagrams == ["WATCHDOG=1"] * len(pings)  # real datagrams on the socket
    assert [e["event"] for e in logs if e["event"].startswith("watchdog_")] == ["watchdog_withheld"]


def test_without_systemd_nothing_is_sent_and_there_is_no_watchdog() -> None:
    notifier = Notifier({})
    assert (notifier.send("READY=1"), notifier.watchdog_interval_s) == (False, None)
    # A watchdog meant for another process (WATCHDOG_PID) is not ours.
    other = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s is None


def test_abstract_namespace_socket(tmp_path: Path) -> None:
    name = f"podcast-test-{tmp_path.name}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).send("READY=1")
        assert sock.recv(100) == b"READY=1"


async def test_supervisor_says_ready_once_serving_and_stopping_at_shutdown(
    tmp_path: Path, notify_socket: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sock = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    config = Config(data_dir=tmp_path / "data", bind_port=0, kinds_file=kinds)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        sup = await nursery.start(functools.partial(run_supervisor, config, load_kinds(kinds), shutdown=shutdown))
        messages = received(sock)
        assert messages[0].startswith("READY=1\nSTATUS=serving on http://127.0.0.1:")
        assert "WATCHDOG=1" in messages[1:]  # the startup sweep has completed: the first ping goes at once
        assert sup.last_sweep_done is not None
        shutdown.set()
    assert received(sock)[-1] == "STOPPING=1"


def test_the_unit_leaves_jobs_running_and_survives_a_jobs_oom_kill() -> None:
    """deploy/'s unit: a restart signals the supervisor only (KillMode=process), and a job's OOM kill is the job's
    outcome, not the unit's (OOMPolicy=continue; systemd's default would stop the supervisor too)."""
    unit = (Path(__file__).resolve().parents[2] / "deploy" / "podcast-supervisor.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert (settings["KillMode"], settings["OOMPolicy"], settings["Type"]) == ("process", "continue", "notify")
