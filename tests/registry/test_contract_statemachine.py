"""A hypothesis state machine over every registry backend: random sequences of operations, checked step by step
against a model of the queue, keep every invariant.

Invariants: the counts are the model's; never more than ``MAX`` rows RUNNING (INV-PROMOTION-NEVER-OVERSHOOTS);
a terminal row never changes again; the queue is FIFO (promotions take the oldest queued rows, and the queue's
positions are its order of insertion); the running rows are the model's.

Hypothesis's rules are sync; the registry is async. Each machine runs one Trio loop in a background thread for its
whole life (``trio_portal.Portal``) and calls into it: the registry's resources (and, for PostgreSQL, the
trio-asyncio loop under asyncpg) live on that one loop between steps, as they do in the supervisor.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from registry_helpers import BACKENDS, BOOT, WallClock, new_job
from trio_portal import Portal

from supervisor.domain import MAX_LIST_LIMIT, IllegalTransition, Job, JobStatus, PageRequest, Unauthorized
from supervisor.registry import (
    PAUSED_BY_OPERATOR,
    Beat,
    Ending,
    Expect,
    IdentityClaim,
    IdentityRecord,
    Outcome,
    PromoteRequest,
    Promotion,
    hash_token,
)

MAX = 2

ENDINGS = [
    Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0),
    Ending(Outcome(JobStatus.FAILED, "exit_code_3"), exit_code=3),
    Ending(Outcome(JobStatus.STALE, "no_heartbeat")),
    Ending(
        Outcome(JobStatus.FAILED, "killed_by_signal_15"),
        if_cancel_requested=Outcome(JobStatus.CANCELLED, "cancelled"),
        exit_code=-15,
    ),
    # A monitor's ending with the end of each stop the row may record (INV-STOP-REASON-BEFORE-SIGNAL).
    Ending(
        Outcome(JobStatus.FAILED, "exit_code_143"),
        if_cancel_requested=Outcome(JobStatus.CANCELLED, "cancelled"),
        exit_code=143,
        if_stopped={
            "deadline": Ending(
                Outcome(JobStatus.FAILED, "deadline_exceeded"),
                if_cancel_requested=Outcome(JobStatus.CANCELLED, "cancelled"),
                exit_code=143,
            ),
            "stall": Ending(
                Outcome(JobStatus.STALE, "progress_stalled"),
                if_cancel_requested=Outcome(JobStatus.CANCELLED, "cancelled"),
                exit_code=143,
            ),
        },
    ),
]


class RegistryMachine(RuleBasedStateMachine):
    backend: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        backend = BACKENDS[self.backend]
        self.portal = Portal(around=backend.around).__enter__()
        self.clock = WallClock()
        self.reg = self.portal.run(
            functools.partial(backend.open, Path(self.dir.name), clock=self.clock, boot_id=BOOT, outbox=True)
        )
        # The model: every row's status, in insertion order (the queue's order).
        self.model: dict[str, JobStatus] = {}
        self.keys: dict[str, str | None] = {}
        self.tokens: dict[str, str] = {}  # a running row's token
        self.token_names: dict[str, str] = {}  # every token handed to a promotion, by its hash
        self.identities: dict[str, IdentityRecord] = {}
        self.cancel_requested: set[str] = set()
        self.stops: dict[str, str] = {}  # a running row's recorded stop reason (the first)
        self.terminal: dict[str, Job] = {}  # each terminal row as it was when it ended
        self.paused = False
        self.promotions = 0

    def teardown(self) -> None:
        try:
            self.portal.run(self.reg.aclose)
        finally:
            self.portal.close()
            self.dir.cleanup()

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.portal.run(functools.partial(fn, *args, **kwargs))

    # -- the model's view ------------------------------------------------------------------------------

    def _pick(self, pick: int) -> str:
        # Ids are random: choose by insertion index, so a replay draws the same shape of data.
        ids = list(self.model)
        return ids[pick % len(ids)]

    def _with(self, status: JobStatus) -> list[str]:
        return [job_id for job_id, s in self.model.items() if s is status]

    def _request(self, tokens: int) -> PromoteRequest:
        names = [f"token-{self.promotions}-{i}" for i in range(tokens)]
        self.promotions += 1
        self.token_names.update((hash_token(n), n) for n in names)
        return PromoteRequest(MAX, BOOT, [hash_token(n) for n in names])

    def _expect_promotion(self, request: PromoteRequest, promotion: Promotion) -> None:
        """Check a promotion against the model (FIFO, the free slots, one row per token), then apply it."""
        if self.paused:
            assert promotion == Promotion(paused=True)
            return
        free = max(0, MAX - len(self._with(JobStatus.RUNNING)))
        expected = self._with(JobStatus.QUEUED)[: min(free, len(request.token_hashes))]
        assert not promotion.paused
        assert [j.job_id for j in promotion.jobs] == expected
        for job, token_hash in zip(promotion.jobs, request.token_hashes, strict=False):
            assert (job.status, job.token_hash, job.identity) == (JobStatus.RUNNING, token_hash, None)
            self.model[job.job_id] = JobStatus.RUNNING
            self.tokens[job.job_id] = self.token_names[token_hash]

    def _end(self, job: Job) -> None:
        assert job.status.is_terminal and job.token_hash is None
        self.model[job.job_id] = job.status
        self.terminal[job.job_id] = job
        self.tokens.pop(job.job_id, None)

    # -- rules -----------------------------------------------------------------------------------------

    @rule(coalesce=st.booleans())
    def enqueue(self, coalesce: bool) -> None:
        key = "K" if coalesce else None
        absorbing = [j for j in self._with(JobStatus.QUEUED) if key is not None and self.keys[j] == key]
        result = self.run(self.reg.enqueue, new_job(len(self.model), key=key))
        if absorbing:
            assert result.coalesced and result.job.job_id == absorbing[0]
        else:
            assert not result.coalesced and result.job.job_id not in self.model
            self.model[result.job.job_id] = JobStatus.QUEUED
            self.keys[result.job.job_id] = key

    @rule(keys=st.lists(st.sampled_from([None, "K", "L"]), max_size=3))
    def enqueue_many(self, keys: list[str | None]) -> None:
        results = self.run(self.reg.enqueue_many, [new_job(i, key=key) for i, key in enumerate(keys)])
        assert len(results) == len(keys)
        for result, key in zip(results, keys, strict=True):
            absorbing = [j for j in self._with(JobStatus.QUEUED) if key is not None and self.keys[j] == key]
            if absorbing:
                assert result.coalesced and result.job.job_id == absorbing[0]
            else:
                assert not result.coalesced
                self.model[result.job.job_id] = JobStatus.QUEUED
                self.keys[result.job.job_id] = key

    @rule(tokens=st.integers(1, 3))
    def promote(self, tokens: int) -> None:
        request = self._request(tokens)
        self._expect_promotion(request, self.run(self.reg.promote, request))

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 1000), ending=st.sampled_from(ENDINGS), guard=st.sampled_from(["none", "same", "other"]))
    def finalize(self, pick: int, ending: Ending, guard: str) -> None:
        job_id = self._pick(pick)
        before = self.model[job_id]
        recorded = self.identities.get(job_id)
        expect = {
            "none": None,
            "same": Expect(recorded),
            "other": Expect(IdentityRecord("process", {"pid": -1})),
        }[guard]
        if before is JobStatus.QUEUED and (expect is None or expect.identity is None):
            try:
                self.run(self.reg.finalize, job_id, ending, expect=expect)
            except IllegalTransition:
                return
            raise AssertionError("a queued row was finalized")
        change = self.run(self.reg.finalize, job_id, ending, expect=expect)
        if before.is_terminal:
            assert not change.changed and change.job == self.terminal[job_id]
        elif expect is not None and expect.identity != recorded:
            assert not change.changed and change.job.status is before
        else:
            assert change.changed and change.previous is JobStatus.RUNNING
            chosen = ending.for_stop(self.stops.get(job_id)).chosen(job_id in self.cancel_requested)
            assert (change.job.status, change.job.error_reason) == (chosen.status, chosen.reason)
            self._end(change.job)

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick: int) -> None:
        job_id = self._pick(pick)
        before = self.model[job_id]
        change = self.run(self.reg.request_cancel, job_id)
        if before is JobStatus.QUEUED:
            assert change.changed and change.job.status is JobStatus.CANCELLED
            self._end(change.job)
        elif before is JobStatus.RUNNING:
            assert change.changed == (job_id not in self.cancel_requested)
            assert change.job.cancel_requested and change.job.status is JobStatus.RUNNING
            self.cancel_requested.add(job_id)
        else:
            assert not change.changed and change.job == self.terminal[job_id]

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 1000), why=st.sampled_from(["deadline", "stall"]), same=st.booleans())
    def request_stop(self, pick: int, why: str, same: bool) -> None:
        job_id = self._pick(pick)
        recorded = self.identities.get(job_id)
        expect = Expect(recorded if same else IdentityRecord("process", {"pid": -1}))
        change = self.run(self.reg.request_stop, job_id, why, expect=expect)
        before = self.model[job_id]
        if before is JobStatus.RUNNING and same and job_id not in self.stops:
            assert change.changed and change.job.status is JobStatus.RUNNING
            self.stops[job_id] = why
        else:
            assert not change.changed and change.job.status is before
        assert change.job.stop_reason == self.stops.get(job_id)  # the first reason stands

    @precondition(lambda self: bool(self._with(JobStatus.RUNNING)))
    @rule(pick=st.integers(0, 1000), pid=st.integers(1, 3))
    def record_identity(self, pick: int, pid: int) -> None:
        running = self._with(JobStatus.RUNNING)
        job_id = running[pick % len(running)]
        identity = IdentityRecord("process", {"pid": pid})
        [row] = self.run(self.reg.record_identities, [IdentityClaim(job_id, identity)])
        assert row.identity == identity
        self.identities[job_id] = identity

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 1000), units=st.integers(0, 5), own_token=st.booleans())
    def heartbeat(self, pick: int, units: int, own_token: bool) -> None:
        job_id = self._pick(pick)
        token = self.tokens.get(job_id, "no-token") if own_token else "wrong"
        [result] = self.run(self.reg.record_heartbeats, [Beat(job_id, token, units)])
        if own_token and self.model[job_id] is JobStatus.RUNNING:
            assert isinstance(result, Job) and result.last_heartbeat_at == self.clock.now
        else:
            assert isinstance(result, Unauthorized)

    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        state = self.run(self.reg.set_paused, paused, by=PAUSED_BY_OPERATOR)
        assert state.paused == paused
        self.paused = paused

    @rule(seconds=st.integers(1, 100))
    def tick(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # -- invariants --------------------------------------------------------------------------------------

    @invariant()
    def counts_are_the_models_and_never_overshoot_INV_PROMOTION_NEVER_OVERSHOOTS(self) -> None:
        counts = self.run(self.reg.counts)
        assert counts["running"] <= MAX
        assert counts == {s.value: sum(m is s for m in self.model.values()) for s in JobStatus}

    @invariant()
    def terminal_rows_never_change(self) -> None:
        for job_id, ended in self.terminal.items():
            assert self.run(self.reg.get, job_id) == ended

    @invariant()
    def the_queue_is_fifo(self) -> None:
        queued, _ = self.run(self.reg.list_jobs, PageRequest.parse(status="queued", limit=MAX_LIST_LIMIT))
        assert [j.job_id for j in reversed(queued)] == self._with(JobStatus.QUEUED)
        assert [j.queue_position for j in reversed(queued)] == list(range(1, len(queued) + 1))

    @invariant()
    def the_running_rows_are_the_models(self) -> None:
        assert [j.job_id for j in self.run(self.reg.running_jobs)] == self._with(JobStatus.RUNNING)


def _machine_test(backend: str) -> Any:
    machine: type[RegistryMachine] = type(f"RegistryMachine_{backend}", (RegistryMachine,), {"backend": backend})
    case = machine.TestCase
    case.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
    case.pytestmark = list(BACKENDS[backend].marks)  # type: ignore[attr-defined]
    return case


# One TestCase per backend: ``TestRegistryMachine_sqlite``, ``TestRegistryMachine_memory``, ...
for _backend in BACKENDS:
    globals()[f"TestRegistryMachine_{_backend}"] = _machine_test(_backend)
