"""What a kind's author met writing scenarios from docs/testing.md alone: each test here failed before its fix."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.api import ROUTES
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
    with pytest.raises(KindsFileError, match=r"a script sets no cap: declare the kind in kinds_toml"):
        Scenario.script(retry_backoff_s=7200)  # above the kinds file's default cap, which a script cannot raise


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


async def test_a_script_exits_143_on_sigterm_as_the_pipeline_runner_does(supervisor_scenario: Scenario) -> None:
    """The built-in kinds' runner catches SIGTERM and exits 143 (docs/job-kinds.md), which they resubmit and, once
    their attempts are spent, name ``terminated``. A script could only die by the signal (``killed_by_SIGTERM``):
    a reboot's SIGTERM ended differently than in production. ``exit_on_sigterm=143`` says what the runner does."""
    sc = supervisor_scenario
    runner = sc.script(beats_every=5, progress_every=10, exit_on_sigterm=143)
    await sc.start(behave={"pipeline": runner, "enrichment": sc.script(run_for=5)}, cancel_grace_s=30)
    job_id = await sc.enqueue("pipeline", feed="https://example.org/feed.xml")
    for _ in range(3):  # a host's shutdown, three times: the pipeline kind's max_attempts
        await sc.advance_until(lambda: bool(sc.executor.jobs.get(job_id)), within=3600)
        await sc.advance_until(lambda: sc.executor.jobs[job_id].status is None, within=3600)
        await sc.advance(60)
        sc.kill(job_id, "SIGTERM")
        await sc.advance(1)
    job = await sc.job(job_id)
    assert (job.status, job.error_reason, job.exit_code, job.attempts) == ("failed", "terminated", 143, 3)
    assert [attempt.exit_code for attempt in job.history] == [143, 143]
    again = await sc.retry(job_id)
    await sc.advance(60)
    await sc.cancel(again)
    cancelled = await sc.advance_until_ended(again, within=60)
    assert (cancelled.status, cancelled.exit_code) == ("cancelled", 143)  # stopped at the SIGTERM, not the grace


def test_a_script_that_handles_sigterm_does_not_also_ignore_it() -> None:
    with pytest.raises(ValueError, match="either handles SIGTERM or ignores it"):
        Scenario.script(exit_on_sigterm=143, ignore_sigterm=True)
    with pytest.raises(ValueError, match="exit_on_sigterm must be 0-255"):
        Scenario.script(exit_on_sigterm=300)


def test_the_routes_the_page_names_for_the_verbs_are_the_apis() -> None:
    """docs/testing.md maps each operator verb to its API route, for a runbook's author who calls both: it named
    ``POST /api/prune`` and ``POST /api/reconcile``, routes that do not exist (they are under ``/api/jobs/``)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()

    def shape(path: str) -> str:
        return re.sub(r"\{[^}]*\}", "{}", path)  # {id} on the page, {job_id} in the table

    declared = {(route.method, shape(route.path)) for route in ROUTES}
    named = re.findall(r"`(GET|POST|PUT|DELETE) (/api/[^`]*)`", page)
    named += [("POST", "/api/queue" + rest) for rest in re.findall(r"`POST /api/queue/pause`, `(/resume)`", page)]
    assert len(named) >= 6
    assert sorted({(method, shape(path)) for method, path in named} - declared) == []
