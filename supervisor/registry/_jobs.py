"""The rules of a job's row, written once for every backend over the store port (``_tables.Store``): enqueue and
coalescing, idempotency keys, promotion into free slots under the fleet-wide, per-host and per-kind limits and the
pause (which ``_fleet`` sets), identity records, the end of a job (its resubmission, its follow-up), requeue,
cancel, stop; what the sweeper judges about a running job (absence flags, events) and the queue's watch's
announcements; and the one place a status changes, and the one place a job's event is written (the transactional
outbox). Every rule that changes a row or writes an event is here, beside those row helpers (``found``,
``update_job``, ``set_status``, ``job_event``): a write passes this module only, then the store
(``tests/registry/test_write_path.py``). The reads these rules make are here beside them.

Each public function is one operation of ``Registry`` (``_registry.py`` says which transaction it runs in), its
docstring the operation's; ``author`` (``_tables.Author``): the boot whose changes these are, named in each event.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from ..domain import (
    RELEASE,
    RESUBMITTED,
    SCHEDULE_PREFIX,
    TERMINAL,
    Attempt,
    IdempotencyKey,
    IdempotencyKeyReused,
    IllegalTransition,
    Job,
    JobNotFound,
    JobStatus,
    check_transition,
)
from . import _tables as tables
from ._tables import Author, Store, Where
from ._vocabulary import (
    BACK_IN_QUEUE,
    QUEUE_ANNOUNCED,
    SCHEDULE_TICK,
    WAKE_CANCEL,
    WAKE_QUEUED,
    Change,
    Ending,
    EnqueueResult,
    Expect,
    FleetSetting,
    IdentityClaim,
    NewJob,
    Outcome,
    PromoteRequest,
    Promotion,
    Receipt,
    Wakeup,
    log_name,
)

# -- rows ------------------------------------------------------------------------------------------------------


async def read_job(store: Store, job_id: str, *, lock: bool = False, position: bool = False) -> Job | None:
    """A row (None: none), a queued one with its queue ``position`` when asked; ``lock``: held to the end of the
    transaction where the backend locks rows."""
    rows = await store.select(tables.JOBS, (("job_id", "=", job_id),), tables.Read(lock=lock))
    if not rows:
        return None
    row, at = rows[0], None
    if position and row["status"] == tables.QUEUED:
        at = await store.count(tables.JOBS, (("status", "=", tables.QUEUED), ("seq", "<=", row["seq"])))
    return tables.job_of(row, at)


async def get(store: Store, job_id: str) -> Job:
    """One row (``JobNotFound``); a queued row carries its queue position."""
    return await found(store, job_id, lock=False)


async def found(store: Store, job_id: str, *, lock: bool) -> Job:
    """``get``, the row held where a change is to follow (``lock``)."""
    found = await read_job(store, job_id, lock=lock, position=True)
    if found is None:
        raise JobNotFound(job_id)
    return found


async def rows_of(store: Store, job_ids: Sequence[str]) -> list[Job]:
    """These rows, in this order (each must be there)."""
    rows = {row["job_id"]: row for row in await store.select(tables.JOBS, (("job_id", "in", tuple(job_ids)),))}
    return [tables.job_of(rows[job_id]) for job_id in job_ids]


async def update_job(
    store: Store, job_id: str, fields: Mapping[str, object], *, status: JobStatus | None = None
) -> int:
    """Change ``fields`` of a row (``status``: only while it has that status); how many rows changed."""
    where: Where = (("job_id", "=", job_id),) + ((("status", "=", status.value),) if status is not None else ())
    return await store.update(tables.JOBS, where, tables.stored(fields))


async def job_event(
    store: Store, author: Author, job_id: str, event: str, previous: str | None, reason: str | None
) -> None:
    """One outbox event, with the row as of the change, in the change's own transaction (the transactional outbox:
    a committed change always has its event, a rolled-back one never)."""
    if author.outbox:
        row = await read_job(store, job_id)
        assert row is not None
        await add_event(store, author, row.job_id, row.public(), event, previous, reason)


async def add_event(
    store: Store,
    author: Author,
    job_id: str,
    body: Mapping[str, Any],
    event: str,
    previous: str | None,
    reason: str | None,
) -> None:
    row = {"event_id": uuid.uuid4().hex, "job_id": job_id, "event": event, "created_at": store.now(),
           "previous_status": previous, "reason": reason, "boot_id": author.boot_id, "job": body}  # fmt: skip
    await store.insert(tables.OUTBOX, [row])


async def set_status(
    store: Store,
    author: Author,
    row: Job,
    to_status: JobStatus,
    fields: Mapping[str, object],
    *,
    reason: str | None = None,
) -> None:
    """The one place a row's status changes, with ``fields``; an illegal transition raises. Its event is written
    here too, with ``reason`` (by default ``promoted``, or the row's new ``error_reason``)."""
    check_transition(row.job_id, row.status, to_status)
    if to_status.is_terminal or to_status is JobStatus.QUEUED:
        # A job's token works only while the job runs: with its hash gone, a late (or stolen) token matches
        # nothing, and the heartbeat answers 401 exactly as for a job that never existed.
        fields = {**fields, "token_hash": None}
    if await update_job(store, row.job_id, {"status": to_status, **fields}, status=row.status) != 1:
        raise IllegalTransition(row.job_id, row.status, to_status)  # read in this transaction: cannot happen
    if reason is None:
        named = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
        reason = named if isinstance(named, str) else None
    await job_event(store, author, row.job_id, "job.transition", str(row.status), reason)


async def put_setting(store: Store, setting: FleetSetting) -> None:
    await store.put(tables.SETTINGS, asdict(setting), ("name",))  # a setting's fields are its row's columns


# -- idempotency keys (ADR 0016) -------------------------------------------------------------------------


async def replay(store: Store, key: IdempotencyKey) -> list[EnqueueResult] | None:
    """What ``key`` answered while it is live (None: it answered nothing yet), the rows as they are now; another
    request under it is ``IdempotencyKeyReused``. Under the key's lock, held to the end of the transaction: a
    retry that arrives while the first request is in its transaction waits for it, then replays it."""
    # Two requests of one key, on any host, take turns: the second reads what the first committed and replays it.
    await store.lock(tables.KEY_LOCK, key.key)
    return await answer_of(store, key)


async def answer_of(store: Store, key: IdempotencyKey) -> list[EnqueueResult] | None:
    """What ``key`` answered while it is live, the rows as they are now (``EnqueueResult.replayed``); None: it
    answered nothing yet. Another request under it is ``IdempotencyKeyReused``. tables.Read only: a caller that checks
    anything before its keyed write asks this first, so a repeat answers as the first time (INV-KEY-ONCE). (A
    request of the key still in its transaction is not seen; its own ``replay`` waits for it.)"""
    rows = await store.select(
        tables.KEYS,
        (("idempotency_key", "=", key.key), ("expires_at", ">", store.now())),
        tables.Read(order=("answer_index",)),
    )
    if not rows:
        return None
    if rows[0]["fingerprint"] != key.fingerprint:
        raise IdempotencyKeyReused(key.key)
    receipts = [Receipt(r["job_id"], JobStatus(r["status"]), r["queue_position"], r["coalesced"]) for r in rows]
    found = {row.job_id: row for row in await rows_of(store, [r.job_id for r in receipts])}
    return [EnqueueResult(found[r.job_id], r.coalesced, replayed=r) for r in receipts]


async def keep(store: Store, key: IdempotencyKey | None, results: Sequence[EnqueueResult]) -> None:
    """Record what ``key``'s request answered, in the transaction that made it (a rollback leaves the key free)."""
    if key is not None:
        now = store.now()
        receipts = [result.receipt for result in results]
        expires_at = now + timedelta(seconds=key.ttl_s)
        await store.delete(tables.KEYS, (("idempotency_key", "=", key.key),))  # only expired rows can be left
        await store.insert(tables.KEYS, [
            {"idempotency_key": key.key, "answer_index": i, "fingerprint": key.fingerprint, "job_id": r.job_id,
             "status": r.status.value, "queue_position": r.queue_position, "coalesced": r.coalesced,
             "created_at": now, "expires_at": expires_at}
            for i, r in enumerate(receipts)
        ])  # fmt: skip


# -- enqueue -------------------------------------------------------------------------------------------------


async def add(store: Store, author: Author, new: NewJob) -> tuple[str, bool]:
    """Insert a queued row, or find the queued row it coalesces into (ADR-152 §8: only a queued row absorbs an
    identical one); whether it coalesced."""
    if new.coalesce_key is not None:
        # Two enqueues of one key take turns, or both would find no queued row and both insert (PostgreSQL's READ
        # COMMITTED sees no uncommitted insert).
        await store.lock(tables.COALESCE_LOCK, new.coalesce_key)
        where = (("status", "=", tables.QUEUED), ("coalesce_key", "=", new.coalesce_key))
        found = await store.select(tables.JOBS, where, tables.Read(columns=("job_id",), order=("seq",), limit=1))
        if found:
            return found[0]["job_id"], True
    job_id = uuid.uuid4().hex
    row = {**BACK_IN_QUEUE, "job_id": job_id, "kind": new.kind, "params": dict(new.params), "argv": list(new.argv),
           "status": tables.QUEUED, "created_at": store.now(), "coalesce_key": new.coalesce_key, "attempts": 0,
           "token_hash": None, "log_path": None, "max_attempts": new.max_attempts, "next_attempt_at": None,
           "history": (), "retry_of": new.retry_of, "idempotency_key": new.idempotency_key,
           "enqueued_by": new.enqueued_by, "schedule": new.schedule.name if new.schedule else None,
           "schedule_every_s": new.schedule.every_s if new.schedule else None,
           "enqueued_release": RELEASE}  # fmt: skip
    await store.insert(tables.JOBS, [tables.stored(row)])
    await job_event(store, author, job_id, "job.transition", None, "enqueued")
    return job_id, False


async def enqueue(store: Store, author: Author, job: NewJob, *, key: IdempotencyKey | None = None) -> EnqueueResult:
    """Add a queued row (or, with a coalescing key, return the identical queued one): ``EnqueueResult.job`` is
    the row as enqueued (queued, with its position). Promotion is a step of its own (``promote``: the drainer's
    alone). With ``key``: a key that already answered this request answers it again (``EnqueueResult.replayed``)
    and nothing is written; one that answered another request raises ``IdempotencyKeyReused``; else the answer
    is kept under the key, in the same step."""
    if job.schedule is not None:
        # INV-EVERY-TICK-COUNTS: every tick the timer made is recorded, whatever it makes below (a job, a skip, a
        # coalesce, a replay of its key): the missed-run judge counts ticks, not jobs.
        tick = FleetSetting(f"{SCHEDULE_TICK}{job.schedule.name}", key.key if key else "", "", store.now())
        await put_setting(store, tick)
    if key is not None:
        replayed = await replay(store, key)
        if replayed is not None:
            return replayed[0]  # INV-KEY-ONCE: a key's request never makes a second row
        job = replace(job, idempotency_key=key.key)
    if job.schedule is not None and job.schedule.if_idle:
        # Ticks of one schedule take turns: two at once would both find it idle, and both enqueue.
        await store.lock(tables.COALESCE_LOCK, f"{SCHEDULE_PREFIX}{job.schedule.name}")
        busy = await schedule_busy(store, job.schedule.name)
        if busy is not None:
            # Skipped, and kept under no key: the same tick asked again is judged again.
            why = f"schedule {job.schedule.name}: job {busy.job_id} is {busy.status}"
            await job_event(store, author, busy.job_id, "schedule.skipped", str(busy.status), why)
            return EnqueueResult(busy, coalesced=False, skipped=True)
    job_id, coalesced = await add(store, author, job)
    if not coalesced:
        await store.notify(Wakeup(WAKE_QUEUED))
    result = EnqueueResult(await get(store, job_id), coalesced=coalesced)
    await keep(store, key, [result])
    return result


async def enqueue_many(
    store: Store, author: Author, jobs: Sequence[NewJob], *, key: IdempotencyKey | None = None
) -> list[EnqueueResult]:
    """Add several rows at once, all or nothing, in order (answers carry no queue position); ``key`` covers the
    batch, as ``enqueue``'s covers one job."""
    if key is not None:
        replayed = await replay(store, key)
        if replayed is not None:
            return replayed  # INV-KEY-ONCE
        jobs = [replace(new, idempotency_key=key.key) for new in jobs]
    added = [await add(store, author, new) for new in jobs]
    if not added:
        return []
    if not all(coalesced for _, coalesced in added):
        await store.notify(Wakeup(WAKE_QUEUED))  # one for the batch, however large
    rows = {row.job_id: row for row in await rows_of(store, [job_id for job_id, _ in added])}
    results = [EnqueueResult(rows[job_id], coalesced) for job_id, coalesced in added]
    await keep(store, key, results)
    return results


async def schedule_busy(store: Store, name: str) -> Job | None:
    """The newest job of schedule ``name`` that is queued or running, if any."""
    where = (("schedule", "=", name), ("status", "in", (tables.QUEUED, tables.RUNNING)))
    rows = await store.select(tables.JOBS, where, tables.Read(order=("-seq",), limit=1))
    return tables.job_of(rows[0]) if rows else None


# -- promotion (claim before run) and the pause --------------------------------------------------------------


async def promote(store: Store, author: Author, request: PromoteRequest) -> Promotion:
    """Flip the oldest queued rows whose backoff has passed to RUNNING, as many as slots are free
    (INV-PROMOTION-NEVER-OVERSHOOTS), each with this boot's id, ``started_at``, a token hash, ``attempts + 1`` and
    its log path; none while paused. ``Promotion.next_at``: when a row still waiting out its backoff may run, if
    this promotion left a slot free that it could have filled (None when it filled every one)."""
    if tables.pause_of(await store.select(tables.QUEUE, ())).paused:
        return Promotion(paused=True)
    promoted, slot_left = await promote_rows(store, author, request)
    # The backoff scan reads every queued row: only a promotion that left a slot it could fill needs to say when
    # a waiting row may take it. One that filled them all leaves that to the round the next end wakes.
    next_at = await next_backoff_end(store, store.now()) if slot_left else None
    return Promotion(tuple(promoted), next_at=next_at)


async def promote_rows(store: Store, author: Author, request: PromoteRequest) -> tuple[list[Job], bool]:
    """INV-PROMOTION-NEVER-OVERSHOOTS: the count and the flips in one transaction under the promotion's lock
    (SQLite's write lock; PostgreSQL's advisory lock, then READ COMMITTED counts every promotion committed
    before), so concurrent promotions in any process take turns. Each row gets this boot's id and
    ``started_at`` in the same step (INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING). The rows promoted, and whether a slot
    it could have filled is left free (too few rows ready)."""
    await store.lock(tables.PROMOTION)
    if request.host_id is not None and await store.count(tables.DRAINS, (("host_id", "=", request.host_id),)):
        return [], False  # INV-DRAIN-STOPS-PROMOTION: a drained host starts nothing new
    running = await store.select(
        tables.JOBS, (("status", "=", tables.RUNNING),), tables.Read(columns=("host_id", "kind"))
    )
    hosts = [row["host_id"] for row in running]
    free = request.free_slots(len(hosts), hosts.count(request.host_id))
    if free <= 0:
        return [], False
    now = store.now()
    promoted: list[Job] = []
    # FIFO among the rows whose backoff has passed (a resubmitted row keeps its place: its insertion order), but
    # the rows of a kind at its max_running, counted here from the running rows (INV-KIND-LIMIT-IS-A-COUNT).
    chosen = await fill(store, now, free, request.kind_limits, [row["kind"] for row in running])
    for row, token_hash in zip(chosen, request.token_hashes, strict=False):
        attempt = row.attempts + 1
        log_path = str(request.log_dir / log_name(row.job_id, attempt)) if request.log_dir is not None else None
        fields: dict[str, object] = {
            "started_at": now,
            "boot_id": request.boot_id,
            "token_hash": token_hash,
            "attempts": attempt,
            "log_path": log_path,
            "identity": None,
            "next_attempt_at": None,
            "host_id": request.host_id,
        }
        await set_status(store, author, row, JobStatus.RUNNING, fields)
        promoted.append(replace(row, status=JobStatus.RUNNING, queue_position=None, **fields))  # type: ignore[arg-type]
    return promoted, len(promoted) < free


async def fill(
    store: Store, now: datetime, free: int, limits: Mapping[str, int], running_kinds: Sequence[str]
) -> list[Job]:
    """Up to ``free`` of the oldest ready rows whose kind has room. A kind that fills up within a batch is left
    out of the next read, so a full kind never holds up the rows of other kinds, and nothing past them is read."""
    room = {kind: limit - running_kinds.count(kind) for kind, limit in limits.items()}
    chosen: list[Job] = []
    after: int | None = None
    while len(chosen) < free:
        full = tuple(sorted(kind for kind, left in room.items() if left <= 0))
        batch = await promotable(store, now, free - len(chosen), lock=True, skip_kinds=full, after=after)
        if not batch:
            break
        for row in batch:
            left = room.get(row.kind)
            if left is not None:
                if left <= 0:
                    continue  # its kind filled up within this batch
                room[row.kind] = left - 1
            chosen.append(row)
        after = batch[-1].seq
    return chosen


async def promotable(
    store: Store,
    now: datetime,
    limit: int,
    *,
    lock: bool = False,
    skip_kinds: tuple[str, ...] = (),
    after: int | None = None,
) -> list[Job]:
    """The oldest queued rows whose backoff has passed (of no kind in ``skip_kinds``; past the row ``after``, by
    ``seq``). Locked (a promotion's): a row a concurrent cancel is ending is waited for, then skipped if no longer
    queued; a plain read (the queue's watch) locks nothing."""
    ready = tables.Either(((("not_before", "=", None),), (("not_before", "<=", now),)))
    where: Where = (("status", "=", tables.QUEUED), ready)
    if skip_kinds:
        where += (("kind", "not in", skip_kinds),)
    if after is not None:
        where += (("seq", ">", after),)
    rows = await store.select(tables.JOBS, where, tables.Read(order=("seq",), limit=limit, lock=lock))
    return [tables.job_of(row) for row in rows]


async def oldest_waiting(store: Store, kind_limits: Mapping[str, int] = MappingProxyType({})) -> Job | None:
    """The queued row that runs next (FIFO among those whose backoff has passed and whose kind is below its
    ``kind_limits``: each kind's max_running, counted from the running rows as a promotion counts them), or None:
    how long the queue has made a job wait (docs/operations.md § The queue's watch). Rows of a full kind are not
    waiting on the queue but on their kind."""
    running = await store.tally(tables.JOBS, "kind", (("status", "=", tables.RUNNING),)) if kind_limits else {}
    full = tuple(sorted(kind for kind, limit in kind_limits.items() if running.get(kind, 0) >= limit))
    rows = await promotable(store, store.now(), 1, skip_kinds=full)
    return rows[0] if rows else None


async def next_backoff_end(store: Store, now: datetime) -> datetime | None:
    waiting = (("status", "=", tables.QUEUED), ("not_before", ">", now))
    rows = await store.select(
        tables.JOBS, waiting, tables.Read(columns=("not_before",), order=("not_before",), limit=1)
    )
    return rows[0]["not_before"] if rows else None


async def record_identities(store: Store, claims: Sequence[IdentityClaim]) -> list[Job]:
    """Record started jobs' identities (a row no longer RUNNING is left alone); the rows after it, in order."""
    out = []
    for claim in claims:
        await update_job(store, claim.job_id, {"identity": claim.identity}, status=JobStatus.RUNNING)
        out.append(await get(store, claim.job_id))
    return out


# -- ends ----------------------------------------------------------------------------------------------------


async def finalize(
    store: Store, author: Author, job_id: str, ending: Ending, *, expect: Expect | None = None
) -> Change:
    """End a RUNNING row as ``ending`` says (a terminal row is left alone: ``changed=False``; so is a row whose
    identity is not ``expect``'s, and, with ``expect.host_silent``, a row whose host's lease is live at the
    registry's clock). Ending a queued row raises ``IllegalTransition``."""
    row = await found(store, job_id, lock=True)
    if row.status.is_terminal:
        return Change(row, changed=False)
    if expect is not None and row.identity != expect.identity:
        return Change(row, changed=False)  # the evidence was about another process than the row records now
    if expect is not None and expect.host_silent and await _host_live(store, row.host_id):
        return Change(row, changed=False)  # INV-SILENT-HOST-ENDS-BY-PROOF: it is back, its rows its own
    # INV-STOP-REASON-BEFORE-SIGNAL: a stop the supervisor began is on the row; it ends as planned, whoever ends it.
    ending = ending.for_stop(row.stop_reason)
    chosen = ending.chosen(row.cancel_requested)
    if row.status is not JobStatus.RUNNING:
        raise IllegalTransition(job_id, row.status, chosen.status)  # only a running job ends this way
    assert chosen.status in TERMINAL
    if ending.retry is not None and chosen is ending.outcome:
        return await _resubmit(store, author, row, ending, chosen)
    # A plain end notifies nobody: the host that ran the job (only it finalizes its jobs, INV-OWNER-JUDGES) wakes
    # its own drainer for the slot it freed (ADR 0012).
    ended = {"error_reason": chosen.reason, "exit_code": ending.exit_code, "ended_at": store.now()}
    await set_status(store, author, row, chosen.status, ended)
    after = replace(row, status=chosen.status, token_hash=None, queue_position=None, **ended)  # type: ignore[arg-type]
    follow_up = None
    if ending.then is not None and chosen.status is JobStatus.SUCCEEDED:
        follow_up = await enqueue(store, author, ending.then, key=ending.then_key)
    return Change(after, changed=True, previous=row.status, follow_up=follow_up)


async def _host_live(store: Store, host_id: str | None) -> bool:
    """Whether ``host_id`` holds a live lease now, read under the leases' lock: no renewal commits between this
    check and the end that depends on it."""
    if host_id is None:
        return False
    await store.lock(tables.LEASES)
    rows = await store.select(tables.HOSTS, (("host_id", "=", host_id),))
    return bool(rows) and tables.host_of(rows[0], await store.lease_now()).live


async def _resubmit(store: Store, author: Author, row: Job, ending: Ending, chosen: Outcome) -> Change:
    """Resubmitted (ADR-150 D4): the attempt's outcome into the history and the row back to the queue, in one
    transaction, so a crash between them can neither lose the job nor make it twice."""
    assert ending.retry is not None
    attempt = Attempt(row.attempts, row.started_at, store.now(), chosen.status, chosen.reason, ending.exit_code)
    fields = {
        **BACK_IN_QUEUE,
        "next_attempt_at": ending.retry.not_before.astimezone(UTC),
        "history": (*row.history, attempt),
    }
    await set_status(store, author, row, JobStatus.QUEUED, fields, reason=RESUBMITTED + ending.retry.why)
    await store.notify(Wakeup(WAKE_QUEUED))  # any host may run it once its backoff has passed
    return Change(await get(store, row.job_id), changed=True, previous=row.status)


async def requeue(store: Store, author: Author, job_id: str, *, expect: Expect, reason: str) -> Change:
    """A RUNNING row whose start provably never happened goes back to the head of the queue: ``queued`` again
    with its job id and its place, the start not counted in ``attempts``. Only if the row still records
    ``expect``'s identity (changed=False otherwise, or when it is not running). A row whose cancel was requested
    ends ``cancelled`` instead (``cancelled_before_start`` if it never ran), the start still not counted."""
    row = await found(store, job_id, lock=True)
    if row.status is not JobStatus.RUNNING or row.identity != expect.identity:
        return Change(row, changed=False)
    # Its start never happened: it does not count, and it keeps its place (the head of the queue: every row
    # still queued was enqueued after it, or it would have been promoted first).
    attempts = max(0, row.attempts - 1)
    if row.cancel_requested:
        # A cancel asked while its start was under way is carried out here, as for a queued row: a requeue never
        # drops an operator's cancel, whoever held the start in memory (the start never happened: nothing runs).
        ended = {"error_reason": "cancelled_before_start" if attempts == 0 else "cancelled",
                 "ended_at": store.now(), "attempts": attempts}  # fmt: skip
        await set_status(store, author, row, JobStatus.CANCELLED, ended)
        return Change(await get(store, job_id), changed=True, previous=row.status)
    fields = {**BACK_IN_QUEUE, "attempts": attempts}
    await set_status(store, author, row, JobStatus.QUEUED, fields, reason=reason)
    await store.notify(Wakeup(WAKE_QUEUED))
    return Change(await get(store, job_id), changed=True, previous=row.status)


async def request_cancel(store: Store, author: Author, job_id: str, by: str | None = None) -> Change:
    """A queued row ends ``cancelled/cancelled_before_start`` at once; a running row is marked
    ``cancel_requested`` (its process is stopped by whoever watches it); a terminal row is left alone. ``by``:
    who asked (``cancelled_by``, kept from the first request that changed the row)."""
    row = await found(store, job_id, lock=True)
    if row.status is JobStatus.QUEUED:
        # A job waiting out its backoff has run before: it is simply cancelled.
        outcome = Outcome(JobStatus.CANCELLED, "cancelled_before_start" if row.attempts == 0 else "cancelled")
        ended = {"error_reason": outcome.reason, "ended_at": store.now(), "cancelled_by": by}
        await set_status(store, author, row, outcome.status, ended)
        return Change(await get(store, job_id), changed=True, previous=row.status)
    if row.status is JobStatus.RUNNING and not row.cancel_requested:
        await update_job(store, job_id, {"cancel_requested": True, "cancelled_by": by})
        # The host that runs it carries it out now (woken), or at its next sweep (INV-OWNER-JUDGES).
        await store.notify(Wakeup(WAKE_CANCEL, job_id=job_id, host_id=row.host_id))
        return Change(await get(store, job_id), changed=True)
    return Change(row, changed=False)


async def request_stop(store: Store, job_id: str, why: str, *, expect: Expect) -> Change:
    """Record on a RUNNING row that the supervisor begins to stop it, and ``why`` (``Job.stop_reason``): from then
    on ``finalize`` ends it as ``Ending.if_stopped[why]`` says, whichever boot records its end. Only if the row
    still records ``expect``'s identity; a row that records a stop already keeps its first reason. The row after
    it (``changed=False`` when nothing was written: the caller reads the row to see whether a stop is on it)."""
    row = await found(store, job_id, lock=True)
    if row.status is not JobStatus.RUNNING or row.identity != expect.identity:
        return Change(row, changed=False)
    if row.stop_reason is not None:
        return Change(row, changed=False)  # the first stop's reason stands
    await update_job(store, job_id, {"stop_reason": why}, status=JobStatus.RUNNING)
    return Change(replace(row, stop_reason=why), changed=True)


# -- what the sweeper judges about a running job, and the queue's watch -----------------------------------------


async def set_absence(
    store: Store, author: Author, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
) -> Change:
    """Record the sweeper's absence flags on a RUNNING row with ``events`` ((name, reason) pairs);
    ``stalled_since`` is set when ``stalled`` turns on. A judgement that changes nothing writes nothing."""
    row = await found(store, job_id, lock=True)
    if row.status is not JobStatus.RUNNING or (row.stalled, row.silent) == (stalled, silent):
        return Change(row, changed=False)
    since = row.stalled_since if row.stalled and stalled else (store.now() if stalled else None)
    fields = {"stalled": stalled, "stalled_since": since, "silent": silent}
    await update_job(store, job_id, fields, status=JobStatus.RUNNING)
    for event, reason in events:
        await job_event(store, author, job_id, event, str(row.status), reason)
    return Change(replace(row, **fields), changed=True)  # type: ignore[arg-type]


async def record_event(store: Store, author: Author, job_id: str, event: str, reason: str | None) -> Job:
    """Write an event about a change the row does not show (this boot adopted the job); none for a finished row
    (its end is its last event). The row as it is."""
    row = await found(store, job_id, lock=True)
    if not row.status.is_terminal:
        # A finished row's last event is its end: nothing said about its process (an adoption) comes after it.
        await job_event(store, author, job_id, event, str(row.status), reason)
    return row


async def record_queue_event(
    store: Store,
    author: Author,
    event: str,
    *,
    host_id: str,
    job_id: str,
    details: Mapping[str, Any],
    reason: str,
    announced: str,
    setting: str | None = None,
) -> None:
    """The queue's watch (docs/operations.md § The queue's watch): ``event`` (``queue.stuck``, ``queue.moving``)
    about this host's queue, its ``details`` the body receivers get, into the outbox (when events are written), and
    ``announced`` recorded as this host's announced state (``queue_stuck/<host>``: the stuck queue announced, empty
    once it moved), in one step: a boot after a restart does not say a condition that still holds twice.
    ``setting``: where else the announcement is recorded (a missed schedule's ``schedule_missed/<name>``)."""
    if author.outbox:
        await add_event(store, author, job_id, details, event, None, reason)
    where = setting if setting is not None else f"{QUEUE_ANNOUNCED}{host_id}"
    await put_setting(store, FleetSetting(where, announced, host_id, store.now()))
