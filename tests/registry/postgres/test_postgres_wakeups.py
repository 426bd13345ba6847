"""The PostgreSQL registry's wake-ups (ADR 0012 §7): ``pg_notify`` in the change's own transaction, heard by a
LISTEN session of its own (``Registry.listen``).

- a wake-up is delivered when its change commits, never for a change that rolled back (a deferred constraint
  trigger makes the commit itself fail, after the write has sent its wake-up);
- its payload is small and names what changed: a cancel names the job and the host that runs it;
- one channel per schema: a registry in another schema never wakes this one;
- a flood never grows memory: what the reader has not read is bounded, the rest dropped and counted
  (INV-NOTIFY-IS-A-HINT: the sweep is the guarantee);
- a session ended by the server (``pg_terminate_backend``) is reported as lost (``RegistryUnavailable``), never a
  silent stop; its ``application_name`` tells it apart from the pool's sessions.
"""

from __future__ import annotations

import pytest
import trio
from pg_helpers import OpenPg, Raw
from registry_helpers import BOOT, new_job

from supervisor.domain import RegistryError, RegistryUnavailable
from supervisor.registry import (
    WAKE_CANCEL,
    WAKE_PAUSE,
    WAKE_QUEUED,
    PostgresRegistry,
    PromoteRequest,
    Wakeup,
    WakeupFeed,
)

pytestmark = pytest.mark.postgres

LISTEN_APP = "podcast-job-supervisor-listen"
BOUND_S = 20.0  # a backstop for a broken server on a loaded machine, never a timing assertion


async def next_wake(feed: WakeupFeed) -> Wakeup:
    with trio.fail_after(BOUND_S):
        return await feed.receive()


async def running_on(reg: PostgresRegistry, host_id: str) -> str:
    [job_id] = [r.job.job_id for r in await reg.enqueue_many([new_job()])]
    promotion = await reg.promote(PromoteRequest(1, BOOT, ["hash"], host_id=host_id))
    assert [job.job_id for job in promotion.jobs] == [job_id]
    return job_id


async def test_INV_NOTIFY_IS_A_HINT_a_wake_up_is_delivered_on_commit_never_on_rollback(
    pg_open: OpenPg, raw: Raw
) -> None:
    reg = await pg_open()
    # The commit of an enqueue of kind "boom" fails (a deferred trigger), after the enqueue sent its wake-up.
    await raw.execute(
        f"""
        CREATE FUNCTION "{reg.schema}".refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.kind = 'boom' THEN RAISE EXCEPTION 'boom refused at commit'; END IF;
            RETURN NEW;
        END $$;
        CREATE CONSTRAINT TRIGGER refuse_boom AFTER INSERT ON "{reg.schema}".jobs DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW EXECUTE FUNCTION "{reg.schema}".refuse_boom();
        """
    )
    async with reg.listen() as feed:
        assert feed is not None
        with pytest.raises(RegistryError, match="boom refused at commit"):
            await reg.enqueue(new_job(kind="boom"))
        assert (await reg.counts())["queued"] == 0  # rolled back: no row
        await reg.set_paused(True, by="operator")
        # Delivered in commit order: had the rolled-back enqueue's wake-up escaped, it would come first.
        assert await next_wake(feed) == Wakeup(WAKE_PAUSE)
        await reg.enqueue(new_job(kind="k"))
        assert await next_wake(feed) == Wakeup(WAKE_QUEUED)
        assert feed.receive_nowait() is None


