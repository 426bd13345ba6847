"""Schedules made safe for a timer (docs/operations.md, "Periodic runs"): a systemd timer (or cron) runs
``supervisor enqueue KIND --schedule NAME --every PERIOD``; the tick -- now floored to the period, in UTC -- names
the request's idempotency key, ``schedule/NAME/TICK``, so any number of timers or hosts firing within one period make
one job, fleet-wide (INV-KEY-ONCE). ``if_idle`` skips a tick while a job of the schedule is queued or running.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ._errors import ValidationError

SCHEDULE_PREFIX = "schedule/"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PERIOD = re.compile(r"([1-9][0-9]{0,5})([smhd])")
UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_EVERY_S = 60.0
MAX_EVERY_S = 99_999_999.0  # eight digits of seconds: about three years
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # ticks are counted from it, so every host floors alike
# An enqueue's ``?schedule=``: NAME/PERIOD_S, and /if_idle (its period in whole seconds, 60 to MAX_EVERY_S).
SCHEDULE_QUERY = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63})/(6[0-9]|[7-9][0-9]|[1-9][0-9]{2,7})(/if_idle)?$"
)


def parse_tick(text: str) -> datetime:
    """A tick asked for by hand (``--tick``): ISO 8601 with its UTC offset (``2026-12-07T02:00:00Z``), any time a
    schedule can floor (``Schedule.tick`` says which); a ``ValidationError`` naming ``tick`` otherwise."""
    try:
        given = datetime.fromisoformat(text)
    except ValueError:
        example = "2026-12-07T02:00:00Z"
        raise ValidationError(f"tick {text!r}: an ISO 8601 time with its offset ({example})", field="tick") from None
    if given.tzinfo is None:
        raise ValidationError(f"tick {text!r}: give its UTC offset (Z or +00:00)", field="tick")
    return given


def parse_period(text: str) -> float:
    """``15m``, ``1h``, ``1d`` (an integer and s, m, h or d) in seconds, from a minute to a year."""
    m = PERIOD.fullmatch(text)
    if m is None:
        raise ValidationError(f"a period is a whole number and s, m, h or d (15m, 1h, 1d), not {text!r}", field="every")
    return float(int(m.group(1)) * UNITS_S[m.group(2)])


@dataclass(frozen=True)
class Schedule:
    """A schedule's name, its period and whether a tick is skipped while its last job is queued or running."""

    name: str
    every_s: float
    if_idle: bool = False

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValidationError(
                "a schedule's name is letters, digits, '_', '.' or '-' (at most 64), starting with a letter or digit",
                field="schedule",
            )
        if not (math.isfinite(self.every_s) and MIN_EVERY_S <= self.every_s <= MAX_EVERY_S):
            raise ValidationError(
                f"a schedule's period must be from 60 s to {MAX_EVERY_S:.0f} s, not {self.every_s:g}", field="schedule"
            )

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """``NAME/PERIOD_S`` or ``NAME/PERIOD_S/if_idle`` (an enqueue's query), a 422 naming ``schedule``."""
        m = SCHEDULE_QUERY.fullmatch(text)
        if m is None:
            raise ValidationError(
                f"schedule is NAME/PERIOD_S or NAME/PERIOD_S/if_idle (a period of 60 s or more), not {text!r}",
                field="schedule",
            )
        return cls(m.group(1), float(m.group(2)), m.group(3) is not None)

    @property
    def query(self) -> str:
        """The enqueue's ``?schedule=`` of this schedule."""
        return f"{self.name}/{self.every_s:.0f}{'/if_idle' if self.if_idle else ''}"

    def tick(self, at: datetime) -> datetime:
        """The start of the period ``at`` (an aware time) falls in: UTC, from the Unix epoch, so every host agrees. A
        ``ValidationError`` naming ``tick`` when that start is not a time of the calendar (0001-01-01 with a period
        of 400 days began in year 0)."""
        # Differences, not timestamp()/fromtimestamp(): a time near either end of the calendar stays exact, and a
        # tick past it is an error that names it, not a traceback.
        seconds = math.floor((at - EPOCH).total_seconds() / self.every_s) * self.every_s
        try:
            return EPOCH + timedelta(seconds=seconds)
        except OverflowError:
            raise ValidationError(
                f"tick {at.isoformat()}: the period of {self.every_s:.0f} s it falls in does not begin within "
                "0001-01-01 to 9999-12-31 (UTC); give another tick or a shorter period",
                field="tick",
            ) from None

    def key(self, tick: datetime) -> str:
        """The idempotency key of ``tick``'s enqueue: ``schedule/NAME/2026-12-07T02:00:00Z`` (ISO 8601 in UTC, the
        year always four digits: ``0001-01-01T00:00:00Z``)."""
        t = tick.astimezone(UTC)
        return f"{SCHEDULE_PREFIX}{self.name}/{t.year:04d}-{t:%m-%dT%H:%M:%S}Z"
