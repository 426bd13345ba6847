"""A kind's memory_max_mb, and the OOM score of every job (ADR 0020): a job that allocates past its bound ends
failed while the supervisor, the shepherd and the other jobs keep running; every job is a likelier OOM victim than
the supervisor and its shepherd."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from core_helpers import kinds_file_with, pid_of, wait_running, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus, Supervisor, load_kinds
from supervisor.domain import KindsFileError
from supervisor.execution.shepherd import JOB_OOM_SCORE_ADJ
from supervisor.execution.subprocess import SubprocessExecutor

BOUNDED = """
[kinds.greedy]
argv = ["{python}", "-c", "import sys; x = bytearray(int(sys.argv[1]) * 2**20); print('allocated')", "{mb}"]
params = { mb = "int" }
memory_max_mb = 64
"""


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


async def test_a_job_past_its_memory_bound_fails_and_nothing_else_does(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    kinds = kinds_file_with(tmp_path, BOUNDED)
    sup = make_supervisor(kinds_file=kinds, max_concurrent=3)
    bystander = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    greedy = await wait_terminal(sup, (await sup.enqueue("greedy", {"mb": 300})).job.job_id)
    assert (greedy.status, greedy.error_reason) == (JobStatus.FAILED, "exit_code_1")
    assert b"MemoryError" in await sup.read_log(greedy.job_id)  # the program's own failure, as documented
    modest = await wait_terminal(sup, (await sup.enqueue("greedy", {"mb": 8})).job.job_id)
    assert modest.status is JobStatus.SUCCEEDED  # the bound leaves room for what fits
    assert (await sup.get(bystander.job_id)).status is JobStatus.RUNNING
    pid = pid_of(bystander)
    assert pid is not None
    # Every job is the OOM killer's likelier pick than the supervisor (this process) and its shepherd.
    assert isinstance(sup.executor, SubprocessExecutor) and sup.executor.shepherd.pid is not None
    assert oom_score_adj(pid) == JOB_OOM_SCORE_ADJ
    for supervising in (os.getpid(), sup.executor.shepherd.pid):
        assert oom_score_adj(supervising) < JOB_OOM_SCORE_ADJ
    await sup.cancel(bystander.job_id)
    await wait_terminal(sup, bystander.job_id)


@pytest.mark.parametrize("mb", [8, 15, 4194305])
def test_a_memory_bound_out_of_range_is_refused(tmp_path: Path, mb: int) -> None:
    path = tmp_path / "k.toml"
    path.write_text(f'[kinds.x]\nargv = ["true"]\nmemory_max_mb = {mb}\n')
    with pytest.raises(KindsFileError, match="memory_max_mb must be a whole number of MiB from 16"):
        load_kinds(path)
