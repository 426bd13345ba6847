"""Whether a registry's writes are failing now (``RegistryFault``), said once when a fault starts and once when it
ends: a full disk makes every write of every task fail, and a line per failed write would bury the one that matters.

A backend calls ``WriteHealth.failed`` with each write that its store could not make, and ``succeeded`` after each
that it did; ``fault`` is what ``Registry.fault()`` answers (the health route shows it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import structlog

from ..domain import RegistryError

log = structlog.get_logger("supervisor")


@dataclass(frozen=True)
class RegistryFault:
    """Writes have failed since ``since`` (the first failure of this episode); ``reason``: the latest failure."""

    since: datetime
    reason: str
    failed_writes: int


class WriteHealth:
    def __init__(self, where: str, clock: Callable[[], datetime]) -> None:
        self._where = where
        self._clock = clock
        self.fault: RegistryFault | None = None

    def failed(self, exc: RegistryError) -> None:
        if self.fault is None:
            self.fault = RegistryFault(self._clock(), str(exc), 1)
            # One ERROR per episode: every caller retries (the core) or answers 503 (the API) without logging it.
            log.error("registry_writes_failing", registry=self._where, error=str(exc), retried=True)
            return
        self.fault = RegistryFault(self.fault.since, str(exc), self.fault.failed_writes + 1)

    def succeeded(self) -> None:
        if self.fault is None:
            return
        fault, self.fault = self.fault, None
        down_s = (self._clock() - fault.since).total_seconds()
        log.info(
            "registry_writes_recovered",
            registry=self._where,
            failed_writes=fault.failed_writes,
            down_s=round(down_s, 3),
        )
