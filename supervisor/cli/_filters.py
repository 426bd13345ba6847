"""The filters that select jobs (``jobs`` and ``cancel``/``retry --all``): their flags, their values as the API's
query names, and a filter the server refused told as the flag that gave it.
"""

from __future__ import annotations

import argparse

from ..domain import FILTER_NAMES, PARAM_PREFIX, ValidationError, parse_filter_time
from ._client import ApiError
from ._command import EXIT_USAGE, Io


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """The list's filters beside --status, --kind and --idempotency-key (the API's names; checked by the server)."""
    p.add_argument("--reason", help="the error or planned-outcome reason (all_feeds_unavailable, exit_code_1, ...)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a declared param's value")
    p.add_argument("--since", metavar="TIME", help="created at or after TIME (ISO 8601 with its offset: ...Z)")
    p.add_argument("--until", metavar="TIME", help="created before TIME")
    p.add_argument("--ended-since", metavar="TIME", help="ended at or after TIME")
    p.add_argument("--host", help="run by this host")


def filters_of(args: argparse.Namespace) -> dict[str, str]:
    """The filter arguments as the API's query names; a --param without '=' is a usage error (ValueError)."""
    out = {
        name: value
        for name, value in (
            ("reason", args.reason), ("since", args.since), ("until", args.until), ("ended_since", args.ended_since),
            ("host", args.host),
        )
        if value is not None
    }  # fmt: skip
    for name in ("since", "until", "ended_since"):
        if name in out:
            try:
                parse_filter_time(out[name], name)  # the registry's limits, as the server checks them
            except ValidationError as exc:
                raise ValueError(f"{_filter_flag(name)}: {exc}") from None
    for given in args.param:
        name, sep, value = given.partition("=")
        if not sep or not name:
            raise ValueError(f"--param {given!r}: give NAME=VALUE")
        out[f"param.{name}"] = value
    return out


def _filter_flag(field: str) -> str:
    """The flag that gave a filter's field (``param.n``: ``--param n``; ``filter.ended_since``: ``--ended-since``)."""
    field = field.removeprefix("filter.")
    if field.startswith("param."):
        return f"--param {field.removeprefix('param.')}"
    return "--" + field.replace("_", "-")


def filter_refused(exc: ApiError, io: Io) -> int:
    """A filter the server refused (a 422 naming one: a type the kinds declare, a value beyond the registry's
    limits) is the caller's usage error, named by its flag; any other error goes on up."""
    field = (exc.field or "").removeprefix("filter.")
    if exc.status != 422 or not (field in FILTER_NAMES or field.startswith(PARAM_PREFIX)):
        raise exc
    io.error(f"{_filter_flag(field)}: {str(exc).removeprefix('filter: ')}")
    return EXIT_USAGE
