"""The webhook sender (ADR 0002 D10): delivers the registry's outbox to ``PODCAST_JOB_WEBHOOK_URL``.

One task in the root nursery. It reads the outbox in the order events were written (so every job's events arrive
in the order of its changes), POSTs each body as it was stored, and deletes it once the receiver answered 2xx:
delivery is at least once (a crash between the answer and the delete sends it again; receivers dedupe on
``event_id``), and survives restarts because the outbox is in the registry.

Nothing here can delay a transition: the events were committed with their changes; this task only reads and
deletes rows, in short transactions, and never holds one across a request. A receiver that is down, hangs,
answers 500 or redirects (redirects are not followed: a redirect loop is one failed attempt) costs one bounded
attempt, then a capped exponential backoff before the same event is tried again; later events wait behind it, in
order. Only the answer's status matters: its body is read only when its framing bounds it to
``RESPONSE_BODY_MAX_BYTES`` (no body, or a ``Content-Length`` within it), so a receiver answering with a huge or
endless body costs no memory; such a body is left unread and its connection closed.

The outbox is bounded by age and count (``webhook_outbox_max_age_s``, ``webhook_outbox_max_events``): events past
either bound are dropped, counted (``outcomes["dropped"]``) and logged, never silently. The bounds hold during a
backoff too (events keep coming while the receiver is down): applied at most once a second while events arrive.

Signature: with ``PODCAST_JOB_WEBHOOK_SECRET``, each attempt is signed to the Standard Webhooks specification, so a
receiver verifies it with a maintained library: ``webhook-id`` (the event's ``event_id``, the same at every attempt),
``webhook-timestamp`` (the attempt's send time, Unix seconds: a replay is refused by its age) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<raw body>">`` under ``domain.webhook_signing_key``.
The home-made ``X-Podcast-Signature: sha256=<hex HMAC-SHA256 of the raw body>`` (keyed by the secret's UTF-8 bytes,
as before) is sent beside it for one release, deprecated (docs/api.md § Webhooks).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import time
from collections import Counter
from typing import Any, Protocol

import httpx
import trio

from ..domain import Config, ConfigError, Doorbell, RegistryError, to_iso, webhook_signing_key
from ..registry import OutboxEvent, Registry
from ._events import JobEvent
from ._logging import get_logger

log = get_logger()

SIGNATURE_HEADER = "X-Podcast-Signature"  # deprecated: the standard headers below replace it
TIMESTAMP_HEADER = "X-Podcast-Timestamp"
# Standard Webhooks (https://www.standardwebhooks.com/): what every receiver library reads.
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
EVENT_ID_HEADER = "X-Podcast-Event-Id"
EVENT_HEADER = "X-Podcast-Event"
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0
BATCH = 100  # events read from the outbox at once
PRUNE_EVERY_S = 1.0  # how often the sender applies the outbox bounds, at most
# Of a receiver's answer only the status counts: a body announced within this size is read (so that the keep-alive
# connection can carry the next event); a longer or unannounced (chunked) one never is.
RESPONSE_BODY_MAX_BYTES = 64 * 1024


def sign(secret: str, body: bytes) -> str:
    """The deprecated ``X-Podcast-Signature`` value for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def sign_standard(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks ``webhook-signature`` value: ``v1,`` and the base64 HMAC-SHA256 under ``key`` of
    ``<msg_id>.<timestamp>.<body>``, the body byte for byte as sent."""
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


QUEUE_EVENT_PREFIX = "queue."  # queue.stuck, queue.moving: the queue's watch (core/_queue_watch.py)


def render_event(item: OutboxEvent) -> bytes:
    """The JSON a receiver gets for an event: the same bytes at every attempt (keys sorted, no spaces), so a
    signature and a receiver's dedupe on ``event_id`` hold across retries and restarts."""
    body = {
        "event_id": item.event_id,
        "event": item.event,
        "job": dict(item.job),
        "previous_status": item.previous_status,
        "reason": item.reason,
        "boot_id": item.boot_id,
        "ts": to_iso(item.created_at),
    }
    if item.event.startswith(QUEUE_EVENT_PREFIX):
        # A queue's event (docs/operations.md § The queue's watch) is about a host's queue, not a job: its details in
        # place of a row.
        body["queue"] = body.pop("job")
        del body["previous_status"]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def backoff_s(failures: int, *, first_s: float = BACKOFF_FIRST_S, cap_s: float = BACKOFF_MAX_S) -> float:
    """Seconds to wait after ``failures`` consecutive failed attempts: 1, 2, 4, ... capped."""
    return float(min(cap_s, first_s * 2 ** min(64, max(0, failures - 1))))


class Lead(Protocol):
    """Whether this process holds the fleet's once-only duties now (the core's ``Standing``: a fleet's leader, or a
    standalone boot): the outbox is sent by one process only."""

    def may_lead(self) -> bool: ...


class WebhookSender:
    """Delivers the outbox. ``outcomes`` counts attempts by outcome: delivered, failed, dropped."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        *,
        poll_s: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        lead: Lead,
    ) -> None:
        """``lead``: whether this process sends now (a fleet's leader does; the others leave the outbox to it).
        No default: a gate is opened by whoever knows, never by omission."""
        self.config = config
        self.registry = registry
        self._lead = lead
        # Another process may write events (an enqueue straight into the registry): look at least this often.
        self.poll_s = poll_s if poll_s is not None else config.sweep_interval_s
        self._transport = transport
        self._key = _signing_key(config)
        self._wake = Doorbell()
        self._next_prune = -math.inf
        self.outcomes: Counter[str] = Counter()
        self._failures = 0  # consecutive failed attempts of the event at the head of the outbox
        self._registry_down = False  # the last outbox call failed: said once until one answers

    def wake(self, event: JobEvent | None = None) -> None:
        """Event-bus subscriber: a new event is in the outbox. Never blocks."""
        self._wake.ring()

    async def _wait(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._wake.wait()

    async def _prune_if_due(self) -> None:
        """Apply the outbox bounds, at most once a second (not at every wake: a registry call per job change)."""
        if trio.current_time() >= self._next_prune:
            await self._prune()
            self._next_prune = trio.current_time() + PRUNE_EVERY_S

    async def _back_off(self, seconds: float) -> None:
        """Wait ``seconds`` before the failed event is tried again. Events written meanwhile (a receiver down for
        minutes while jobs change) still meet the outbox bounds: INV-OUTBOX-BOUNDED holds during a backoff too."""
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            with trio.move_on_at(deadline):
                await self._wake.wait()
            await trio.sleep_until(min(deadline, self._next_prune))
            await self._prune_if_due()

    async def _prune(self, *, max_events: int | None = None, why: str = "over the outbox bounds") -> None:
        result = await self.registry.outbox_prune(
            max_events=self.config.webhook_outbox_max_events if max_events is None else max_events,
            max_age_s=self.config.webhook_outbox_max_age_s,
        )
        if result.dropped:
            self.outcomes["dropped"] += result.dropped
            log.warning(
                "webhook_events_dropped",
                by_age=result.by_age,
                by_count=result.by_count,
                why=why,
                max_events=self.config.webhook_outbox_max_events,
                max_age_s=self.config.webhook_outbox_max_age_s,
            )

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        url = self.config.webhook_url
        if url is None:
            task_status.started()
            # Other processes may still write events: nothing will send them, so they are dropped (counted). This
            # process writes none (its outbox is off), so the bus's wakes are no reason to look: only the clock is.
            # (Looking at every wake cost a registry call per job change: 6 % of the CPU under the enqueue load of
            # docs/performance.md.)
            while True:
                if self._lead.may_lead():  # only the fleet's leader drops what nothing will send
                    try:
                        await self._prune(max_events=0, why="no PODCAST_JOB_WEBHOOK_URL is set")
                    except RegistryError as exc:
                        self._registry_failed(exc)
                    else:
                        self._registry_answered()
                else:
                    self._stood_down()
                await trio.sleep(self.poll_s)
        timeout = httpx.Timeout(self.config.webhook_timeout_s)
        async with httpx.AsyncClient(
            timeout=timeout, transport=self._transport, follow_redirects=False, trust_env=False
        ) as client:
            task_status.started()
            while True:
                if not self._lead.may_lead():
                    # INV-ONE-LEADER: another host sends (in order); look again when woken or after a poll.
                    self._stood_down()
                    await self._wait(self.poll_s)
                    continue
                try:
                    await self._send_some(client, url, timeout)
                except RegistryError as exc:
                    # The registry cannot be reached (a partition, a database restart): the events wait in the
                    # outbox, in order; a delivered one whose delete failed is sent again (receivers dedupe by id).
                    self._registry_failed(exc)
                    await self._wait(self.poll_s)
                else:
                    self._registry_answered()

    async def _send_some(self, client: httpx.AsyncClient, url: str, transport_timeout: httpx.Timeout) -> None:
        """One batch of the outbox, in order, each event until it is delivered or a backoff ends the batch."""
        await self._prune_if_due()
        batch = await self.registry.outbox_pending(BATCH)
        if not batch:
            await self._wait(self.poll_s)
            return
        for item in batch:
            if await self._deliver(client, url, transport_timeout, item, self._failures + 1):
                self._failures = 0
                self.outcomes["delivered"] += 1
                await self.registry.outbox_delete([item.seq])
                continue
            self._failures += 1
            self.outcomes["failed"] += 1
            await self._back_off(backoff_s(self._failures))  # the same event again after the backoff, in order
            break

    def _registry_failed(self, exc: RegistryError) -> None:
        """Said once per episode (the registry says its own failing writes); the sender never ends for it."""
        if not self._registry_down:
            log.warning("webhook_outbox_unreachable", error=str(exc), retry_every_s=self.poll_s)
        self._registry_down = True

    def _registry_answered(self) -> None:
        if self._registry_down:
            log.info("webhook_outbox_reachable")
        self._registry_down = False

    def _stood_down(self) -> None:
        """This host no longer sends (it lost the lead, as every host does when the database is down longer than a
        lease): an unreachable outbox said here is no longer this host's to watch, and the episode ends here, once.
        Without this line it stayed open for good -- a WARNING never followed by its end."""
        if self._registry_down:
            log.info("webhook_outbox_left_to_leader", why="another host leads: it reads and sends the outbox")
        self._registry_down = False

    async def _deliver(
        self, client: httpx.AsyncClient, url: str, transport_timeout: httpx.Timeout, item: OutboxEvent, attempt: int
    ) -> bool:
        body = render_event(item)
        sent_at = int(time.time())  # each attempt is signed anew: a receiver refuses an old one as a replay
        headers = {
            "Content-Type": "application/json",
            EVENT_ID_HEADER: item.event_id,
            EVENT_HEADER: item.event,
            TIMESTAMP_HEADER: str(sent_at),
            STANDARD_ID_HEADER: item.event_id,
            STANDARD_TIMESTAMP_HEADER: str(sent_at),
        }
        if self._key is not None and self.config.webhook_secret:
            headers[STANDARD_SIGNATURE_HEADER] = sign_standard(self._key, item.event_id, sent_at, body)
            headers[SIGNATURE_HEADER] = sign(self.config.webhook_secret, body)
        problem: str | None = None
        # The transport timeout bounds each phase; this bounds the whole attempt (a receiver dripping its answer).
        with trio.move_on_after(2 * self.config.webhook_timeout_s) as scope:
            try:
                async with client.stream(
                    "POST", url, content=body, headers=headers, timeout=transport_timeout
                ) as response:
                    # INV-WEBHOOK-ANSWER-BOUNDED: a body is read only when its framing bounds it to the cap (then
                    # the connection carries the next event); any other is left unread, and its connection closed.
                    if _small_body(response):
                        await response.aread()
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= response.status_code < 300:
                    return True
                problem = f"HTTP {response.status_code}"
        if scope.cancelled_caught:
            problem = f"no answer within {2 * self.config.webhook_timeout_s} s"
        log.warning(
            "webhook_delivery_failed",
            event_id=item.event_id,
            job_id=item.job_id,
            job_event=item.event,
            attempt=attempt,
            error=problem,
            retry_in_s=backoff_s(attempt),
        )
        return False


def _signing_key(config: Config) -> bytes | None:
    """The key, read once at start. The settings refuse a bad ``whsec_`` secret before this; an embedder's own
    ``Config`` meets the same refusal here, as a ``ConfigError`` naming the setting."""
    if not config.webhook_secret:
        return None
    try:
        return webhook_signing_key(config.webhook_secret)
    except ValueError as exc:
        raise ConfigError([f"webhook_secret: {exc}"]) from None


def _small_body(response: httpx.Response) -> bool:
    """Whether the answer's framing bounds its body to ``RESPONSE_BODY_MAX_BYTES``: none by its status, or a
    ``Content-Length`` within the cap (h11 reads no byte past it)."""
    if response.status_code in (204, 304):
        return True
    length = response.headers.get("Content-Length", "")
    return length.isdigit() and int(length) <= RESPONSE_BODY_MAX_BYTES
