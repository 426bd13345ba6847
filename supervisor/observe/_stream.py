"""The event stream (``GET /api/events``): what the event bus announces, numbered, kept for a while, and handed to
each reader through a bounded queue of its own.

Event ids. The outbox's ids exist only while a webhook is configured (no outbox otherwise), and the bus does not
carry them; so the stream numbers events itself, in one scheme whatever the configuration: ``<boot_id>-<seq>``, where
``seq`` counts from 1 in the order this boot's bus announced them. An id therefore says which boot it is from, and a
``Last-Event-ID`` from another boot is recognised, never mistaken for a position in this one.

Resume. The last ``replay_events`` events are kept in memory (a ring). A reader that comes back with the id of the
last event it saw gets every later event, exactly once and in order, as long as that id is still in the ring (or
just before it). Otherwise it is told so first, with a ``stream.gap`` notice, and then gets what the ring holds:

- ``evicted``: the id is of this boot, but events after it were pushed out of the ring;
- ``restarted``: the id is of another boot (the supervisor restarted): what happened between the two boots' streams,
  and anything the old boot announced after the reader lost it, is not in this process. The registry is the truth:
  a reader that must not miss an outcome reads the rows again (``supervisor wait`` does, on every reconnect).

What the stream carries: the events this process's bus announces (the webhook's kinds and payloads, rendered by
``render_event``, ``event_id`` being the stream's id). A change written straight into the registry by another
process is not announced here; the webhook's outbox (with its own durable ids) is the record that survives restarts.

Bounds: each reader has a queue of ``client_buffer_events``; an event that finds it full drops that reader at once
(its queue is freed and its request cancelled: a reader that does not read never holds memory), counted in
``dropped``. The queue must absorb a burst: the bus announces a whole batch enqueue (up to 1,000 events) before any
reader runs, so a reader is judged by a full queue only when the queue is larger than that (the default, 2048). The
queues hold references to the same events: what stays alive is at most the ring plus one queue's worth of events.
At most ``max_clients`` readers at once. Nothing here ever blocks the bus: ``on_event`` only appends
and ``send_nowait``s.
"""

from __future__ import annotations

import functools
import json
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import trio

from ..domain import TooManyStreams, ValidationError
from ..registry import OutboxEvent
from ._events import EventName, JobEvent
from ._logging import get_logger, request_fields
from ._webhook import render_event

log = get_logger()

LAST_EVENT_ID = "Last-Event-ID"
GAP = "stream.gap"
# <boot_id>-<n>: a boot id is random hex in `supervisor serve`, but an embedder may name its own (anything but "\n").
_EVENT_ID = re.compile(r"([^\r\n]{1,200})-([0-9]{1,18})")
EVENT_NAMES = tuple(str(name) for name in EventName)


class StreamEnded(Exception):
    """The stream is over: the server is shutting down, or the reader fell too far behind and was dropped."""


@dataclass(frozen=True, eq=False)
class StreamEvent:
    """One announced event with its stream id; its payload (the webhook's body) is rendered once, when first read."""

    seq: int
    id: str
    event: JobEvent
    at: datetime

    @property
    def name(self) -> str:
        return str(self.event.event)

    @property
    def job_id(self) -> str:
        return self.event.job.job_id

    @functools.cached_property
    def data(self) -> bytes:
        job = self.event.job
        # The row as the webhook's outbox holds it: without a queue position (it would cost the registry a count).
        item = OutboxEvent(
            seq=self.seq,
            event_id=self.id,
            job_id=job.job_id,
            event=self.name,
            created_at=self.at,
            previous_status=self.event.previous_status,
            reason=self.event.reason,
            boot_id=self.event.boot_id,
            job=replace(job, queue_position=None).public(),
        )
        return render_event(item)


