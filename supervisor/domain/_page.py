"""Which jobs a caller asks for: a filter (``JobFilter``), and a page of the list under one (``PageRequest``).

The wire's text (``?status=failed&reason=all_feeds_unavailable&param.feed=...&since=...``) becomes these values at the
edge (``parse``, called by the API); the core and the registry take only the values, which cannot be built out of
bounds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ._errors import ValidationError
from ._idempotency import key_problem
from ._kinds import KindCatalog
from ._model import JobStatus
from ._param_values import ParamValue
from ._params import INT64_MAX, INT64_MIN

MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
# The shape of every cursor a registry issues: a row's sequence number in ASCII digits that fit a 64-bit integer
# (int() also takes '1_0', '-3' and other scripts' digits). Opaque to callers; the OpenAPI document states it.
CURSOR_PATTERN = re.compile(r"[0-9]{1,18}")
# A filter on a param, as the query names it: ``param.NAME``.
PARAM_PREFIX = "param."
# What a filter's text may name, beside ``param.NAME``: the wire's names, in the order they are documented.
FILTER_NAMES = ("status", "kind", "reason", "host", "since", "until", "ended_since", "idempotency_key")
# The registry's limits on a filter's value, stated once (the API's parse, the bulk body's and the CLI's check them
# through ``JobFilter``): an int param is a 64-bit integer (what SQLite holds; every backend compares it as a
# number); a float one is finite; a time is one that moves to UTC within the calendar a datetime holds (years 1 to
# 9999), as every registry keeps and compares times in UTC.
FILTER_INT_RANGE = (INT64_MIN, INT64_MAX)
FILTER_TIME_RANGE = (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))


@dataclass(frozen=True)
class JobFilter:
    """Rows whose every given field matches: ``reason`` the row's error or planned-outcome reason; ``params`` each a
    declared param's value (equality); ``created_since`` / ``created_until`` the row's creation (from, before);
    ``ended_since`` its end; ``host`` the host that ran it; ``idempotency_key`` the jobs that live key answered."""

    status: JobStatus | None = None
    kind: str | None = None
    reason: str | None = None
    params: tuple[tuple[str, ParamValue], ...] = ()
    created_since: datetime | None = None
    created_until: datetime | None = None
    ended_since: datetime | None = None
    host: str | None = None
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("created_since", "created_until", "ended_since"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, filter_time(value, _wire(name)))
        for name, value in self.params:
            param_problem = _param_problem(value)
            if param_problem is not None:
                where = f"{PARAM_PREFIX}{name}"
                raise ValidationError(f"{where} must be {param_problem}, not {value!r}", field=where)
        problem = key_problem(self.idempotency_key) if self.idempotency_key is not None else None
        if problem is not None:
            raise ValidationError(f"idempotency_key {problem}", field="idempotency_key")

    @property
    def everything(self) -> bool:
        return self == JobFilter()

    @classmethod
    def parse(cls, given: Mapping[str, str], kinds: KindCatalog | None = None) -> JobFilter:
        """The filter from its wire text (``FILTER_NAMES`` and ``param.NAME``); a bad name or value is a
        ``ValidationError`` naming it. A param is compared as the type the kinds declare it with (``kinds``: the
        catalog; with ``kind`` given, that kind's declaration)."""
        unknown = sorted(n for n in given if n not in FILTER_NAMES and not n.startswith(PARAM_PREFIX))
        if unknown:
            raise ValidationError(f"unknown filter {unknown[0]!r}", field=unknown[0])
        status = given.get("status")
        if status is not None and status not in {s.value for s in JobStatus}:
            raise ValidationError(f"unknown status {status!r}", field="status")
        params = tuple(
            sorted(
                (name[len(PARAM_PREFIX) :], _param_value(name[len(PARAM_PREFIX) :], text, given.get("kind"), kinds))
                for name, text in given.items()
                if name.startswith(PARAM_PREFIX)
            )
        )
        return cls(
            status=JobStatus(status) if status is not None else None,
            kind=given.get("kind"),
            reason=given.get("reason"),
            params=params,
            created_since=_time(given, "since"),
            created_until=_time(given, "until"),
            ended_since=_time(given, "ended_since"),
            host=given.get("host"),
            idempotency_key=given.get("idempotency_key"),
        )


def _wire(attr: str) -> str:
    return {"created_since": "since", "created_until": "until"}.get(attr, attr)


def filter_time(value: datetime, name: str) -> datetime:
    """``value`` in UTC, as a filter's time (``name``: the wire's); a naive time, or one that leaves the calendar
    on its move to UTC (``FILTER_TIME_RANGE``), is a ``ValidationError`` naming it."""
    if value.tzinfo is None:
        raise ValidationError(f"{name} needs its UTC offset (Z or +00:00)", field=name)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        low, high = (t.isoformat() for t in FILTER_TIME_RANGE)
        why = f"{name} must be from {low} to {high} in UTC, not {value.isoformat()}"
        raise ValidationError(why, field=name) from None


def parse_filter_time(text: str, name: str) -> datetime:
    """A filter's time from its wire text (ISO 8601 with its offset), within ``FILTER_TIME_RANGE``."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(
            f"{name} must be an ISO 8601 time with its UTC offset (2026-12-07T02:00:00Z), not {text!r}", field=name
        ) from None
    return filter_time(value, name)


def _time(given: Mapping[str, str], name: str) -> datetime | None:
    text = given.get(name)
    return parse_filter_time(text, name) if text is not None else None


def _param_problem(value: ParamValue) -> str | None:
    """What a param filter's value must be when it is not (None: it is within the registry's limits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = FILTER_INT_RANGE
        return None if low <= value <= high else f"an int from {low} to {high} (64-bit)"
    if isinstance(value, float) and not math.isfinite(value):
        return "a finite float"
    return None


def _param_value(name: str, text: str, kind: str | None, kinds: KindCatalog | None) -> ParamValue:
    """``text`` as the type ``name`` is declared with: by ``kind`` when given, else by every kind that declares it
    (which must agree)."""
    where = f"{PARAM_PREFIX}{name}"
    if kinds is None:
        return text
    if kind is not None and kind in kinds:
        declared = {kinds.get(kind).params.get(name)} - {None}
    else:
        declared = {kinds.get(k).params.get(name) for k in kinds.names()} - {None}
    if not declared:
        raise ValidationError(f"{where}: no kind{f' {kind!r}' if kind else ''} declares a param {name!r}", field=where)
    if len(declared) > 1:
        types = ", ".join(sorted(str(t) for t in declared))
        raise ValidationError(f"{where}: kinds declare it as {types}: name the kind", field=where)
    [type_name] = declared
    try:
        if type_name == "int":
            if not re.fullmatch(r"-?[0-9]{1,19}", text):
                raise ValueError
            number = int(text)
            if _param_problem(number) is not None:
                raise ValueError
            return number
        if type_name == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        if type_name == "bool":
            return {"true": True, "false": False}[text]
    except (ValueError, KeyError):
        low, high = FILTER_INT_RANGE
        wanted = {"int": f"an int from {low} to {high} (64-bit)", "float": "a finite float", "bool": "true or false"}[
            str(type_name)
        ]
        raise ValidationError(f"{where} must be {wanted}, not {text!r}", field=where) from None
    return text


@dataclass(frozen=True)
class PageRequest:
    """Rows under ``filter``, newest first, before the row ``before`` (its ``seq``: the previous page's cursor), at
    most ``limit``. Out of bounds is a ``ValidationError`` naming the field, at construction."""

    filter: JobFilter = field(default_factory=JobFilter)
    limit: int = DEFAULT_LIST_LIMIT
    before: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIST_LIMIT:
            raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}", field="limit")
        if self.before is not None and not 0 <= self.before < 10**18:
            raise ValidationError("cursor is not one this server issued", field="cursor")

    @classmethod
    def parse(
        cls,
        *,
        limit: int = DEFAULT_LIST_LIMIT,
        cursor: str | None = None,
        kinds: KindCatalog | None = None,
        **filters: str,
    ) -> PageRequest:
        """The request from its wire text: the filter's (``JobFilter.parse``), a cursor as a registry issued it."""
        if cursor is not None and not CURSOR_PATTERN.fullmatch(cursor):
            raise ValidationError("cursor is not one this server issued", field="cursor")
        return cls(
            JobFilter.parse({k: v for k, v in filters.items() if v is not None}, kinds),
            limit,
            int(cursor) if cursor is not None else None,
        )


# The first page of every row at the default size: a caller's default.
FIRST_PAGE = PageRequest()
