"""The runner's exit codes and the supervisor's built-in kinds are one contract held in two packages that share no
code (the runner never imports ``supervisor``): this test reads both tables and fails when they differ."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import pipeline_runner
from supervisor.core import RetryPolicy, ending
from supervisor.domain import ExitStatus, JobStatus, load_kinds
from supervisor.registry import Ending

NOW = datetime(2026, 12, 3, tzinfo=UTC)


def _ending(kind_name: str, code: int, *, cancel_asked: bool = False) -> Ending:
    """How the supervisor ends a first attempt of the built-in kind that exited ``code``."""
    kind = load_kinds(None).get(kind_name)
    return ending(
        ExitStatus(code=code),
        kind=kind,
        cancel_asked=cancel_asked,
        stop=None,
        orphan_reason="orphan",
        attempts=1,
        policy=RetryPolicy.of(kind, kind.max_attempts),
        now=NOW,
    )


@pytest.mark.parametrize("kind_name", ["pipeline", "enrichment"])
@pytest.mark.parametrize("meaning", pipeline_runner.EXIT_CODES, ids=lambda m: str(m.code))
def test_every_runner_exit_code_means_to_the_kind_what_the_runner_says(
    kind_name: str, meaning: pipeline_runner.ExitMeaning
) -> None:
    decided = _ending(kind_name, meaning.code)
    assert str(decided.outcome.status) == meaning.status
    expected_reason = meaning.reason
    if expected_reason is None and meaning.status == "failed":
        expected_reason = f"exit_code_{meaning.code}"  # no name of its own: the supervisor's generic one
    assert decided.outcome.reason == expected_reason
    # A code that asks for another start gets one (attempts permitting: both kinds allow more than one), and no
    # other code does.
    assert (decided.retry is not None) == meaning.retry
    if meaning.retry:
        assert load_kinds(None).get(kind_name).max_attempts > 1


def test_the_table_names_every_exit_constant_once() -> None:
    names = [n for n in pipeline_runner.__all__ if n.startswith("EXIT_") and n != "EXIT_CODES"]
    constants = {getattr(pipeline_runner, n) for n in names}
    codes = [m.code for m in pipeline_runner.EXIT_CODES]
    assert sorted(codes) == sorted(constants)


def test_a_polite_kill_is_terminated_and_started_again_while_a_crash_is_not() -> None:
    """The incident class of ADR 0014: SIGTERM from outside ended a pipeline job for good (exit 1)."""
    terminated = _ending("pipeline", pipeline_runner.EXIT_TERMINATED)
    assert (terminated.outcome.status, terminated.outcome.reason) == (JobStatus.FAILED, "terminated")
    assert terminated.retry is not None
    assert _ending("pipeline", pipeline_runner.EXIT_CRASH).retry is None
    # The same code after a cancel this supervisor sent is the cancel, never a resubmission.
    cancelled = _ending("pipeline", pipeline_runner.EXIT_TERMINATED, cancel_asked=True)
    assert cancelled.outcome.status is JobStatus.CANCELLED and cancelled.retry is None


def test_the_pipeline_kind_declares_the_bounds_the_runner_checks() -> None:
    """A pipeline job the runner would refuse (exit 2, invalid_params) is refused at enqueue instead."""
    from supervisor.domain import FEED_URL_MAX_LENGTH, MAX_EPISODES, URL_PATTERN

    assert (MAX_EPISODES, FEED_URL_MAX_LENGTH) == (pipeline_runner.MAX_EPISODES, pipeline_runner.FEED_URL_MAX_LENGTH)
    # The very pattern both sides check a URL with: what one refuses, the other refuses.
    assert URL_PATTERN == pipeline_runner.HTTP_URL_PATTERN
    rules = load_kinds(None).get("pipeline").param_rules
    assert (rules["max_episodes"].min, rules["max_episodes"].max) == (0, pipeline_runner.MAX_EPISODES)
    assert (rules["feed"].format, rules["feed"].max_length) == ("url", pipeline_runner.FEED_URL_MAX_LENGTH)
