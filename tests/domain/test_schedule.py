"""A schedule's tick and key (docs/operations.md, "Periodic runs"): every timer and host computes the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from supervisor.domain import Schedule, ValidationError, parse_period, parse_tick


def test_a_tick_is_the_time_floored_to_the_period_in_utc_whatever_the_offset() -> None:
    hourly = Schedule("feed-a", 3600.0)
    at = datetime(2026, 12, 7, 4, 59, 59, tzinfo=timezone(timedelta(hours=2)))  # 02:59:59 UTC
    assert hourly.tick(at) == datetime(2026, 12, 7, 2, tzinfo=UTC)
    assert hourly.key(hourly.tick(at)) == "schedule/feed-a/2026-12-07T02:00:00Z"
    assert Schedule("d", 86400.0).tick(at) == datetime(2026, 12, 7, tzinfo=UTC)


@pytest.mark.parametrize(("text", "seconds"), [("60s", 60), ("15m", 900), ("1h", 3600), ("1d", 86400)])
def test_periods_are_read_in_seconds(text: str, seconds: float) -> None:
    assert parse_period(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "1w", "0h", "-1h", "1.5h", "h"])
def test_a_bad_period_is_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_period(text)


def test_the_query_form_round_trips_and_bounds_hold() -> None:
    assert Schedule.parse("feed-a/3600/if_idle") == Schedule("feed-a", 3600.0, True)
    assert Schedule.parse(Schedule("x", 900.0).query) == Schedule("x", 900.0)
    for bad in ("feed-a/59", "feed-a/0", "/3600", "feed a/3600", "feed-a/3600/yes"):
        with pytest.raises(ValidationError, match="schedule"):
            Schedule.parse(bad)
    with pytest.raises(ValidationError, match="period"):
        Schedule("x", 30.0)


def test_a_key_is_iso_8601_in_utc_with_four_digits_of_year() -> None:
    daily = Schedule("t", 86400.0)
    tick = daily.tick(datetime(1, 1, 1, 5, tzinfo=UTC))
    assert tick == datetime(1, 1, 1, tzinfo=UTC)
    assert daily.key(tick) == "schedule/t/0001-01-01T00:00:00Z"
    assert daily.key(daily.tick(datetime(9999, 12, 31, 23, tzinfo=UTC))) == "schedule/t/9999-12-31T00:00:00Z"


@pytest.mark.parametrize(
    ("every_s", "text"),
    [
        (400 * 86400.0, "0001-01-01T00:00:00+00:00"),  # its period began in year 0
        (86400.0, "0001-01-01T00:00:00+01:00"),  # year 0 in UTC
        (3600.0, "9999-12-31T23:59:59-01:00"),  # year 10000 in UTC
    ],
)
def test_a_tick_whose_period_does_not_begin_within_the_calendar_is_a_validation_error(
    every_s: float, text: str
) -> None:
    with pytest.raises(ValidationError, match="0001-01-01 to 9999-12-31") as raised:
        Schedule("t", every_s).tick(parse_tick(text))
    assert raised.value.field == "tick"


@pytest.mark.parametrize("text", ["yesterday", "2026-12-07T02:00:00", ""])
def test_a_tick_is_an_iso_time_with_its_offset(text: str) -> None:
    with pytest.raises(ValidationError) as raised:
        parse_tick(text)
    assert raised.value.field == "tick"
