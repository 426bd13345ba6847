"""What a kind's param may be beyond its type: the constraints a kinds file declares beside it (ADR 0017).

    params = { max_episodes = { type = "int", default = 0, min = 0, max = 1000000 },
               feed = { type = "str", format = "url", max_length = 2048 },
               mode = { type = "str", choices = ["fast", "slow"] } }

``min``/``max`` bound an int or a float; ``choices`` lists the values a str or an int may take; ``format = "url"``
asks a str for an http or https URL with a host; ``max_length`` caps a str below the general limit. An enqueue that
breaks one is refused (422 ``params.NAME``) before any row is made, so a job its program would refuse is never
queued. Each rule is also the pattern the OpenAPI document states (``ParamRule.int_pattern``, ``URL_PATTERN``): what
the document calls valid is exactly what the server takes, for ints given as text (the CLI's ``-p k=v``) too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Every int param is a 64-bit signed integer: what a registry column, a JSON reader in another language and the job's
# own argument parser can all hold. A larger one is refused at enqueue, whatever else its kind declares.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# An int given as text: an optional sign and at most 18 digits without leading zeros (every such number is a 64-bit
# one). One spelling per number, so that a bounded range is one exact pattern (``int_range_pattern``).
INT_TEXT = re.compile(r"[+-]?(?:0|[1-9][0-9]{0,17})")
INT_TEXT_MAX = 10**18 - 1
# format = "url": http or https (any case), an optional user@, a host (a name, or an IPv6 literal in brackets), an
# optional port, then a path, query or fragment; no space or control character anywhere. What the runner fetches.
URL_PATTERN = (
    r"[Hh][Tt][Tt][Pp][Ss]?://(?:[^\x00-\x20\x7f/?#@\[\]]+@)?"
    r"(?:\[[0-9A-Fa-f:.]+\]|[^\x00-\x20\x7f/?#@:\[\]]+)(?::[0-9]{1,5})?(?:[/?#][^\x00-\x20\x7f]*)?"
)
_URL = re.compile(URL_PATTERN)
FORMATS = ("url",)
RULE_KEYS = ("min", "max", "choices", "format", "max_length")
# Which rule a type may declare (a bool takes none; a float's choices would compare floats for equality).
_ALLOWED = {"int": {"min", "max", "choices"}, "float": {"min", "max"}, "str": {"choices", "format", "max_length"}}


class RuleError(ValueError):
    """A value that breaks a rule, or a rule that cannot be declared; its text names what and why."""


@dataclass(frozen=True)
class ParamRule:
    """One param's constraints (each None: not declared)."""

    min: int | float | None = None
    max: int | float | None = None
    choices: tuple[str | int, ...] | None = None
    format: str | None = None
    max_length: int | None = None

    def declared(self) -> dict[str, Any]:
        """The constraints declared, as the kinds file has them (for the kinds' fingerprint and the document)."""
        out = {key: getattr(self, key) for key in RULE_KEYS if getattr(self, key) is not None}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        return out

    def check(self, value: object) -> None:
        """Raise ``RuleError`` saying which rule ``value`` (already of the param's type) breaks."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.min is not None and value < self.min:
                raise RuleError(f"must be at least {self.min}, got {value}")
            if self.max is not None and value > self.max:
                raise RuleError(f"must be at most {self.max}, got {value}")
        if isinstance(value, str):
            if self.max_length is not None and len(value) > self.max_length:
                raise RuleError(f"must be at most {self.max_length} characters, got {len(value)}")
            if self.format == "url" and not _URL.fullmatch(value):
                raise RuleError(f"must be an http or https URL with a host, got {_shown(value)}")
        if self.choices is not None and value not in self.choices:
            raise RuleError(f"must be one of {', '.join(map(repr, self.choices))}, got {_shown(value)}")

    def int_pattern(self) -> str:
        """The texts an int param of this rule takes (a ``fullmatch`` pattern): its choices, or its range."""
        if self.choices is not None:
            return "|".join(_int_text(int(c)) for c in self.choices)
        low = max(int(self.min), -INT_TEXT_MAX) if self.min is not None else -INT_TEXT_MAX
        high = min(int(self.max), INT_TEXT_MAX) if self.max is not None else INT_TEXT_MAX
        return int_range_pattern(low, high)


def parse_rule(type_name: str, table: Mapping[str, Any], convert: Any) -> ParamRule:
    """The rule a param table declares (``table`` minus its type and default); ``convert(value)``: a value of the
    param's type, or ``RuleError``. Raises ``RuleError`` naming the key that cannot be declared so."""
    declared = {key: table[key] for key in RULE_KEYS if key in table}
    refused = sorted(set(declared) - _ALLOWED.get(type_name, set()))
    if refused:
        allowed = ", ".join(sorted(_ALLOWED.get(type_name, ()))) or "none"
        raise RuleError(f"{refused[0]} is not a rule of a {type_name} param (its rules: {allowed})")
    low = _bound(type_name, "min", declared.get("min"))
    high = _bound(type_name, "max", declared.get("max"))
    if low is not None and high is not None and low > high:
        raise RuleError(f"min ({low}) is above max ({high})")
    fmt = declared.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise RuleError(f"format {fmt!r} is not known (known: {', '.join(FORMATS)})")
    max_length = declared.get("max_length")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise RuleError(f"max_length must be a whole number of characters above 0, not {max_length!r}")
    choices = _choices(declared.get("choices"), convert)
    rule = ParamRule(low, high, choices, fmt, max_length)
    for choice in choices or ():
        try:
            rule.check(choice)  # a choice the other rules refuse could never be sent
        except RuleError as exc:
            raise RuleError(f"choice {choice!r} {exc}") from None
    return rule


