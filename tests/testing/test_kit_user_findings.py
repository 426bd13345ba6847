"""What a kind's author met writing scenarios from docs/testing.md alone: each test here failed before its fix."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.testing import KindsFileError, Scenario, open_scenario


def run_scenario(data_dir: Path, body: Callable[[Scenario], Awaitable[Any]]) -> Any:
    """One scenario in a run of its own (a fresh MockClock), its data dir's path written DATA in what it answers."""

    async def main() -> Any:
        async with open_scenario(data_dir) as sc:
            return await body(sc)

    answer = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return json.loads(json.dumps(answer, default=str).replace(str(data_dir), "DATA"))


async def bulk_retry(sc: Scenario) -> Any:
    await sc.start(kinds={"work": sc.script(run_for=10, exit_code=3)})
    job_id = await sc.enqueue("work")
    await sc.advance_until_ended(job_id, within=60)
    dry = await sc.bulk("retry", dry_run=True, status="failed")
    done = await sc.bulk("retry", status="failed")
    await sc.advance(60)
    return [dry.selection, done.selection, sc.log(), sc.webhooks()]


def test_a_bulk_selection_repeats_from_run_to_run(tmp_path: Path) -> None:
    """docs/testing.md § Deterministic: a scenario's log lines and rows repeat. A bulk selection's token is in its
    log lines (bulk_selected) and in each retried job's idempotency key: drawn from the seed, it repeats."""
    runs = [run_scenario(tmp_path / str(n), bulk_retry) for n in range(2)]
    assert runs[0][:2] == runs[1][:2]
    assert runs[0] == runs[1]


def test_a_refused_scripts_kind_setting_is_named_as_written() -> None:
    """``sc.script(retry_backoff_s=0)`` in ``kinds={"greedy": ...}``: the refusal named a kind 'script' that the test
    never wrote, and a key it did not write. It names the script's argument, and the kinds file's key beside it."""
    with pytest.raises(KindsFileError) as refused:
        Scenario.script(run_for=1, retry_backoff_s=0)
    message = str(refused.value)
    assert "kind 'script'" not in message
    assert message.startswith("script(retry_backoff_s=0) (a kinds file's retry_backoff_seconds = 0): ")
    assert "must be a number of seconds above 0" in message


async def test_a_sigterm_from_outside_does_not_kill_a_script_that_ignores_it(supervisor_scenario: Scenario) -> None:
    """A host's shutdown (``kill -TERM``) of a job that ignores SIGTERM: the process lives on, as it would, until
    a SIGKILL; before, ``sc.kill(job, "SIGTERM")`` ended it whatever ``ignore_sigterm`` said."""
    sc = supervisor_scenario
    await sc.start(kinds={"stubborn": sc.script(beats_every=5, ignore_sigterm=True)})
    job_id = await sc.enqueue("stubborn")
    await sc.advance(10)
    sc.kill(job_id, "SIGTERM")
    await sc.advance(60)
    assert (await sc.job(job_id)).status == "running"
    sc.kill(job_id)
    await sc.advance(1)
    job = await sc.job(job_id)
    assert (job.status, job.error_reason) == ("failed", "killed_by_SIGKILL")


async def test_a_settings_variable_name_is_answered_with_its_field(supervisor_scenario: Scenario) -> None:
    """A runbook's author knows the knob as operations.md writes it (``PODCAST_JOB_SILENT_SECONDS``): the refusal
    names the field a scenario takes for it, and where the two are listed side by side."""
    sc = supervisor_scenario
    with pytest.raises(TypeError, match=r"did you mean silent_after_s\? docs/settings\.md"):
        await sc.start(kinds={"x": sc.script()}, PODCAST_JOB_SILENT_SECONDS=60)
    with pytest.raises(TypeError, match=r"did you mean progress_stale_after_s\?"):
        await sc.start(kinds={"x": sc.script()}, progress_stale_after=60)
