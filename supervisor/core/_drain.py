"""The drainer: the one task that promotes queued jobs and starts them, and the one way a job is started.

Every promotion goes through it, for every executor: an enqueue, a job's end, a cancel, a resume and the sweeper
only wake it (many wakes make one drain). A round asks the executor whether it can start jobs at all (an engine
that does not answer holds the queue instead of failing every job it would start), promotes as many queued rows
as slots are free in one registry step (INV-PROMOTION-NEVER-OVERSHOOTS; none while paused), starts them together,
records their identities in one write, and hands each to its monitor in the job nursery.

``EngineHold`` says whether the executor may be asked now. A held queue is asked again after 0.5 s, doubling to
``HOLD_RETRY_MAX_S`` (and at every sweep): the drainer wakes
itself for it, so the queue moves as soon as the engine answers. A start the engine could not make after all (it
stopped answering between the probe and the start: ``ExecutorUnavailable``) puts its job back at the head of the
queue, the start not counted, and holds the queue the same way (ADR 0005 §8).
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from ..domain import (
    Doorbell,
    ExecutorUnavailable,
    Job,
    JobStatus,
    SpawnError,
    StartOutcomeUnknown,
    SupervisorError,
    hash_token,
)
from ..execution import Executor, JobHandle, Launch
from ..observe import get_logger
from ..registry import Ending, Expect, IdentityClaim, Outcome, PromoteRequest
from ._boot import Boot, boundary, log_failure, until_recorded
from ._pause import PauseFile
from ._ports import MonitorStarts
from ._rules import ENGINE_UNAVAILABLE

log = get_logger()

PROMOTE_BATCH = 64  # rows promoted in one registry step, at most
MIN_BACKOFF_WAIT_S = 0.01
HOLD_RETRY_MIN_S = 0.5  # a held queue asks the executor again after this, doubling up to HOLD_RETRY_MAX_S
HOLD_RETRY_MAX_S = 10.0
LEASE_NOT_FRESH = "host_lease_not_fresh"  # a promotion undone: the lease went stale while it was under way
PAUSE_FILE_APPEARED = "pause_file_appeared"  # a promotion undone: the pause file appeared while it was under way


class Drainer:
    """See the module docstring. ``wanted``: the bell everyone who may free a slot or queue a job rings (``wake``),
    the drainer alone waits on; ``monitors`` watch a started job (``Monitors.start``); ``pause_file``: the
    operator's, looked at before each promotion; ``heartbeat_base_url``: how jobs reach the HTTP API for their
    heartbeats (None: they are given no URL)."""

    def __init__(
        self,
        boot: Boot,
        wanted: Doorbell,
        monitors: MonitorStarts,
        pause_file: PauseFile,
        heartbeat_base_url: str | None = None,
    ) -> None:
        self.boot = boot
        self.pause_file = pause_file
        self._monitors = monitors
        self._lock = trio.Lock()
        self._wanted = wanted
        self._engine = EngineHold(boot.executor)
        self._lease_held = False  # holding because this host's lease is not fresh (INV-NO-PROMOTION-WITHOUT-LEASE)
        self.last_promotion_at = boot.wall_clock()  # this host's last promotion (its boot's start before any)
        self._log_dir_made = False
        self._kind_limits = boot.kinds.running_limits()  # each kind's max_running, counted by the registry's step
        self._next_at: datetime | None = None  # the earliest end of a queued row's backoff, at the last promotion
        # Rounds asked for by ``round`` (a request that moves the queue) and the last of them a round has answered.
        self._asked = 0
        self._answered = 0
        # The requests waiting for a round park here; each round's end wakes them all to look at ``_answered``. A lot
        # holds no state, so nothing is replaced under a waiter (ADR 0019).
        self._round_done = trio.lowlevel.ParkingLot()
        self._running = False  # the drainer task runs (``run``): a ``round`` is then waited for
        self.heartbeat_base_url = heartbeat_base_url

    def wake(self) -> None:
        """Ask for a drain soon; many wakes before it runs make one drain. Never blocks."""
        self._wanted.ring()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The drainer task, owned by the root nursery. Its rounds start their jobs in tasks of the job nursery, so
        that a start waiting on its executor never keeps the next round (the next job's start) waiting behind it.

        Error boundary: a condition in a round (the registry, the engine, a disk) leaves the rows as they are and is
        logged (``drain_failed``); the next wake or sweep drains again. A bug ends the supervisor."""
        self._running = True
        try:
            task_status.started()
            while True:
                # A resubmitted job waiting out its backoff is started when it may be, not at the next wake by chance;
                # a held queue asks the executor again at its retry.
                with trio.move_on_at(min(self._next_round_at(), self._engine.next_look_at())):
                    await self._wanted.wait()
                begun = self._asked  # every round() asked before this moment is answered by this round
                with boundary("drain_failed", self.boot.tally):
                    await self._drain(self._start_in_background)
                self._answered = begun
                self._round_done.unpark_all()
        finally:
            self._running = False
            self._round_done.unpark_all()  # a round() waiting now learns there is no drainer task to answer it

    async def round(self) -> None:
        """Have the drainer run a round now, and wait until one begun after this call has promoted what it could
        (their starts under way in the job nursery). What a request that moves the queue waits for: the work runs in
        the drainer's task, so a caller that goes away (a client that hangs up) cancels only this wait and never a
        promotion half started (ADR 0014). Without a drainer task (a Supervisor driven by hand) it only wakes."""
        self._asked += 1
        mine = self._asked
        self.wake()
        while self._running and self._answered < mine:
            await self._round_done.park()

    async def drain(self) -> list[Job]:
        """Promote and start while a slot is free and promotion is not paused.

        Contract: when drain returns, every promotable job has been started and its identity recorded, and no job
        has been waited for (each one's monitor runs in the job nursery).
        """
        return await self._drain(self.start_promoted)

    async def _drain(self, start: Callable[[list[Job], list[str]], Awaitable[list[Job]]]) -> list[Job]:
        self.boot.tree.nursery()  # no drain without a job nursery to hand the jobs to
        started: list[Job] = []
        async with self._lock:
            while self._lease_fresh() and await self._engine.ready():
                # The operator's switch, looked at before every promotion: it holds each one that begins after the
                # file exists, whatever the registry's mirror of it says (ADR-152 §7, docs/operations.md § Pausing).
                if await self.pause_file.look():
                    break
                tokens = [secrets.token_urlsafe(32) for _ in range(min(self.boot.max_concurrent, PROMOTE_BATCH))]
                jobs = await self._promote(tokens)
                if not jobs:
                    break
                spawned = await start(jobs, tokens)
                started.extend(spawned)
                # Every free slot is now taken, or the queue is empty: another round would only read that again.
                # Unless a start failed (its slot is free again) or the batch cap stopped this round short. A job
                # ending meanwhile wakes the drainer itself.
                capped = len(jobs) == PROMOTE_BATCH < self.boot.max_concurrent
                if not capped and len(spawned) == len(jobs):
                    break
        return started

    async def _promote(self, tokens: list[str]) -> list[Job]:
        """One promotion step for up to ``len(tokens)`` rows, held in the ledger; none when nothing was promoted, or
        when the lease went stale or the pause file appeared meanwhile (then the rows are back at the queue's head)."""
        # INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: from the promotion's commit until its rows are held in the
        # ledger, reconcile must not take them for starts that nobody holds (JobLedger.promoting).
        with self.boot.ledger.promoting():
            # INV-PROMOTION-NEVER-OVERSHOOTS: the registry counts and flips in one step; none while paused.
            promotion = await self.boot.registry.promote(self._promote_request(tokens))
            self._next_at = promotion.next_at
            # A registry write completes even when cancelled meanwhile (its commit is someone's answer): take
            # a cancel here, before anything starts. The rows promoted and never started are judged by the
            # executor's evidence (none: back to the queue), by this boot's reconcile or the next boot's.
            await trio.lowlevel.checkpoint()
            jobs = list(promotion.jobs)
            if not jobs:
                return []
            self.last_promotion_at = self.boot.wall_clock()
            # INV-NO-PROMOTION-WITHOUT-LEASE: the lease went stale while the promotion was under way (it was
            # asked while fresh). The pause file, looked at again: one that appeared between the look above
            # and the promotion's step, with a job enqueued after it, must not see that job run
            # (docs/operations.md § Pausing). Either way nothing of them has started, so back to the head of the
            # queue. Held (in the ledger) before the look's thread hop: a cancel that comes meanwhile is kept
            # (on the row and the entry), carried out once the job starts, or by the requeue if it never does.
            self.boot.ledger.hold(job.job_id for job in jobs)
            try:
                undone = LEASE_NOT_FRESH if not self._lease_fresh() else None
                if undone is None and await self.pause_file.look():
                    undone = PAUSE_FILE_APPEARED
                if undone is not None:
                    for job in jobs:
                        self.boot.announce(job, "queued", "promoted")
                        await self._defer(job, reason=undone)
            except BaseException:
                # Cancelled here: rows held but never started must not look watched; reconcile judges them
                # (no start record: back to the queue), as it does a promotion cancelled above.
                self.boot.ledger.release_each(job.job_id for job in jobs)
                raise
            if undone is not None:
                self.boot.ledger.release_each(job.job_id for job in jobs)
                return []
            return jobs

    def _promote_request(self, tokens: list[str]) -> PromoteRequest:
        """What the registry's promotion step is asked: the limits (fleet, host, kinds), and a token hash a row."""
        boot = self.boot
        return PromoteRequest(
            boot.max_concurrent,
            boot.boot_id,
            [hash_token(token) for token in tokens],
            boot.log_dir,
            boot.host_id,
            boot.config.host_max_concurrent,
            self._kind_limits,
        )

    async def _start_in_background(self, jobs: list[Job], tokens: list[str]) -> list[Job]:
        """Start the jobs in a task of their own (a failed start wakes the drainer: its slot is free again).

        Error boundary of that task: a condition (the registry failing while it records the starts) is logged
        (``job_start_failed``); the rows it left are judged by the next sweep, whose evidence finds what started."""
        trial = self._engine.held_by_start
        if trial:
            self._engine.trials += 1

        async def start_task() -> None:
            try:
                with boundary("job_start_failed", self.boot.tally, job_ids=[job.job_id for job in jobs]):
                    await self.start_promoted(jobs, tokens)
            finally:
                if trial:
                    self._engine.trials -= 1
                    self.wake()

        self.boot.tree.nursery().start_soon(start_task)
        return jobs

    def holds(self) -> set[str]:
        """The reasons this drainer holds promotion now, by ``_queue_watch.HOLD_REASONS``' names (the pause and the
        registry are read by the watch itself)."""
        out = set()
        if self._engine.held:
            out.add("engine_unreachable")
        if self._lease_held or not self.boot.standing.may_promote():
            out.add("lease_not_fresh")
        if self.boot.standing.drained:
            out.add("host_drained")
        return out

    def lease_renewed(self) -> None:
        """This host's lease is fresh again: a round held for it drains now. Never blocks."""
        if self._lease_held:
            self.wake()

    def _lease_fresh(self) -> bool:
        """INV-NO-PROMOTION-WITHOUT-LEASE: a host whose lease may have expired promotes nothing (an operator may
        forget it meanwhile and its rows run elsewhere). Said once per episode; the fleet wakes the drainer when the
        lease is renewed."""
        if self.boot.standing.may_promote():
            if self._lease_held:
                log.info("drain_resumed", why="host lease renewed")
            self._lease_held = False
            return True
        if not self._lease_held:
            log.warning("drain_held", why="host lease not fresh: no promotion until it is renewed")
        self._lease_held = True
        return False

    def _next_round_at(self) -> float:
        """When the earliest backoff the last promotion reported ends, on the event loop's clock (inf: none)."""
        if self._next_at is None:
            return math.inf
        wait_s = (self._next_at - self.boot.wall_clock()).total_seconds()
        # At least a moment: the registry said that time is still ahead by its clock, which may differ from this one
        # (rounding, another host's skew): never a busy loop of promotions that promote nothing.
        return trio.current_time() + max(MIN_BACKOFF_WAIT_S, wait_s)

    async def start_promoted(self, jobs: list[Job], tokens: list[str]) -> list[Job]:
        """Start freshly promoted jobs together, record their identities in one write, start their monitors."""
        for job in jobs:
            self.boot.announce(job, "queued", "promoted")  # (the ledger holds them since the promotion)
        handed: set[str] = set()
        try:
            outcomes = await self._start_together(jobs, tokens)
            spawned: list[Job] = []
            deferred: list[str] = []
            for job in jobs:
                if await self._judge_start(job, outcomes[job.job_id], deferred):
                    spawned.append(job)
            spawned = await self._record_identities(spawned)
            await self._hand_to_monitors(spawned, handed)
            self._heed_the_engine(deferred, some_failed=len(spawned) < len(jobs))
            return spawned
        finally:
            # Cancelled or failed part way: an entry without a monitor must not look watched (nor held as a start).
            # Each such row is judged by the next reconcile -- this boot's or the next one's -- on the executor's
            # evidence: adopted if its program runs (INV-IDENTITY-BEFORE-PROGRAM: its start record or container says
            # so), kept while its start may still happen, back to the queue once it provably never will.
            for job in jobs:
                if job.job_id not in handed:
                    self.boot.ledger.release(job.job_id)

    async def _start_together(self, jobs: list[Job], tokens: list[str]) -> dict[str, JobHandle | Exception]:
        """Each job's start, side by side: its handle, or what its start raised (judged job by job)."""
        outcomes: dict[str, JobHandle | Exception] = {}

        async def start_one(job: Job, token: str) -> None:
            try:
                outcomes[job.job_id] = await self._start(job, token)
            except Exception as exc:  # judged by _judge_start, job by job
                outcomes[job.job_id] = exc

        if len(jobs) == 1:
            await start_one(jobs[0], tokens[0])  # a lone start (the common case) needs no nursery of its own
        else:
            async with trio.open_nursery() as starts:
                for job, token in zip(jobs, tokens, strict=False):
                    starts.start_soon(start_one, job, token)
        return outcomes

    async def _judge_start(self, job: Job, got: JobHandle | Exception, deferred: list[str]) -> bool:
        """Whether ``job`` started (its handle held in the ledger); else its row is carried to what its start's
        failure means, and an engine that did not answer is noted in ``deferred``."""
        ledger = self.boot.ledger
        if isinstance(got, ExecutorUnavailable):
            deferred.append(str(got))
            await self._defer(job)
            return False
        if isinstance(got, StartOutcomeUnknown):
            # Never recorded failed: it may yet run. Its start is no longer held here (the ledger), so the
            # next sweep judges the row on the executor's evidence: a start record or container is adopted;
            # one that provably never happened goes back to the queue; until then it keeps its slot
            # (INV-UNKNOWN-KEEPS-SLOT).
            ledger.release(job.job_id)
            deferred.append(str(got))
            log.warning(
                "job_start_unknown",
                job_id=job.job_id,
                why=str(got),
                kept="running with its liveness unknown until the executor's evidence says whether it started",
            )
            return False
        if isinstance(got, Exception):
            # INV-SPAWN-FAILURE-FREES-SLOT: whatever goes wrong in one start (a SpawnError, or a defect such as
            # an argv the OS cannot take), the promoted row is finalized, never left holding a slot.
            ledger.release(job.job_id)
            if not isinstance(got, SpawnError):
                log.error("spawn_crashed", job_id=job.job_id, error=repr(got))
            reason = str(got) if isinstance(got, SpawnError) else f"{type(got).__name__}: {got}"
            await self._spawn_failed(job, f"spawn_failed: {reason}"[:500])
            return False
        ledger.handed(job.job_id, got)
        return True

    async def _record_identities(self, spawned: list[Job]) -> list[Job]:
        """The started jobs' identities, recorded in one write: their rows after it (as they were, if it failed)."""
        if not spawned:
            return spawned
        claims = [IdentityClaim(job.job_id, self._handle(job).record) for job in spawned]
        try:
            spawned = await self.boot.registry.record_identities(claims)
            await trio.lowlevel.checkpoint()  # a shutdown meanwhile: see _drain
        except SupervisorError:
            # The jobs exist: they must still get their monitors (to be finalized, cancellable). What the
            # executor wrote before each program ran (a start file, a labelled container) lets a later boot
            # find them too, and the next sweep records it. A registry that cannot write now has said so once
            # itself: only a DEBUG line then (log_failure); anything else is an ERROR.
            log_failure("job_identity_not_recorded", job_ids=[c.job_id for c in claims])
        return spawned

    async def _hand_to_monitors(self, spawned: list[Job], handed: set[str]) -> None:
        """Each started job to its monitor (noted in ``handed``), with a cancel that came in its spawn window."""
        for job in spawned:
            entry = self.boot.ledger.entry(job.job_id)
            assert entry is not None  # held since the promotion, released only here or by its monitor
            if job.cancel_requested:
                entry.request_cancel()  # a cancel that arrived in the spawn window is carried out now
            fields = self._handle(job).log_fields()
            log.info("job_spawned", job_id=job.job_id, kind=job.kind, boot_id=self.boot.boot_id, **fields)
            await self._monitors.start(entry, job)
            handed.add(job.job_id)

    def _heed_the_engine(self, deferred: list[str], *, some_failed: bool) -> None:
        if deferred:
            # The engine stopped answering between the probe and the start (or did not answer a start in time):
            # hold the queue as a probe would have, and wake the drainer so that its next round waits for the
            # retry instead of a wake.
            self._engine.hold(deferred[0], by_start=True)
            self.wake()
        else:
            self._engine.resume()  # every start was answered (made, or refused for the job's own sake)
            if some_failed:
                self.wake()  # a failed start freed its slot

    def _handle(self, job: Job) -> JobHandle:
        entry = self.boot.ledger.entry(job.job_id)
        assert entry is not None and entry.handle is not None
        return entry.handle

    async def _defer(self, job: Job, *, reason: str = ENGINE_UNAVAILABLE) -> None:
        """A start the executor could not make (its engine does not answer), or one this host may no longer make (its
        lease is not fresh), of which nothing runs."""
        # INV-IDENTITY-BEFORE-PROGRAM: it provably never started: back to the head of the queue, the start not counted
        # (ADR 0005 §8: an engine that does not answer fails no job).
        try:
            requeue = functools.partial(self.boot.registry.requeue, job.job_id, expect=Expect(None), reason=reason)
            change = await until_recorded(requeue)
        except SupervisorError:
            # The row stays RUNNING without an identity: the next boot requeues it (it never started).
            log_failure("job_not_requeued", job_id=job.job_id)
            return
        if change.changed and change.job.status.is_terminal:
            self.boot.announce_end(change.job, change.previous)  # a cancel asked during the start: carried out
        elif change.changed:
            self.boot.announce(change.job, str(change.previous), reason)

    async def _spawn_failed(self, job: Job, reason: str) -> None:
        # A start that failed on a full disk most likely finds the registry on the same disk: its end waits for it
        # (the row keeps its slot meanwhile), never escapes and stops the supervisor.
        ending = Ending(Outcome(JobStatus.FAILED, reason))
        change = await until_recorded(functools.partial(self.boot.registry.finalize, job.job_id, ending))
        if change.changed:
            self.boot.announce_end(change.job, change.previous)

    async def _start(self, job: Job, token: str) -> JobHandle:
        assert job.log_path is not None
        boot = self.boot
        env = {"PODCAST_JOB_ID": job.job_id, "PODCAST_JOB_TOKEN": token, "PODCAST_JOB_DATA_DIR": str(boot.data_dir)}
        if self.heartbeat_base_url is not None:
            env["PODCAST_JOB_HEARTBEAT_URL"] = f"{self.heartbeat_base_url}/api/jobs/{job.job_id}/heartbeat"
        if not self._log_dir_made:  # once, not a thread hop per start; again after any failed start
            try:
                await trio.to_thread.run_sync(lambda: boot.log_dir.mkdir(parents=True, exist_ok=True))
            except FileExistsError as exc:  # mkdir's own words ("File exists") would not say what is wrong
                raise SpawnError(f"cannot create the job log directory {boot.log_dir}: a file is in its place") from exc
            except OSError as exc:
                raise SpawnError(f"cannot create the job log directory {boot.log_dir}: {exc.strerror or exc}") from exc
            self._log_dir_made = True
        launch = Launch(
            job_id=job.job_id,
            kind=job.kind,
            boot_id=boot.boot_id,
            argv=job.argv,
            env=env,
            data_dir=boot.data_dir,
            log=Path(job.log_path),
            log_max_bytes=boot.config.log_max_bytes,
            attempt=max(1, job.attempts),
            memory_max_mb=boot.kinds.get(job.kind).memory_max_mb if job.kind in boot.kinds else None,
        )
        try:
            return await boot.executor.start(launch)
        except BaseException:
            self._log_dir_made = False  # the directory may be what is missing (removed under a running supervisor)
            raise


