"""The PostgreSQL registry's wake-ups: their channel and their payload (``wakeup_channel``, ``encode_wakeup``), and
one dedicated session that LISTENs on the schema's channel (``PostgresStore.notify`` sends on it), outside the pool,
so that no registry call ever borrows it and no call's failure closes it.

asyncpg calls the notification callback on the asyncio loop (trio-asyncio's, in the Trio thread); the callback hands
each wake-up to a bounded Trio memory channel with ``send_nowait``, never waiting. A reader that falls behind loses
wake-ups (they are counted, never queued without bound): INV-NOTIFY-IS-A-HINT, the sweep does the same work anyway,
so a dropped wake-up only delays, while a flood of them (a 1,000-job batch from every host at once) can never grow
this process's memory. A lost session (the server restarted, ``pg_terminate_backend``, a reset) is reported by
asyncpg's termination callback: the channel is closed, and ``receive`` raises ``RegistryUnavailable`` once what was
already received has been read. A session that hangs (a partition: no error ever comes) is found by ``check``, a
cheap query under the registry's timeout, which the caller runs every few seconds: it asks whether the session still
listens on the channel, so a session that answers but no longer listens (behind a pooler in transaction mode, each
statement may reach another server session) is lost too. Its text names the channel, so that an operator finds the
session in ``pg_stat_activity`` by its ``application_name`` and its last query, whichever of the two that is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import trio
import trio_asyncio

from ...domain import RegistryUnavailable
from .._vocabulary import WAKE_KINDS, Wakeup, WakeupFeed

# A channel name is an identifier: at most 63 bytes (NAMEDATALEN - 1); pg_notify refuses a longer one.
_CHANNEL_PREFIX = "podcast_jobs."
_MAX_CHANNEL_BYTES = 63


def wakeup_channel(schema: str) -> str:
    """The wake-up channel of the registry in ``schema``: one per schema (registries in different schemas of one
    database never wake each other), named after it when the name fits, else after a hash of it."""
    name = _CHANNEL_PREFIX + schema
    if len(name.encode()) <= _MAX_CHANNEL_BYTES:
        return name
    return f"{_CHANNEL_PREFIX}{hashlib.sha256(schema.encode()).hexdigest()[:32]}"


def encode_wakeup(wake: Wakeup) -> str:
    """A wake-up's payload: small JSON (its kind and ids only, never a row), far under the server's 8,000 bytes."""
    fields = {"kind": wake.kind, "job_id": wake.job_id, "host_id": wake.host_id}
    return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))


def decode_wakeup(payload: str) -> Wakeup | None:
    """A wake-up from its payload; None for one this version does not know (a newer host's: ignored, polling covers
    it)."""
    try:
        fields = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(fields, dict) or fields.get("kind") not in WAKE_KINDS:
        return None
    job_id, host_id = fields.get("job_id"), fields.get("host_id")
    if not isinstance(job_id, str | None) or not isinstance(host_id, str | None):
        return None
    return Wakeup(fields["kind"], job_id=job_id, host_id=host_id)


# How a listening session shows in pg_stat_activity (the pool's sessions are "podcast-job-supervisor").
LISTEN_APPLICATION_NAME = "podcast-job-supervisor-listen"
# Wake-ups held for a reader that has not read them yet, at most (each a few short strings).
WAKEUP_BUFFER = 256

_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)


class PgWakeupFeed:
    """One listening session's wake-ups (``WakeupFeed``); made by ``PostgresRegistry.listen``."""

    def __init__(self, conn: Any, channel: str, where: str, timeout_s: float) -> None:
        self._conn = conn
        # A literal, not a parameter: pg_stat_activity shows the query's text (the channel is ours, never a user's).
        literal = "'" + channel.replace("'", "''") + "'"
        self._check_query = f"SELECT {literal} IN (SELECT pg_listening_channels())"
        self._where = where
        self._timeout_s = timeout_s
        self._send, self._receive = trio.open_memory_channel[Wakeup](WAKEUP_BUFFER)
        self._dropped = 0
        self.lost_why: str | None = None

    @property
    def dropped(self) -> int:
        return self._dropped

    # -- asyncio's side: callbacks, never blocking ------------------------------------------------------

    def on_notification(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        wake = decode_wakeup(payload)
        if wake is None:
            return  # not one this version knows (a newer host's): the sweep covers whatever it meant
        try:
            self._send.send_nowait(wake)
        except trio.WouldBlock:
            # INV-NOTIFY-IS-A-HINT: dropping a hint only delays (the sweep), and keeps memory bounded.
            self._dropped += 1
        except trio.ClosedResourceError:
            pass  # lost or closed meanwhile

    def on_termination(self, conn: Any) -> None:
        if self.lost_why is None:
            self.lost_why = "the listening session ended"
        self._send.close()  # the reader gets what was received, then the loss

    # -- Trio's side --------------------------------------------------------------------------------------

    async def receive(self) -> Wakeup:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise RegistryUnavailable(f"registry {self._where}: {self.lost_why or 'not listening'}") from None

    def receive_nowait(self) -> Wakeup | None:
        try:
            return self._receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return None

    async def check(self) -> None:
        try:
            with trio.fail_after(self._timeout_s):
                listens = await trio_asyncio.aio_as_trio(self._conn.fetchval)(self._check_query)
        except trio.TooSlowError:
            self.lost_why = f"the listening session did not answer within {self._timeout_s:g} s"
        except _ERRORS as exc:
            self.lost_why = f"the listening session failed: {type(exc).__name__}: {exc}"
        else:
            if listens:
                return
            self.lost_why = "the session no longer listens (a pooler in transaction mode between it and the server?)"
        raise RegistryUnavailable(f"registry {self._where}: {self.lost_why}")


@asynccontextmanager
async def listening(dsn: str, channel: str, *, where: str, timeout_s: float) -> AsyncIterator[WakeupFeed]:
    """A session on ``dsn`` that LISTENs on ``channel``, its wake-ups in a ``PgWakeupFeed``; connecting and the LISTEN
    bounded by ``timeout_s`` (``RegistryUnavailable`` past it, or when the server refuses), closed on leaving."""
    settings = {"application_name": LISTEN_APPLICATION_NAME}
    conn: Any = None
    try:
        with trio.fail_after(timeout_s):
            conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(dsn, timeout=timeout_s, server_settings=settings)
            feed = PgWakeupFeed(conn, channel, where, timeout_s)
            conn.add_termination_listener(feed.on_termination)
            await trio_asyncio.aio_as_trio(conn.add_listener)(channel, feed.on_notification)
    except trio.TooSlowError as exc:
        _drop(conn)
        raise RegistryUnavailable(f"cannot listen on registry {where}: no answer within {timeout_s:g} s") from exc
    except _ERRORS as exc:
        _drop(conn)
        raise RegistryUnavailable(f"cannot listen on registry {where}: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        _drop(conn)
        raise
    try:
        yield feed
    finally:
        # A clean close, unless the server does not answer (then at once: no round trip to wait on).
        with trio.CancelScope(shield=True), trio.move_on_after(min(timeout_s, 2.0)) as waited:
            try:
                if not conn.is_closed():
                    await trio_asyncio.aio_as_trio(conn.close)()
            except _ERRORS:
                conn.terminate()
        if waited.cancelled_caught:
            conn.terminate()


def _drop(conn: Any) -> None:
    if conn is not None and not conn.is_closed():
        conn.terminate()