def _bound(type_name: str, key: str, raw: object) -> int | float | None:
    if raw is None:
        return None
    if type_name == "int":
        if isinstance(raw, bool) or not isinstance(raw, int) or not INT64_MIN <= raw <= INT64_MAX:
            raise RuleError(f"{key} of an int param must be a whole number (64-bit), not {raw!r}")
        return raw
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw or abs(raw) == float("inf"):
        raise RuleError(f"{key} of a float param must be a finite number, not {raw!r}")
    return float(raw)


def _choices(raw: object, convert: Any) -> tuple[str | int, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise RuleError(f"choices must be a non-empty list of values, not {raw!r}")
    values: list[str | int] = []
    for item in raw:
        value = convert(item)
        if value in values:
            raise RuleError(f"choices names {value!r} twice")
        values.append(value)
    return tuple(values)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int_text(value: int) -> str:
    """The texts of one int: ``5`` or ``+5``; ``-5``; zero with either sign."""
    if value == 0:
        return "[+-]?0"
    return f"\\+?{value}" if value > 0 else f"-{-value}"


def int_range_pattern(low: int, high: int) -> str:
    """A pattern matching exactly the ``INT_TEXT`` spellings of the integers from ``low`` to ``high`` (both within
    ``INT_TEXT_MAX`` either side): a sign, then the digits of each magnitude range written digit by digit."""
    alternatives: list[str] = []
    if low <= 0 <= high:
        alternatives.append("[+-]?0")
    if high >= 1:
        alternatives += [f"\\+?(?:{p})" for p in [_magnitudes(max(low, 1), high)] if p]
    if low <= -1:
        alternatives += [f"-(?:{p})" for p in [_magnitudes(max(-high, 1), -low)] if p]
    return "|".join(alternatives) or "(?!)"


def _magnitudes(low: int, high: int) -> str:
    """The digits (no leading zero) of every number from ``low`` to ``high``, ``1 <= low``."""
    parts: list[str] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        a = max(low, 10 ** (digits - 1))
        b = min(high, 10**digits - 1)
        if a <= b:
            parts += _same_length(str(a), str(b))
    return "|".join(parts)


def _same_length(a: str, b: str) -> Sequence[str]:
    """Patterns for every digit string from ``a`` to ``b`` (equal lengths, ``a <= b``), the classic split: the low
    end's tail, the whole digits between, the high end's tail."""
    if len(a) == 1:
        return [a if a == b else f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + p for p in _same_length(a[1:], b[1:])]
    rest = len(a) - 1
    out: list[str] = []
    first, last = int(a[0]), int(b[0])
    if a[1:] != "0" * rest:
        out += [a[0] + p for p in _same_length(a[1:], "9" * rest)]
        first += 1
    tail: list[str] = []
    if b[1:] != "9" * rest:
        tail = [b[0] + p for p in _same_length("0" * rest, b[1:])]
        last -= 1
    if first <= last:
        out.append(f"{first if first == last else f'[{first}-{last}]'}[0-9]{{{rest}}}")
    return out + tail
