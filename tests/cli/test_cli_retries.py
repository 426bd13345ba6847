"""The CLI's own retry of a keyed enqueue (ADR 0016, ``supervisor.cli.with_retries``): again after no answer or a 503
(waiting the server's Retry-After, bounded, or else the backoff), at most a bounded number of times; never after an
answer that is the caller's fault."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from supervisor.cli import ApiError, Unreachable, with_retries


def failing(*errors: Exception) -> Callable[[], str]:
    left = list(errors)

    def call() -> str:
        if left:
            raise left.pop(0)
        return "answer"

    return call


def test_no_answer_and_a_503_are_sent_again_with_the_servers_wait_or_the_backoff() -> None:
    waits: list[float] = []
    said: list[int] = []
    busy = ApiError(503, "unavailable", "try again", retry_after_s=2.0)
    call = failing(Unreachable("reset"), busy, Unreachable("timed out"))
    assert with_retries(call, sleep=waits.append, on_retry=lambda e, attempt, w: said.append(attempt)) == "answer"
    assert waits == [0.5, 2.0, 2.0]  # the backoff, the server's Retry-After, the backoff
    assert said == [2, 3, 4]


def test_a_retry_after_is_bounded() -> None:
    waits: list[float] = []
    with_retries(failing(ApiError(503, "unavailable", "x", retry_after_s=3600)), sleep=waits.append)
    assert waits == [10.0]


def test_the_callers_own_fault_is_not_sent_again() -> None:
    waits: list[float] = []
    with pytest.raises(ApiError) as refused:
        with_retries(failing(ApiError(422, "idempotency_key_reused", "x")), sleep=waits.append)
    assert refused.value.status == 422 and waits == []


def test_it_gives_up_after_the_last_attempt() -> None:
    waits: list[float] = []
    with pytest.raises(Unreachable):
        with_retries(failing(*[Unreachable(f"no {n}") for n in range(5)]), sleep=waits.append)
    assert waits == [0.5, 1.0, 2.0]  # four attempts in all