async def test_the_writes_other_hosts_act_on_each_send_one_small_wake_up(pg_open: OpenPg) -> None:
    reg = await pg_open()
    async with reg.listen() as feed:
        assert feed is not None
        job_id = await running_on(reg, "h1")
        assert await next_wake(feed) == Wakeup(WAKE_QUEUED)  # the enqueue; a promotion sends none
        await reg.enqueue_many([new_job(n) for n in range(50)])
        assert await next_wake(feed) == Wakeup(WAKE_QUEUED)  # one for the whole batch

        await reg.request_cancel(job_id)
        assert await next_wake(feed) == Wakeup(WAKE_CANCEL, job_id=job_id, host_id="h1")  # the job and its host
        await reg.request_cancel(job_id)  # already requested: nothing changed, nothing said

        await reg.set_paused(True, by="operator")
        await reg.set_paused(True, by="operator")  # no change: nothing said
        await reg.set_paused(False, by="operator")
        assert [await next_wake(feed), await next_wake(feed)] == [Wakeup(WAKE_PAUSE), Wakeup(WAKE_PAUSE)]
        await reg.enqueue(new_job(kind="last"))  # a marker: nothing came between
        assert await next_wake(feed) == Wakeup(WAKE_QUEUED)
        assert feed.receive_nowait() is None


async def test_each_schema_has_its_own_channel(pg_open: OpenPg) -> None:
    mine = await pg_open()
    other = await pg_open()  # another schema of the same database
    async with mine.listen() as feed:
        assert feed is not None
        await other.enqueue(new_job())
        await other.set_paused(True, by="operator")
        await mine.request_cancel((await mine.enqueue(new_job())).job.job_id)  # queued: cancelled at once
        await mine.set_paused(True, by="operator")
        assert await next_wake(feed) == Wakeup(WAKE_QUEUED)
        assert await next_wake(feed) == Wakeup(WAKE_PAUSE)  # a cancel of a queued row wakes nobody
        assert feed.receive_nowait() is None


async def test_a_flood_is_bounded_the_rest_dropped_and_counted(pg_open: OpenPg, raw: Raw) -> None:
    reg = await pg_open()
    channel = "podcast_jobs." + str(reg.schema)
    flood = 2000
    async with reg.listen() as feed:
        assert feed is not None
        # Distinct payloads (identical ones in one transaction are folded by the server), sent in one statement.
        await raw.execute(
            "SELECT pg_notify($1, json_build_object('kind', 'cancel', 'job_id', i::text)::text) "
            "FROM generate_series(1, $2) AS i",
            channel,
            flood,
        )
        await reg.set_paused(True, by="operator")  # after the flood: once it is dropped, all of it has arrived

        async def drained() -> list[Wakeup]:
            got: list[Wakeup] = []
            with trio.fail_after(BOUND_S):
                while feed.dropped + len(got) < flood + 1:
                    got.append(await feed.receive())
            return got

        got = await drained()
        assert feed.dropped > 0, "the reader kept up with 2,000 at once: the bound was not put to the test"
        assert len(got) <= 256 + 1  # held at most the buffer (and what was read while they arrived)
        assert got[0] == Wakeup(WAKE_CANCEL, job_id="1")  # the first ones are kept, later ones dropped
        assert feed.receive_nowait() is None


async def test_a_session_the_server_ends_is_reported_lost(pg_open: OpenPg, raw: Raw) -> None:
    reg = await pg_open()
    async with reg.listen() as feed:
        assert feed is not None
        await feed.check()  # its last query is the check now: the session is still found by its channel
        sessions = await raw.fetch(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
            LISTEN_APP,
        )
        # Other tests' sessions listen too (on their own schemas' channels): only this one's is ended.
        mine = [s["pid"] for s in sessions if f"podcast_jobs.{reg.schema}" in s["query"]]
        assert len(mine) == 1, sessions
        await raw.fetch("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", mine)
        with trio.fail_after(BOUND_S), pytest.raises(RegistryUnavailable, match="listening session ended"):
            while True:
                await feed.receive()  # anything said before the end first, then the loss
        with pytest.raises(RegistryUnavailable):
            await feed.check()

    # A new session works again.
    async with reg.listen() as again:
        assert again is not None
        await reg.enqueue(new_job())
        assert await next_wake(again) == Wakeup(WAKE_QUEUED)
