"""What keeps the registry bounded, written once over the store port: retention of finished rows, expired
idempotency keys, the outbox (its reads, its bound); and the reads these rules make.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from ..domain import JobStatus
from . import _tables as tables
from ._tables import Either, Read, Store, Where
from ._vocabulary import OutboxEvent, PrunedJob, PruneResult, check_prune

# -- retention -----------------------------------------------------------------------------------------------


async def prune_jobs(
    store: Store, ended_before: datetime | None, keep_latest: int | None, limit: int, *, remove: bool
) -> list[PrunedJob]:
    """The finished rows a prune takes (``Registry.prune_jobs``): each that ended before ``ended_before``, and
    each older than the newest ``keep_latest`` finished ones; never one with an event still in the outbox.
    ``remove``: removed in this step (else only chosen)."""
    check_prune(keep_latest, limit)
    edge = await finished_edge(store, keep_latest) if keep_latest is not None else None
    if ended_before is None and edge is None:
        return []
    # Locked when removed: two supervisors pruning at once take different rows (where the backend locks rows).
    gone = await prunable(store, ended_before, edge, limit, lock=remove)
    if remove and gone:
        await store.delete(tables.JOBS, (("job_id", "in", tuple(job.job_id for job in gone)),))
    return gone


async def finished_edge(store: Store, keep_latest: int) -> tuple[datetime, int] | None:
    """The newest finished row past the ``keep_latest`` newest ones: (its ``ended_at``, its ``seq``)."""
    order = ("-ended_at", "-seq")
    rows = await store.select(
        tables.JOBS, tables.FINISHED, Read(columns=("ended_at", "seq"), order=order, limit=1, offset=keep_latest)
    )
    return (rows[0]["ended_at"], rows[0]["seq"]) if rows else None


async def prunable(
    store: Store, ended_before: datetime | None, edge: tuple[datetime, int] | None, limit: int, *, lock: bool
) -> list[PrunedJob]:
    """The oldest finished rows (by ``ended_at``, then insertion) that ended before ``ended_before`` or are at most
    ``edge``, none with an event in the outbox or a live key's answer, at most ``limit``. ``lock``: each is held
    (another prune skips it) before it is checked, so no event is written for it after the check (every change
    locks its row before it writes its event)."""
    rules: list[Where] = []
    if ended_before is not None:
        rules.append((("ended_at", "<", ended_before),))
    if edge is not None:
        rules += [(("ended_at", "<", edge[0]),), (("ended_at", "=", edge[0]), ("seq", "<=", edge[1]))]
    found: list[PrunedJob] = []
    after: Where = ()
    columns = ("job_id", "kind", "status", "ended_at", "log_path", "attempts", "seq")
    while len(found) < limit:
        where = (*tables.FINISHED, Either(tuple(rules)), *after)
        rows = await store.select(
            tables.JOBS,
            where,
            Read(columns=columns, order=("ended_at", "seq"), limit=limit, lock=lock, skip_locked=lock),
        )
        ids = tuple(row["job_id"] for row in rows)
        events = await store.select(tables.OUTBOX, (("job_id", "in", ids),), Read(columns=("job_id",))) if ids else []
        kept = {row["job_id"] for row in events} | (await keyed(store, ids) if ids else set())
        found += [PrunedJob(r["job_id"], r["kind"], JobStatus(r["status"]), r["ended_at"], r["log_path"], r["attempts"])
                  for r in rows if r["job_id"] not in kept]  # fmt: skip
        if len(rows) < limit:
            break
        end, seq = rows[-1]["ended_at"], rows[-1]["seq"]  # the next page: the rows after the last one read
        after = (Either(((("ended_at", ">", end),), (("ended_at", "=", end), ("seq", ">", seq)))),)
    return found[:limit]


# -- idempotency keys (ADR 0016) -----------------------------------------------------------------------------


async def keyed(store: Store, job_ids: Sequence[str] | None = None, key: str | None = None) -> set[str]:
    """The jobs live keys answered (among ``job_ids``; ``key``: that key's alone)."""
    where: Where = (("expires_at", ">", store.now()),)
    where += (("job_id", "in", tuple(job_ids)),) if job_ids is not None else ()
    where += (("idempotency_key", "=", key),) if key is not None else ()
    return {row["job_id"] for row in await store.select(tables.KEYS, where, Read(columns=("job_id",)))}


async def expire_keys(store: Store, *, limit: int = 1000) -> int:
    """Remove up to ``limit`` rows of expired idempotency keys (the retention sweep's; the jobs they answered may
    be pruned after); how many went."""
    expired = await store.select(
        tables.KEYS, (("expires_at", "<=", store.now()),), Read(columns=("idempotency_key",), limit=limit)
    )
    keys = tuple({row["idempotency_key"] for row in expired})
    return await store.delete(tables.KEYS, (("idempotency_key", "in", keys),)) if keys else 0


# -- the outbox ----------------------------------------------------------------------------------------------


async def outbox_pending(store: Store, limit: int) -> list[OutboxEvent]:
    """The oldest undelivered events, in the order they were written (``limit``: at least 1)."""
    return [OutboxEvent(**row) for row in await store.select(tables.OUTBOX, (), Read(order=("seq",), limit=limit))]


async def outbox_depth(store: Store) -> int:
    """How many events wait."""
    return await store.count(tables.OUTBOX)


async def outbox_delete(store: Store, seqs: Sequence[int]) -> None:
    await store.delete(tables.OUTBOX, (("seq", "in", tuple(seqs)),))


async def outbox_over(store: Store, max_events: int, max_age_s: float) -> bool:
    """Whether ``outbox_prune`` would drop anything (so that a prune with nothing to do writes nothing)."""
    oldest = await store.select(tables.OUTBOX, (), Read(columns=("created_at",), order=("created_at",), limit=1))
    count = await store.count(tables.OUTBOX)
    return count > max_events or (bool(oldest) and oldest[0]["created_at"] < store.now() - timedelta(seconds=max_age_s))


async def outbox_prune(store: Store, max_events: int, max_age_s: float) -> PruneResult:
    """Drop events older than ``max_age_s`` (one exactly that old is kept) and, past ``max_events``, the oldest."""
    by_age = await store.delete(tables.OUTBOX, (("created_at", "<", store.now() - timedelta(seconds=max_age_s)),))
    excess = await store.count(tables.OUTBOX) - max_events
    by_count = 0
    if excess > 0:  # the oldest go: every event up to the one at ``excess``
        [last] = await store.select(
            tables.OUTBOX, (), Read(columns=("seq",), order=("seq",), limit=1, offset=excess - 1)
        )
        by_count = await store.delete(tables.OUTBOX, (("seq", "<=", last["seq"]),))
    return PruneResult(by_age, by_count)
