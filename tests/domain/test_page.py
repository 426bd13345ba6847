"""A page request is made at the edge from the wire's text and cannot be built out of bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from supervisor.domain import (
    FILTER_TIME_RANGE,
    MAX_LIST_LIMIT,
    JobFilter,
    JobStatus,
    KindCatalog,
    PageRequest,
    ValidationError,
    builtin_kinds,
)

KINDS = KindCatalog(builtin_kinds())


def test_the_wire_text_becomes_typed_values() -> None:
    page = PageRequest.parse(status="queued", kind="pipeline", limit=5, cursor="42", idempotency_key="k")
    assert page == PageRequest(JobFilter(JobStatus.QUEUED, "pipeline", idempotency_key="k"), 5, 42)


def test_every_filter_is_read_from_its_text_and_a_param_as_its_declared_type() -> None:
    wanted = JobFilter.parse(
        {
            "status": "failed",
            "reason": "all_feeds_unavailable",
            "param.max_episodes": "5",
            "param.feed": "https://x.example/feed",
            "since": "2026-12-07T02:00:00Z",
            "until": "2026-12-07T04:00:00+02:00",
            "ended_since": "2026-12-07T03:00:00Z",
            "host": "h1",
        },
        KINDS,
    )
    assert wanted.params == (("feed", "https://x.example/feed"), ("max_episodes", 5))
    assert wanted.created_since == datetime(2026, 12, 7, 2, tzinfo=UTC)
    assert wanted.created_until == datetime(2026, 12, 7, 4, tzinfo=timezone(timedelta(hours=2)))
    assert (wanted.reason, wanted.host, wanted.status) == ("all_feeds_unavailable", "h1", JobStatus.FAILED)


def test_the_ends_of_the_registrys_limits_are_within_them() -> None:
    wanted = JobFilter.parse(
        {
            "param.max_episodes": "-9223372036854775808",
            "since": "0001-01-01T00:00:00+00:00",
            "until": "9999-12-31T23:59:59.999999Z",
            "ended_since": "0001-01-01T00:00:00-00:00",
        },
        KINDS,
    )
    assert wanted.params == (("max_episodes", -(2**63)),)
    assert (wanted.created_since, wanted.created_until) == FILTER_TIME_RANGE
    top = JobFilter.parse({"param.max_episodes": "9223372036854775807"}, KINDS)
    assert top.params == (("max_episodes", 2**63 - 1),)


@pytest.mark.parametrize(
    ("built", "field"),
    [
        (lambda: PageRequest(limit=0), "limit"),
        (lambda: PageRequest(limit=MAX_LIST_LIMIT + 1), "limit"),
        (lambda: PageRequest(before=-1), "cursor"),
        (lambda: PageRequest(before=10**18), "cursor"),
        (lambda: JobFilter(idempotency_key=""), "idempotency_key"),
        (lambda: JobFilter(created_since=datetime(2026, 1, 1)), "since"),  # no offset: whose 02:00?
        (lambda: PageRequest.parse(status="QUEUED"), "status"),
        (lambda: PageRequest.parse(cursor="1_0"), "cursor"),
        (lambda: JobFilter.parse({"colour": "red"}), "colour"),
        (lambda: JobFilter.parse({"since": "yesterday"}), "since"),
        (lambda: JobFilter.parse({"since": "2026-12-07T02:00:00"}), "since"),
        (lambda: JobFilter.parse({"param.max_episodes": "five"}, KINDS), "param.max_episodes"),
        (lambda: JobFilter.parse({"param.colour": "red"}, KINDS), "param.colour"),
        (lambda: JobFilter.parse({"kind": "enrichment", "param.feed": "x"}, KINDS), "param.feed"),
        # The registry's limits (FILTER_INT_RANGE, FILTER_TIME_RANGE): 64 bits; a move to UTC within the calendar.
        (lambda: JobFilter.parse({"param.max_episodes": "9223372036854775808"}, KINDS), "param.max_episodes"),
        (lambda: JobFilter.parse({"param.max_episodes": "-9223372036854775809"}, KINDS), "param.max_episodes"),
        (lambda: JobFilter(params=(("n", 2**63),)), "param.n"),
        (lambda: JobFilter(params=(("ratio", float("nan")),)), "param.ratio"),
        (lambda: JobFilter.parse({"since": "0001-01-01T00:00:00+01:00"}), "since"),
        (lambda: JobFilter.parse({"until": "9999-12-31T23:59:59-01:00"}), "until"),
        (lambda: JobFilter.parse({"ended_since": "9999-12-31T23:59:59.999999-00:01"}), "ended_since"),
        (lambda: JobFilter(created_until=datetime.min.replace(tzinfo=timezone(timedelta(minutes=1)))), "until"),
    ],
)
def test_out_of_bounds_is_a_validation_error_naming_the_field(built: object, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        built()  # type: ignore[operator]
    assert err.value.field == field
