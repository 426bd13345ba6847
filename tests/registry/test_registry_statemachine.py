"""A hypothesis state machine over the registry: random operation sequences keep every invariant."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from supervisor._registry import hash_token

from supervisor import IllegalTransition, JobStatus, SqliteRegistry
from supervisor.domain import TERMINAL, TRANSITIONS

MAX = 2


class RegistryMachine(RuleBasedStateMachine):
    @initialize()
    def open(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.reg = SqliteRegistry(Path(self.dir.name) / "r.sqlite3")
        self.model: dict[str, JobStatus] = {}
        self.terminal_snapshots: dict[str, object] = {}

    def teardown(self) -> None:
        if hasattr(self, "reg"):
            self.reg.close()
            self.dir.cleanup()

    def _pick(self, pick: int) -> str:
        # Ids are random uuids: choose by insertion index so replays draw the same shape of data.
        ids = list(self.model)
        return ids[pick % len(ids)]

    @rule(coalesce=st.booleans())
    def enqueue(self, coalesce: bool) -> None:
        result = self.reg.enqueue("k", {}, ["x"], coalesce_key="K" if coalesce else None)
        if result.coalesced:
            assert self.model[result.job.job_id] is JobStatus.QUEUED
        else:
            self.model[result.job.job_id] = JobStatus.QUEUED

    @rule()
    def promote(self) -> None:
        queued = [j for j, s in self.model.items() if s is JobStatus.QUEUED]
        running = sum(s is JobStatus.RUNNING for s in self.model.values())
        job = self.reg.promote_queued_if_slot(MAX, boot_id="b", token_hash=hash_token("t"))
        if running >= MAX or not queued:
            assert job is None
        else:
            assert job is not None
            assert job.job_id == queued[0]  # FIFO
            self.model[job.job_id] = JobStatus.RUNNING

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 1000), status=st.sampled_from(sorted(TERMINAL)))
    def finalize(self, pick: int, status: JobStatus) -> None:
        job_id = self._pick(pick)
        before = self.model[job_id]
        if before is JobStatus.QUEUED:
            with self.reg._tx() as conn:
                job = self.reg._get_in(conn, job_id)
                if status in TRANSITIONS[before]:
                    self.reg._set_status(conn, job, status)
                    self.model[job_id] = status
                else:
                    try:
                        self.reg._set_status(conn, job, status)
                    except IllegalTransition:
                        pass
                    else:
                        raise AssertionError("illegal transition was allowed")
            return
        result = self.reg.finalize(job_id, status)
        assert result.changed == (before is JobStatus.RUNNING)
        if result.changed:
            self.model[job_id] = status

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick: int) -> None:
        job_id = self._pick(pick)
        result = self.reg.request_cancel(job_id)
        if self.model[job_id] is JobStatus.QUEUED:
            self.model[job_id] = JobStatus.CANCELLED
            assert result.job.status is JobStatus.CANCELLED

    @invariant()
    def registry_matches_model(self) -> None:
        if not hasattr(self, "reg"):
            return
        counts = self.reg.counts()
        assert counts["running"] <= MAX
        for status in JobStatus:
            assert counts[status.value] == sum(s is status for s in self.model.values())

    @invariant()
    def terminal_rows_never_change(self) -> None:
        if not hasattr(self, "reg"):
            return
        for job_id, status in self.model.items():
            if status in TERMINAL:
                job = self.reg.get(job_id)
                snapshot = (job.status, job.ended_at, job.error_reason)
                assert self.terminal_snapshots.setdefault(job_id, snapshot) == snapshot


RegistryMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestRegistryStateMachine = RegistryMachine.TestCase
