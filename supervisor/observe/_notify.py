"""systemd's notify protocol, spoken by the supervisor itself (no dependency): one datagram per message.

``READY=1`` once serving, ``STOPPING=1`` at shutdown, and ``WATCHDOG=1`` every half ``WatchdogSec`` **only while the
sweeper has completed a sweep within twice its interval**. The watchdog therefore watches the sweeper, the part
that moves the queue and judges absence, and not merely that the event loop runs: a wedged sweep (a registry call
that never returns, a probe stuck in the kernel) stops the pings, and systemd restarts the supervisor, which never
stops its jobs (``KillMode=process``, see ``deploy/podcast-supervisor.service``). Each layer is watched by a
simpler one (ADR 0002 D8).

Without ``$NOTIFY_SOCKET`` (not run by systemd) every send is a no-op; without ``$WATCHDOG_USEC`` there is no
watchdog task. Jobs never inherit these variables.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ._logging import get_logger

log = get_logger()


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        # "@name" is a socket in the abstract namespace.
        self.address: str | None = ("\0" + raw[1:] if raw.startswith("@") else raw) or None
        self.watchdog_interval_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval_s = int(usec) / 2_000_000  # ping twice per WatchdogSec, as systemd advises

    def send(self, state: str) -> bool:
        """Send one message; never blocks, never raises (a manager that went away must not stop the supervisor)."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto(state.encode(), self.address)
        except OSError as exc:
            log.warning("sd_notify_failed", state=state.split("\n", 1)[0], error=str(exc))
            return False
        return True


async def run_watchdog(
    notifier: Notifier,
    last_sweep_done: Callable[[], float | None],
    sweep_interval_s: float,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Ping ``WATCHDOG=1`` every ``notifier.watchdog_interval_s`` while the sweeper keeps sweeping."""
    interval = notifier.watchdog_interval_s
    assert interval is not None
    task_status.started()
    withheld = False
    while True:
        done = last_sweep_done()
        # INV-WATCHDOG-WATCHES-THE-SWEEPER: no ping unless a sweep completed within twice the sweep interval.
        healthy = done is not None and trio.current_time() - done <= 2 * sweep_interval_s
        if healthy:
            notifier.send("WATCHDOG=1")
            if withheld:
                log.info("watchdog_resumed")
            withheld = False
        elif not withheld:
            withheld = True
            log.error(
                "watchdog_withheld",
                why=f"no sweep completed in the last {2 * sweep_interval_s} s: systemd will restart the supervisor",
            )
        await trio.sleep(interval)
