"""The wake-ups' part of the contract (ADR 0012 §7): ``Registry.listen``.

A registry that one process owns (SQLite, memory) has nothing to hear: its session is None, and the supervisor's
own wakes suffice. PostgreSQL's is a LISTEN session (``tests/registry/postgres/test_postgres_wakeups.py`` says what
it hears), except behind a pooler in transaction mode, where no session stays a client's (None: the sweeps).
INV-NOTIFY-IS-A-HINT: either way, what a host decides is read from the registry, never from a wake-up."""

from __future__ import annotations

import trio

from supervisor.registry import PostgresRegistry, Registry


async def test_only_a_registry_shared_by_processes_gives_a_session_of_wake_ups(registry: Registry) -> None:
    with trio.fail_after(30):
        async with registry.listen() as feed:
            if isinstance(registry, PostgresRegistry) and not registry.transaction_pooler:
                assert feed is not None
                assert feed.dropped == 0
                assert feed.receive_nowait() is None  # nothing said yet
                await feed.check()  # the session answers
            else:
                assert feed is None