@dataclass(frozen=True)
class Gap:
    """What a resuming reader is told before its replay: why some events may be missing."""

    why: str  # "evicted" | "restarted"
    last_event_id: str
    boot_id: str
    oldest_event_id: str | None  # the oldest event still held (None: none held)

    def data(self) -> bytes:
        body = {
            "reason": self.why,
            "last_event_id": self.last_event_id,
            "boot_id": self.boot_id,
            "oldest_event_id": self.oldest_event_id,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(eq=False)
class Subscription:
    """One reader's view: its filter, what it is replayed first, then its own bounded queue of live events."""

    jobs: frozenset[str]  # empty: every job
    kinds: frozenset[str]  # empty: every kind of event
    gap: Gap | None
    replay: deque[StreamEvent]
    follow: bool
    _send: trio.MemorySendChannel[StreamEvent] | None = None
    _receive: trio.MemoryReceiveChannel[StreamEvent] | None = None
    _on_close: Callable[[Subscription], None] | None = None
    on_drop: Callable[[], None] | None = None  # what ends the reader's request at once (set by the HTTP layer)
    ended: str | None = None  # why it ended: "dropped" | "shutdown" | "closed"
    # Its reader's request (``request_id``, ``by``), taken where it subscribes: its drop is said from another task.
    request: dict[str, str] = field(default_factory=request_fields)

    def matches(self, event: StreamEvent) -> bool:
        return (not self.jobs or event.job_id in self.jobs) and (not self.kinds or event.name in self.kinds)

    async def next(self, timeout_s: float) -> StreamEvent | None:
        """The next event; None when ``timeout_s`` passed without one (time for a keep-alive). Raises
        ``StreamEnded`` once the stream is over (replay done without ``follow``, shutdown, or dropped)."""
        if self.replay:
            await trio.lowlevel.checkpoint()
            return self.replay.popleft()
        if self._receive is None:
            raise StreamEnded(self.ended or "replayed")
        with trio.move_on_after(timeout_s):
            try:
                return await self._receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                raise StreamEnded(self.ended or "closed") from None
        return None

    def buffered(self) -> int:
        return self._receive.statistics().current_buffer_used if self._receive is not None else 0

    def close(self, why: str = "closed") -> None:
        """End this reader's stream (idempotent). Its queued events are freed at once."""
        if self.ended is None:
            self.ended = why
        self.replay.clear()
        if self._send is not None:
            self._send.close()
        if why != "shutdown" and self._receive is not None:
            # The last receive handle closed: trio drops what the queue held. (At shutdown the reader drains it.)
            self._receive.close()
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(self)


class EventLog:
    """The stream's source: an event-bus subscriber (``on_event``) that numbers, keeps and fans out events."""

    def __init__(
        self,
        boot_id: str,
        wall_clock: Callable[[], datetime],
        *,
        replay_events: int,
        client_buffer_events: int,
        max_clients: int,
    ) -> None:
        self.boot_id = boot_id
        self._clock = wall_clock
        self._ring: deque[StreamEvent] = deque(maxlen=max(1, replay_events))
        self._seq = 0
        self._buffer = max(1, client_buffer_events)
        self.max_clients = max(1, max_clients)
        self._subscriptions: set[Subscription] = set()
        self._closed = False
        self.dropped = 0  # readers dropped for not reading, since this boot

    # -- the bus's side ----------------------------------------------------------------------------------

    def on_event(self, event: JobEvent) -> None:
        """Event-bus subscriber: never blocks, never waits for a reader."""
        self._seq += 1
        item = StreamEvent(self._seq, f"{self.boot_id}-{self._seq}", event, self._clock())
        self._ring.append(item)
        for sub in list(self._subscriptions):
            if not sub.matches(item) or sub._send is None:
                continue
            try:
                sub._send.send_nowait(item)
            except trio.WouldBlock:
                self._drop(sub)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscriptions.discard(sub)

    def _drop(self, sub: Subscription) -> None:
        self.dropped += 1
        log.warning(
            "event_stream_client_dropped",
            why=f"its queue of {self._buffer} events was full: it does not read",
            jobs=sorted(sub.jobs) or None,
            **sub.request,
        )
        sub.close("dropped")
        if sub.on_drop is not None:
            sub.on_drop()

    # -- the readers' side ----------------------------------------------------------------------------------

    @property
    def last_event_id(self) -> str:
        return f"{self.boot_id}-{self._seq}"

    @property
    def clients(self) -> int:
        return len(self._subscriptions)

    def buffered(self) -> int:
        """Events queued for readers right now, over every reader."""
        return sum(sub.buffered() for sub in self._subscriptions)

    def held(self) -> int:
        return len(self._ring)

    def subscribe(
        self,
        *,
        last_event_id: str | None = None,
        jobs: Iterable[str] = (),
        kinds: Iterable[str] = (),
        backlog: bool = False,
        follow: bool = True,
    ) -> Subscription:
        """A reader of the stream. ``last_event_id``: resume after it (see the module docstring); ``backlog``
        (without ``last_event_id``): begin with every event still held; ``follow``: False ends the stream once
        the replay is done. ``jobs``/``kinds`` filter (empty: all). Raises ``ValidationError`` naming the bad
        value, ``TooManyStreams`` when every slot is taken.

        Synchronous on purpose: the replay is taken and the reader registered in one step, so no event falls
        between them or comes twice."""
        kind_set = frozenset(kinds)
        for kind in sorted(kind_set):
            if kind not in EVENT_NAMES:
                raise ValidationError(f"kind must be one of {', '.join(EVENT_NAMES)}, not {kind!r}", field="kind")
        job_set = frozenset(jobs)
        for job in job_set:
            if not job or len(job) > 200:
                raise ValidationError(f"job must be a job id, not {job!r}", field="job")
        gap: Gap | None = None
        after = self._seq  # live events only
        if last_event_id is not None:
            gap, after = self._resume_point(last_event_id)
        elif backlog:
            after = 0
        sub = Subscription(job_set, kind_set, gap, deque(), follow)
        sub.replay.extend(item for item in self._ring if item.seq > after and sub.matches(item))
        if not follow or self._closed:
            sub.ended = "shutdown" if self._closed else None
            return sub
        if len(self._subscriptions) >= self.max_clients:
            raise TooManyStreams(
                f"{self.max_clients} event streams are open already (PODCAST_JOB_EVENTS_MAX_CLIENTS): try again later"
            )
        sub._send, sub._receive = trio.open_memory_channel[StreamEvent](self._buffer)
        sub._on_close = self._subscriptions.discard
        self._subscriptions.add(sub)
        return sub

    def _resume_point(self, last_event_id: str) -> tuple[Gap | None, int]:
        """(the gap to announce, the seq after which to replay) for a reader that last saw ``last_event_id``."""
        match = _EVENT_ID.fullmatch(last_event_id.strip())
        if match is None:
            raise ValidationError(
                f"{LAST_EVENT_ID} must be an event id of this stream (<boot_id>-<n>), not {last_event_id!r}",
                field=LAST_EVENT_ID,
            )
        boot_id, seq = match.group(1), int(match.group(2))
        oldest = self._ring[0].id if self._ring else None
        if boot_id != self.boot_id:
            return Gap("restarted", last_event_id, self.boot_id, oldest), 0
        if seq > self._seq:
            raise ValidationError(
                f"{LAST_EVENT_ID} {last_event_id} is later than this stream's last event ({self.last_event_id})",
                field=LAST_EVENT_ID,
            )
        first_held = self._ring[0].seq if self._ring else self._seq + 1
        if seq < first_held - 1:
            return Gap("evicted", last_event_id, self.boot_id, oldest), seq
        return None, seq

    def close(self) -> None:
        """Shutdown: end every stream (each reader gets what its queue holds, then the end); refuse new ones."""
        self._closed = True
        for sub in list(self._subscriptions):
            sub.close("shutdown")
        self._subscriptions.clear()

    def stats(self) -> dict[str, Any]:
        return {"clients": self.clients, "buffered": self.buffered(), "held": self.held(), "dropped": self.dropped}
