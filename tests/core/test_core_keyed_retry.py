"""A keyed retry (a bulk retry's, one key per selection and job) answers its key's stored answer before any new
check (INV-KEY-ONCE): after the kinds file changed under a job, the retry it made is answered again, not refused;
without a key, the same retry is the kinds file's to refuse."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from core_helpers import KINDS, wait_terminal  # type: ignore[import-not-found]

from supervisor import Conflict, JobStatus, Supervisor
from supervisor.domain import IdempotencyKey, fingerprint


async def test_INV_KEY_ONCE_a_keyed_retry_answers_the_retry_it_made_after_the_kinds_file_changed(
    make_supervisor: Callable[..., Supervisor], kinds_file: Path
) -> None:
    first = make_supervisor()
    old = (await first.enqueue("exit", {"code": 3})).job
    assert (await wait_terminal(first, old.job_id)).status is JobStatus.FAILED
    key = IdempotencyKey(f"bulk/selection/{old.job_id}", fingerprint("retry", [(old.kind, old.params)]), 3600.0)
    made = await first.enqueuer.retry(old.job_id, key=key)
    await wait_terminal(first, made.job.job_id)
    # A deploy renames the kind's param: the old job's params no longer validate.
    exit_kind = '"{code}"]\nparams = { code = "int" }'
    assert KINDS.index(exit_kind) < KINDS.index("[kinds.show_env]")  # the first: kind exit's
    await trio.Path(kinds_file).write_text(KINDS.replace(exit_kind, '"{status}"]\nparams = { status = "int" }', 1))
    second = make_supervisor(attach=False)
    again = await second.enqueuer.retry(old.job_id, key=key)
    assert again.replayed is not None and again.job.job_id == made.job.job_id
    with pytest.raises(Conflict, match="cannot be retried as it was"):
        await second.enqueuer.retry(old.job_id)  # a new request, unkeyed: checked against the kinds as they are
