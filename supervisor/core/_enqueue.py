"""Enqueue, on the core's side: a job request validated against its kind and stored (one, a batch all or nothing, an
operator's explicit retry, a kind's ``then`` follow-up), then announced and the drainer woken. Never waits for a
spawn: the drainer starts what a free slot allows."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..domain import (
    SUPERVISOR,
    Conflict,
    IdempotencyKey,
    Job,
    JobRequest,
    JobStatus,
    Liveness,
    RequestKey,
    Schedule,
    ValidationError,
    coalesce_key,
    fingerprint,
    follow_up_key,
)
from ..observe import get_logger
from ..registry import EnqueueResult, NewJob
from ._boot import Boot
from ._ports import DrainBell

log = get_logger()


class Enqueuer:
    """Validates and stores job requests; rings ``drain_bell`` once stored."""

    def __init__(self, boot: Boot, drain_bell: DrainBell) -> None:
        self.boot = boot
        self.drain_bell = drain_bell

    def validate(self, kind_name: str, params: Mapping[str, object] | None, by: str | None = None) -> NewJob:
        """A job request checked against its kind (``ValidationError`` naming the field); ``by``: who asks."""
        kind = self.boot.kinds.get(kind_name)
        validated = kind.validate_params({} if params is None else params)
        key = coalesce_key(kind.name, validated) if kind.coalesce else None
        # {python} is the interpreter the job finds where it runs (this one, or the image's).
        argv = kind.render_argv(validated, python=self.boot.executor.python)
        return NewJob(kind.name, validated, argv, key, max_attempts=kind.max_attempts, enqueued_by=by)

    def keyed(self, key: RequestKey | None, route: str, jobs: Sequence[NewJob]) -> IdempotencyKey | None:
        """The idempotency key of a request to ``route`` (``enqueue``, ``batch``) for ``jobs`` (validated where it
        came in: ``RequestKey``)."""
        if key is None:
            return None
        request = fingerprint(route, [(job.kind, job.params) for job in jobs])
        # A schedule's tick key lives at least one period: a timer that fires late in it still finds it.
        periods = [job.schedule.every_s for job in jobs if job.schedule is not None]
        return IdempotencyKey(key.text, request, max([self.boot.config.idempotency_ttl_s, *periods]))

    async def enqueue(
        self,
        kind_name: str,
        params: Mapping[str, object] | None,
        key: RequestKey | None = None,
        by: str | None = None,
        schedule: Schedule | None = None,
    ) -> EnqueueResult:
        """Validate and store a job, and have the drainer start it when a slot is free: never waits for a spawn.
        ``key``: the request's idempotency key (a retry of the request answers the first answer, ``replayed``);
        ``by``: who asks (the row's ``enqueued_by``); ``schedule``: the schedule whose tick this is (with
        ``if_idle``, skipped while a job of it is queued or running: ``skipped``)."""
        new = dataclasses.replace(self.validate(kind_name, params, by), schedule=schedule)
        result = await self.boot.registry.enqueue(new, key=self.keyed(key, "enqueue", [new]))
        self.announce([result])
        return result

    async def enqueue_many(
        self, requests: Sequence[JobRequest], key: RequestKey | None = None, by: str | None = None
    ) -> list[EnqueueResult]:
        """Validate every request against its kind first (a ``ValidationError`` names the element,
        ``jobs[3].params.seconds``), then store them all at once: all or nothing. ``key`` covers the batch, as
        ``enqueue``'s covers one job. The batch's envelope (a list of 1 to ``MAX_BATCH`` objects with ``kind`` and
        ``params``) is the API's to read (``api.parse_batch``)."""
        batch: list[NewJob] = []
        for index, request in enumerate(requests):
            where = f"jobs[{index}]"
            try:
                batch.append(self.validate(request.kind, request.params, by))
            except ValidationError as exc:
                raise ValidationError(f"{where}: {exc}", field=f"{where}.{exc.field}" if exc.field else where) from None
        results = await self.boot.registry.enqueue_many(batch, key=self.keyed(key, "batch", batch))
        self.announce(results)
        return results

    async def retry(self, job_id: str, by: str | None = None, *, key: IdempotencyKey | None = None) -> EnqueueResult:
        """The operator's explicit second try of a finished job: a new job of the same kind with the same params
        (checked again against the kind as it is declared now), whose row names the old one (``retry_of``). Only a
        finished job: a queued or running one is a ``Conflict`` naming its state. (Automatic resubmission of a crash
        is another thing: it keeps the job's own id.) A kind that coalesces may return the identical queued job.
        ``key``: a repeat answers what the key answered the first time, before any check (the job's state, its
        process, its kind as declared now: a kinds file changed since then does not turn a retry made into a
        refusal)."""
        if key is not None:
            answered = await self.boot.registry.answer_of(key)
            if answered is not None:  # INV-KEY-ONCE: a key's stored answer comes before any new check
                self.announce(answered)
                return answered[0]
        old = await self.boot.registry.get(job_id)
        if not old.status.is_terminal:
            raise Conflict(
                f"job {job_id} is {old.status}: only a finished job can be retried "
                f"({'cancel it first, or wait for it' if old.status is JobStatus.RUNNING else 'it has not run yet'})",
                field="job_id",
            )
        if old.status is JobStatus.STALE:
            await self._refuse_while_it_may_run(old)
        try:
            new = self.validate(old.kind, old.params, by)
        except ValidationError as exc:
            # Not the caller's input: the kinds file changed since the job ran.
            raise Conflict(f"job {job_id} cannot be retried as it was: {exc}", field=exc.field) from None
        # ``key``: a bulk retry's, one per selection and job: a repeat answers the job made the first time.
        result = await self.boot.registry.enqueue(dataclasses.replace(new, retry_of=old.job_id), key=key)
        if not result.coalesced and result.replayed is None:  # a bulk retry repeated made nothing new
            log.info("job_retried", job_id=result.job.job_id, retry_of=old.job_id, kind=old.kind)
        self.announce([result])
        return result

    async def _refuse_while_it_may_run(self, old: Job) -> None:
        """A stale row ended on an operator's word, not on proof that its process is gone (ADR 0001 §6): a retry
        while that process may still run would make a second writer of the same work. Refused (a ``Conflict``)
        unless this host's evidence says the process is gone; a process this host cannot see (another host's) or
        cannot judge now (an engine that does not answer) counts as running: unknown never proves an end."""
        boot = self.boot
        if not boot.owns(old):
            raise Conflict(
                f"job {old.job_id} was marked stale on host {old.host_id}, whose processes this host cannot see: "
                "retry it from that host once its process has ended",
                field="job_id",
            )
        [found] = await boot.evidence([old])
        if found.liveness is None or found.liveness is Liveness.DEAD:
            return
        process = ", ".join(f"{k} {v}" for k, v in old.identity.fields.items()) if old.identity else "its process"
        state = "is still running" if found.liveness is Liveness.ALIVE else "may still run (its liveness is unknown)"
        log.warning("retry_refused_process_alive", job_id=old.job_id, liveness=found.liveness.value)
        raise Conflict(
            f"job {old.job_id} was marked stale, but its process ({process}) {state}: a retry now would run the same "
            "work twice at once. Stop that process first (or wait for it to end), then retry",
            field="job_id",
        )

    def announce(self, results: list[EnqueueResult]) -> None:
        for result in results:
            if result.skipped:
                log.info("schedule_skipped", schedule=result.job.schedule, job_id=result.job.job_id,
                         status=str(result.job.status))  # fmt: skip
                continue
            if result.replayed is not None:
                # Nothing was written: the request's key had answered it already (a client's retry).
                log.info("enqueue_replayed", job_id=result.job.job_id, idempotency_key=result.job.idempotency_key)
            elif result.coalesced:
                log.info("job_coalesced", job_id=result.job.job_id, kind=result.job.kind)
            else:
                self.boot.announce(result.job, None, "enqueued")
        self.drain_bell.ring()

    def follow_up_of(self, parent: Job, then: str) -> tuple[NewJob, IdempotencyKey] | None:
        """The job a kind's ``then`` enqueues after ``parent`` succeeds (its params, those the follow-up takes), and
        the key it is enqueued under, one per parent (``then/<parent id>``: a finalize run again never queues a
        second); it is enqueued in the same registry step as the parent's success (``Ending.then``). None when it
        cannot be made."""
        try:
            kind = self.boot.kinds.get(then)
            params = {name: parent.params[name] for name in kind.params if name in parent.params}
            new = self.validate(then, params, SUPERVISOR)
        except ValidationError as exc:
            log.error("follow_up_not_enqueued", job_id=parent.job_id, then=then, error=str(exc))
            return None
        key = self.keyed(RequestKey(follow_up_key(parent.job_id)), "enqueue", [new])
        assert key is not None
        return new, key
