"""A param's value as a job gets it: a caller's value (typed, from JSON, or text, from the CLI's ``-p key=value``)
converted to the param's declared type (``convert_param``: a ``ValidationError`` naming ``params.NAME`` otherwise),
and that value as an argv element (``param_arg``)."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable

from ._errors import ValidationError
from ._params import INT64_MAX, INT64_MIN, INT_TEXT

ParamValue = str | int | float | bool
PARAM_TYPES = ("str", "int", "float", "bool")
MAX_STR_PARAM_LEN = 4096
# Numbers given as strings (the CLI's -p k=v): ASCII digits only. Python's \d, int() and float() also accept
# other scripts' digits ('\u0661') and underscores ('1_0'), which no caller means. An int: ``_params.INT_TEXT``.
# Bounded (20 digits either side of the point, a two-digit exponent) so that every match is a finite float: the
# OpenAPI document uses this very pattern, and a pattern cannot say "and not too large" ("1e999" is inf).
ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][+-]?[0-9]{1,2})?")
# The largest finite float: a JSON number beyond it is refused (the document states the same bound).
MAX_FLOAT = sys.float_info.max
# How a converter refuses a value: the error naming the param and its type, with why.
Refusal = Callable[[str], ValidationError]


def convert_param(name: str, type_name: str, value: object) -> ParamValue:
    """``value`` as the ``type_name`` param ``name``: a number or a bool given as text only when it parses exactly."""

    def bad(why: str) -> ValidationError:
        return ValidationError(f"param {name!r} must be {type_name}: {why}", field=f"params.{name}")

    convert = _CONVERTERS.get(type_name)
    if convert is None:
        raise AssertionError(f"unvalidated param type {type_name!r}")  # kinds are validated at load
    return convert(value, bad)


def _as_str(value: object, bad: Refusal) -> str:
    if not isinstance(value, str):
        raise bad(f"got {type(value).__name__}")
    if len(value) > MAX_STR_PARAM_LEN:
        raise bad(f"longer than {MAX_STR_PARAM_LEN} characters")
    if "\x00" in value:
        raise bad("contains a NUL character")
    # Every value must become an argv element (and may become an environment entry): bytes the OS can take.
    # A lone surrogate is valid JSON but has no UTF-8 encoding, and would fail only later, inside the spawn.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("is not valid Unicode text (a lone surrogate)") from None
    # A whole argv element starting with '-' would be read by the child as an option.
    if value.startswith("-"):
        raise bad("must not start with '-'")
    return value


def _as_bool(value: object, bad: Refusal) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad(f"got {value!r}")


def _as_int(value: object, bad: Refusal) -> int:
    if isinstance(value, bool):
        raise bad("got a bool")
    if isinstance(value, float) and value.is_integer():
        # JSON has one number type: 427.0 is an integer to JSON Schema (and to the OpenAPI document), so here.
        value = int(value)
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise bad(f"beyond a 64-bit integer ({INT64_MIN} to {INT64_MAX})")
        return value
    if isinstance(value, str) and INT_TEXT.fullmatch(value):
        return int(value)
    raise bad(f"got {value!r} (as text: an optional sign and at most 18 digits, no leading zero)")


def _as_float(value: object, bad: Refusal) -> float:
    if isinstance(value, bool):
        raise bad("got a bool")
    number: float
    if isinstance(value, int | float):
        if not -MAX_FLOAT <= value <= MAX_FLOAT:
            raise bad("not finite")  # an int past it: float() would raise OverflowError (it answered 500)
        number = float(value)
    elif isinstance(value, str):
        # float() also takes '1_0', ' 1 ', 'nan' and non-ASCII digits: only a plain ASCII number passes.
        if not ASCII_FLOAT.fullmatch(value):
            raise bad(f"got {value!r}")
        number = float(value)
    else:
        raise bad(f"got {type(value).__name__}")
    if not math.isfinite(number):
        raise bad("not finite")
    return number


_CONVERTERS: dict[str, Callable[[object, Refusal], ParamValue]] = {
    "str": _as_str,
    "bool": _as_bool,
    "int": _as_int,
    "float": _as_float,
}


def param_arg(value: ParamValue) -> str:
    """A validated value as its argv element: a bool as ``true``/``false``, anything else as its text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
