"""Liveness and progress beats to the supervisor (ADR-150 D7).

One task in the run's service nursery owns all beating. Workers only call :meth:`Heartbeat.advance`,
which is synchronous: it raises the watermark and wakes the beat task, so a slow or dead heartbeat
endpoint can delay the next beat but never a worker. Beats coalesce: if three episodes complete
while one POST is in flight, or within ``min_gap_s`` of the last beat, the next beat carries the
watermark after all three. So a job sends at most one beat per ``min_gap_s`` while it progresses,
and one every ``interval_s`` while it does not (liveness): the supervisor's heartbeat load is
bounded by the number of jobs, not by how fast their episodes end.

Body: ``{"completed_units": int, "total_units": int | null, "stage": str}`` with
``Authorization: Bearer <token>``. ``completed_units`` is the progress watermark: the number of
episodes of this run that reached a terminal outcome (done, skipped, failed, poisoned) -- never
dispatched ones -- and it never decreases.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import trio

from ._config import HeartbeatConfig

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, config: HeartbeatConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._config = config
        self._transport = transport
        self._completed_units = 0
        self._total_units: int | None = None
        self._stage = "starting"
        self._wake = trio.Event()
        self._stopping = False
        self._stopped = trio.Event()
        self._scope: trio.CancelScope | None = None
        self.beats_ok = 0
        self.beats_failed = 0

    @property
    def completed_units(self) -> int:
        return self._completed_units

    def set_stage(self, stage: str) -> None:
        self._stage = stage
        self._wake.set()

    def set_total(self, total_units: int | None) -> None:
        self._total_units = total_units

    def advance(self, units: int = 1) -> None:
        """Raise the progress watermark and ask for a progress beat. Never blocks."""
        if units < 0:
            raise ValueError("the progress watermark never decreases")
        self._completed_units += units
        self._wake.set()

    def stop(self) -> None:
        """Send one final beat with the final watermark, then end the beat task.

        Bounded: a beat still in flight plus the final one get 2 x timeout_s together, so a hanging
        heartbeat endpoint cannot hold the process open after the run is over.
        """
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        if self._scope is not None:
            self._scope.deadline = min(self._scope.deadline, trio.current_time() + 2 * self._config.timeout_s)

    def body(self) -> dict[str, Any]:
        return {
            "completed_units": self._completed_units,
            "total_units": self._total_units,
            "stage": self._stage,
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        url = self._config.url
        if not url:
            log.info("PODCAST_JOB_HEARTBEAT_URL is not set; heartbeats are disabled")
            task_status.started()
            return
        headers = {"Authorization": f"Bearer {self._config.token or ''}"}
        timeout = httpx.Timeout(self._config.timeout_s)
        with trio.CancelScope() as self._scope:
            async with httpx.AsyncClient(timeout=timeout, transport=self._transport, headers=headers) as client:
                task_status.started()
                while True:
                    stopping = self._stopping
                    self._wake = trio.Event()
                    last = trio.current_time()
                    await self._beat(client, url, timeout)
                    if stopping:
                        return
                    # Liveness: beat at least every interval; progress: beat as soon as we are woken, but not
                    # before the gap since the last beat has passed (what comes meanwhile goes in that beat). A
                    # stop never waits for the gap: the final beat goes at once.
                    with trio.move_on_after(self._config.interval_s):
                        await self._wake.wait()
                    with trio.move_on_at(last + (self._config.min_gap_s or 0.0)):
                        await self._stopped.wait()

    async def _beat(self, client: httpx.AsyncClient, url: str, transport_timeout: httpx.Timeout) -> None:
        body = self.body()
        # The transport timeout bounds each phase; this bounds the whole beat, so a server dripping
        # its answer still cannot hold the beat task for longer than about one timeout.
        with trio.move_on_after(self._config.timeout_s * 2) as scope:
            try:
                response = await client.post(url, json=body, timeout=transport_timeout)
            except httpx.HTTPError as exc:
                self.beats_failed += 1
                log.warning("heartbeat to %s failed: %s: %s", url, type(exc).__name__, exc)
                return
            if response.status_code >= 300:
                self.beats_failed += 1
                log.warning("heartbeat to %s answered HTTP %s", url, response.status_code)
                return
            self.beats_ok += 1
        if scope.cancelled_caught:
            self.beats_failed += 1
            log.warning("heartbeat to %s timed out", url)
