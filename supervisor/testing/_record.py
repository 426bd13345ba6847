"""What a scenario sees and switches: the log lines, webhooks and transitions it records (each one rings a doorbell
that ``advance_until`` waits on), the registry it can cut, the seed its draws come from, and its kinds file.
"""

from __future__ import annotations

import json
import math
import random
import secrets
import uuid
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog.testing
import trio

from ..core import Supervisor
from ..domain import Doorbell, RegistryError, RegistryUnavailable
from ..observe import EventName, JobEvent
from ..registry import RegistryFault
from ..registry.memory import MemoryBackend
from ._executor import Script

T = TypeVar("T")
# Why a cut registry's calls fail (``Scenario.make_unreachable("registry")``).
CUT = "the registry does not answer (the scenario made it unreachable)"


@dataclass(frozen=True)
class Transition:
    """One change of a job's status, as the boot that made it announced it: ``at`` in virtual seconds since the
    scenario began (``Scenario.now()`` is the wall-clock time), ``status`` its new status, ``reason`` why (an
    ``error_reason``, ``resubmitted``, ``enqueued``, ...), ``boot_id`` the boot that made it."""

    at: float
    job_id: str
    kind: str
    status: str
    reason: str | None
    boot_id: str


class Record:
    """The scenario's observations, in the order they happened; ``changed`` (the test's ``advance_until``) and
    ``moved`` (the boot's quiet sweeper, ``QuietGate``) are rung by each."""

    def __init__(self) -> None:
        self.logs: list[MutableMapping[str, Any]] = []
        self.webhooks: list[dict[str, Any]] = []
        self.transitions: list[Transition] = []
        self.changed = Doorbell()
        self.moved = Doorbell()

    def ring(self) -> None:
        self.changed.ring()
        self.moved.ring()

    def _heard(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        """A structlog processor ahead of the capture: a line is something happening (``advance_until`` looks)."""
        self.ring()
        return event

    def webhook(self, body: bytes) -> None:
        self.webhooks.append(json.loads(body))
        self.ring()

    def on_event(self, event: JobEvent) -> None:
        """A boot's bus subscriber: every transition, in the order its boot announced them."""
        if event.event is EventName.TRANSITION:
            job = event.job
            self.transitions.append(
                Transition(trio.current_time(), job.job_id, job.kind, str(job.status), event.reason, event.boot_id)
            )
        self.ring()

    @contextmanager
    def capturing_logs(self) -> Iterator[None]:
        """structlog's lines are kept here, each a dict, while the block runs (``structlog.testing.capture_logs``)."""
        with structlog.testing.capture_logs(processors=[self._heard]) as lines:
            self.logs = lines
            yield


class QuietGate:
    """The scenario's answer to a boot's sweeper (``core.QuietSweeps``): the sweeps have nothing to act on while the
    registry holds no job at all (none queued, running or ended: so no key, no retention, no deadline, no absence to
    judge), the queue is not paused, no pause file is there, no schedule has a job, no bulk selection was made and the
    last boot's leftovers are released. Each sweep of such a stretch would only look: in virtual time it is slept
    through, and the sweeper wakes at whatever the scenario records (a transition, a log line) or does."""

    def __init__(self, supervisor: Supervisor, moved: Doorbell, *, bulk_used: Callable[[], bool]) -> None:
        self._supervisor = supervisor
        self._moved = moved
        self._bulk_used = bulk_used

    async def quiet_until(self) -> float:
        self._moved.discard()  # what rang before this look is seen by it
        now = trio.current_time()
        supervisor, registry = self._supervisor, self._supervisor.registry
        if self._bulk_used() or not supervisor.settled:
            return now  # (a job this boot watches: no registry read needed to know)
        try:
            if any((await registry.counts()).values()) or (await registry.pause_state()).paused:
                return now
            if await registry.newest_of_schedules():
                return now
        except RegistryError:
            return now
        return now if supervisor.config.pause_flag_path.exists() else math.inf

    async def changed(self) -> None:
        await self._moved.wait()


class CuttableBackend(MemoryBackend):
    """The in-memory registry's backend, which the scenario can make unreachable: every read and write then fails
    with ``RegistryUnavailable`` (as a database that does not answer), and ``fault()`` says so, until it is back."""

    cut_since: datetime | None = None
    failed = 0

    async def write(self, step: Any) -> Any:
        await self._unless_cut()
        return await super().write(step)

    async def read(self, step: Any) -> Any:
        await self._unless_cut()
        return await super().read(step)

    async def _unless_cut(self) -> None:
        if self.cut_since is not None:
            await trio.lowlevel.checkpoint()
            self.failed += 1
            raise RegistryUnavailable(CUT)

    def fault(self) -> RegistryFault | None:
        return None if self.cut_since is None else RegistryFault(self.cut_since, CUT, self.failed)

    def cut(self, since: datetime) -> None:
        if self.cut_since is None:
            self.cut_since, self.failed = since, 0

    def mend(self) -> None:
        self.cut_since = None


class Draws:
    """Every draw a scenario makes from one seed: the resubmissions' jitter, the ids the registry makes (job ids,
    event ids: ``uuid.uuid4``), the tokens the core makes (a bulk selection's, in its log lines and its jobs'
    idempotency keys; a job's heartbeat token: ``secrets``), all drawn from the seed while the scenario is open, and
    Trio's choice among tasks that are ready at one instant. So a scenario with one seed repeats exactly."""

    def __init__(self) -> None:
        self.jitter = random.Random(0)
        self.ids = random.Random("ids-0")

    def seed(self, seed: int) -> None:
        self.jitter.seed(seed)
        self.ids.seed(f"ids-{seed}")
        _trio_random().seed(f"trio-{seed}")

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self.ids.getrandbits(128), version=4)

    def token_bytes(self, nbytes: int | None = None) -> bytes:
        """``secrets.token_bytes``, which ``token_hex`` and ``token_urlsafe`` draw from (32 bytes by default)."""
        return self.ids.randbytes(32 if nbytes is None else nbytes)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """``uuid.uuid4`` drawn from the seed, and Trio's scheduler seeded, while the block runs."""
        trio_random = _trio_random()
        saved, real_uuid4, real_token_bytes = trio_random.getstate(), uuid.uuid4, secrets.token_bytes
        trio_random.seed("trio-0")  # until start() says the scenario's seed
        uuid.uuid4 = self.uuid4
        secrets.token_bytes = self.token_bytes
        try:
            yield
        finally:
            uuid.uuid4 = real_uuid4
            secrets.token_bytes = real_token_bytes
            trio_random.setstate(saved)


def _trio_random() -> random.Random:
    """Trio's scheduler breaks ties among the tasks ready at one instant with this generator (the one pytest-trio
    hands Hypothesis to seed): seeded, the order is the same every run."""
    generator: random.Random = trio._core._run._r
    return generator


def kinds_toml_of(scripts: Mapping[str, Script]) -> str:
    """The kinds file that the ``kinds={name: script}`` form stands for: each script's kind settings as its
    ``[kinds.NAME]`` table, read by the kinds file's own loader."""
    lines: list[str] = []
    for name, script in scripts.items():
        lines.append(f"[kinds.{json.dumps(name)}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in script.kind_table(name).items())
    return "\n".join(lines) + "\n"


def write_kinds_file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