class EngineHold:
    """Whether the drainer may ask the executor to start jobs now (ADR 0005 §8). An engine that does not answer holds
    the queue instead of failing every job it would start: asked again after ``HOLD_RETRY_MIN_S``, doubling to
    ``HOLD_RETRY_MAX_S``. A hold that a refused start made ends only with a start made (a trial round), since a probe
    that answers while starts are refused proves nothing. The drainer's alone: its task and its starts."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self.held = False  # the executor cannot start jobs: nothing is promoted before retry_at
        self.held_by_start = False  # held because a start was refused: only a start made ends the hold
        self.retry_at = math.inf
        self._delay = HOLD_RETRY_MIN_S
        self.trials = 0  # trial starts of a held queue still under way: their outcome, not retry_at, comes next

    def next_look_at(self) -> float:
        """When the drainer wakes itself to ask again (inf: it need not; a trial's end wakes it)."""
        return self.retry_at if not self.trials else math.inf

    async def ready(self) -> bool:
        if self.held and (self.trials or trio.current_time() < self.retry_at):
            # Held: asked again at retry_at (the drainer wakes itself), not at every wake before it; and never while
            # a trial start is still under way (its outcome sets the next retry, or ends the hold, and wakes us).
            return False
        why = await self._executor.unavailable()
        if why is not None:
            self.hold(why)
            return False
        if not self.held_by_start:
            self.resume()
        else:
            # A trial round: its start decides. Until it does, the next trial is one delay away: a trial that finds
            # nothing to start (every slot taken, say by a start whose outcome is unknown) must not make the next
            # round come at once, and again.
            self.retry_at = trio.current_time() + self._delay
        return True

    def hold(self, why: str, *, by_start: bool = False) -> None:
        """Promote nothing before the next retry. INFO, not WARNING: the executor says once per episode of engine
        trouble why (``docker_engine_unavailable``); this line says what it means for the queue."""
        if not self.held:
            log.info("drain_held", why=why, exec_mode=self._executor.mode)
        self.held = True
        self.held_by_start = self.held_by_start or by_start
        self.retry_at = trio.current_time() + self._delay
        self._delay = min(self._delay * 2, HOLD_RETRY_MAX_S)

    def resume(self) -> None:
        """The executor can start jobs again: its probe answered, or (after a refused start) a start was made."""
        if self.held:
            log.info("drain_resumed", exec_mode=self._executor.mode)
        self.held = False
        self.held_by_start = False
        self.retry_at = math.inf
        self._delay = HOLD_RETRY_MIN_S
