"""The kinds file (``PODCAST_JOB_KINDS_FILE``, its syntax in ``_kinds``' docstring and docs/job-kinds.md) read into
a ``KindCatalog``: each ``[kinds.NAME]`` table checked key by key (``parse_kind``: an error names the kind and the
key), over the built-in kinds, which are written as such tables and parsed by the same code."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import KindsFileError, ValidationError
from ._kinds import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_MAX_S,
    DEFAULT_RETRY_BACKOFF_S,
    PLACEHOLDER,
    JobKind,
    KindCatalog,
)
from ._param_values import PARAM_TYPES, ParamValue, convert_param
from ._params import RULE_KEYS, ParamRule, RuleError, parse_rule

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
# Exit codes of pipeline_runner that are planned outcomes (ADR-0002, INV-BUDGET-IS-AN-OUTCOME) ...
PIPELINE_EXIT_REASONS = {10: "budget_exhausted", 11: "time_budget_exhausted"}
# ... those that are failures with a name an operator can act on ...
PIPELINE_FAILURE_REASONS = {
    2: "invalid_params",  # its usage code: the params slipped past the kind's rules; never started again
    3: "all_feeds_failed",
    75: "all_feeds_unavailable",
    143: "terminated",
}
# ... and those that mean "start it again" (attempts permitting): 75 (EX_TEMPFAIL), the runner's own "failed, but
# transiently"; 143, its "terminated" (SIGTERM/SIGINT from outside: a host shutdown, `kill`, `docker stop`), since a
# polite kill is a kill (ADR-150 D4); 137 (128 + 9), how docker mode reports a container SIGKILLed from outside (the
# OOM killer aside, which the engine names): the engine cannot tell a signal from an exit code (ADR 0005 §6). In
# subprocess mode a SIGKILL is seen as the signal itself, and 137 is only what the program itself exits with.
# pipeline_runner's EXIT_CODES is the same contract on its side: tests/runner/test_runner_exit_code_contract.py
# holds the two equal.
PIPELINE_RETRY_EXIT_CODES = [75, 137, 143]
# A run is safe to repeat (the corpus is crash-only, and the poison-pill memo skips an episode that keeps failing),
# so a crashed one gets up to two more starts, about 60 s and 120 s later (the default backoff).
PIPELINE_MAX_ATTEMPTS = 3
# The runner's own bounds on its params (pipeline_runner's MAX_EPISODES and FEED_URL_MAX_LENGTH; a contract test holds
# them equal), which the built-in pipeline kind declares.
MAX_EPISODES = 1_000_000
FEED_URL_MAX_LENGTH = 2048
# The bounds of a kind's resubmission (its defaults: ``_kinds``) and of its max_running. TOML integers and floats are
# unbounded (99999999999999999999, inf), and a value must stay one that a registry column and a date can hold: more
# starts than this is a loop, not a retry; a wait of more than a year is not a backoff.
MAX_ATTEMPTS_LIMIT = 100
RETRY_BACKOFF_LIMIT_S = 365 * 86400.0
MAX_RUNNING_LIMIT = 10_000


# The built-in kinds, written as the tables an operator would put in a kinds file and parsed by the same code, so
# that they obey every rule a kinds file must (a placeholder names a param, a default is of its type, ...).
_BUILTINS: dict[str, dict[str, Any]] = {
    "pipeline": {
        # --poison-threshold 2, one below max_attempts: an episode that kills the runner on every attempt is skipped
        # as poisoned by the last attempt, which then finishes the run (ADR 0009); with the runner's default of 3 the
        # job's attempts would be spent on it before the memo ever skipped it.
        "argv": [
            "{python}",
            "-m",
            "pipeline_runner",
            "run",
            "--feed",
            "{feed}",
            "--max-episodes",
            "{max_episodes}",
            "--poison-threshold",
            "2",
        ],
        # What the runner itself checks, declared so that a job it would refuse is never queued (ADR 0017): an http(s)
        # feed URL; max_episodes 0 (every episode of the feed) up to the runner's own MAX_EPISODES.
        "params": {
            "feed": {"type": "str", "format": "url", "max_length": FEED_URL_MAX_LENGTH},
            "max_episodes": {"type": "int", "default": 0, "min": 0, "max": MAX_EPISODES},
        },
        "then": "enrichment",
        "exit_reasons": PIPELINE_EXIT_REASONS,
        "failure_reasons": PIPELINE_FAILURE_REASONS,
        "max_attempts": PIPELINE_MAX_ATTEMPTS,
        "retry_on_exit_codes": PIPELINE_RETRY_EXIT_CODES,
        "heartbeats": True,
    },
    "enrichment": {
        "argv": ["{python}", "-m", "pipeline_runner", "enrich"],
        "coalesce": True,
        # The same runner, the same exit codes: a pass that a reboot or `docker stop` ended starts again (it reads
        # the whole corpus as it finds it, so a repeat is the same pass).
        "exit_reasons": PIPELINE_EXIT_REASONS,
        "failure_reasons": PIPELINE_FAILURE_REASONS,
        "max_attempts": PIPELINE_MAX_ATTEMPTS,
        "retry_on_exit_codes": PIPELINE_RETRY_EXIT_CODES,
        "heartbeats": True,
    },
}


# A reboot stops a running job with SIGTERM (a program that handles it exits 143) and Docker's kill reports 137:
# a kind meant to survive one resubmits on them.
REBOOT_EXIT_CODES = frozenset({137, 143})


def kind_warnings(kinds: KindCatalog) -> list[str]:
    """What ``supervisor check-config`` warns about an operator's kinds (the built-ins are safe): a kind that a
    reboot fails for good, and one that nothing would notice hang (no deadline, no heartbeats)."""
    builtin = set(_BUILTINS)
    out: list[str] = []
    for name in kinds.names():
        kind = kinds.get(name)
        if name in builtin:
            continue
        if kind.max_attempts == 1:
            out.append(
                f"kind {name!r}: a reboot fails its running jobs for good (max_attempts = 1): if its work may run "
                "again, set max_attempts = 3 and retry_on_exit_codes = [137, 143]"
            )
        elif not kind.retry_on_exit_codes >= REBOOT_EXIT_CODES:
            out.append(
                f"kind {name!r}: a job that exits 143 on a reboot's SIGTERM (137 when Docker kills it) is not "
                "resubmitted: add 137 and 143 to retry_on_exit_codes"
            )
        if kind.deadline_s is None and not kind.heartbeats:
            out.append(
                f"kind {name!r}: nothing would notice a job of it that hangs: set deadline_seconds, or have it post "
                "heartbeats to PODCAST_JOB_HEARTBEAT_URL and declare heartbeats = true"
            )
    return out


def builtin_kinds() -> dict[str, JobKind]:
    """``pipeline`` and ``enrichment``: the two kinds the product exists for."""
    return {name: parse_kind(name, copy.deepcopy(spec)) for name, spec in _BUILTINS.items()}


_KIND_KEYS = {
    "argv",
    "params",
    "coalesce",
    "then",
    "exit_reasons",
    "failure_reasons",
    "max_attempts",
    "retry_backoff_seconds",
    "retry_backoff_max_seconds",
    "retry_on_exit_codes",
    "max_running",
    "deadline_seconds",
    "heartbeats",
    "memory_max_mb",
}


def parse_kind(name: str, spec: object) -> JobKind:
    """Validate one ``[kinds.NAME]`` table; errors name the kind and the key (the first found, in this order)."""
    where = f"kind {name!r}"
    table = _kind_table(where, name, spec)
    argv = _argv(where, table.get("argv"))
    params, param_defaults, param_rules = _params(where, table.get("params", {}))
    _check_placeholders(where, argv, params)
    coalesce = table.get("coalesce", False)
    if not isinstance(coalesce, bool):
        raise KindsFileError(f"{where}: coalesce must be true or false")
    then = table.get("then", "")
    if not isinstance(then, str):
        raise KindsFileError(f'{where}: then must be a kind name or ""')
    outcomes = _outcomes(where, table)
    resubmission = _resubmission(where, table, outcomes["exit_reasons"])
    bounds = _bounds(where, table)
    return JobKind(
        name=name,
        argv=tuple(argv),
        params=params,
        param_defaults=param_defaults,
        param_rules=param_rules,
        coalesce=coalesce,
        then=then or None,
        **outcomes,
        **resubmission,
        **bounds,
    )


def _kind_table(where: str, name: str, spec: object) -> dict[str, Any]:
    """``spec`` as a kind's table: its name one a kind may have, and no key a kind does not take."""
    if not _NAME.match(name):
        raise KindsFileError(f"{where}: a kind name is letters, digits, '_' or '-' (at most 64)")
    if not isinstance(spec, dict):
        raise KindsFileError(f"{where}: must be a table")
    unknown = sorted(set(spec) - _KIND_KEYS)
    if unknown:
        raise KindsFileError(f"{where}: unknown key {unknown[0]!r}")
    return spec


def _argv(where: str, argv: object) -> list[str]:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise KindsFileError(f"{where}: argv must be a non-empty list of strings")
    return argv


def _check_placeholders(where: str, argv: list[str], params: Mapping[str, str]) -> None:
    """Each whole-element ``{name}`` of ``argv`` names ``python`` or a declared param."""
    for element in argv:
        m = PLACEHOLDER.fullmatch(element)
        if m is not None and m.group(1) != "python" and m.group(1) not in params:
            raise KindsFileError(
                f"{where}: argv element {element!r} is a placeholder that names no declared param "
                f"(declare {m.group(1)!r} in params, or write '{{{{{m.group(1)}}}}}' for the literal text {element})"
            )


def _outcomes(where: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """``exit_reasons`` (planned outcomes) and ``failure_reasons`` (named failures): no code in both, no failure 0."""
    exit_reasons = _reason_table(where, "exit_reasons", table.get("exit_reasons", {}))
    failure_reasons = _reason_table(where, "failure_reasons", table.get("failure_reasons", {}))
    if 0 in failure_reasons:
        raise KindsFileError(f"{where}: failure_reasons cannot name exit code 0")
    both = sorted(set(exit_reasons) & set(failure_reasons))
    if both:
        raise KindsFileError(f"{where}: exit code {both[0]} is in both exit_reasons and failure_reasons")
    return {"exit_reasons": exit_reasons, "failure_reasons": failure_reasons}


def _resubmission(where: str, table: Mapping[str, Any], exit_reasons: Mapping[int, str]) -> dict[str, Any]:
    """``max_attempts``, the backoff (its first wait at most its longest) and ``retry_on_exit_codes`` (ADR-150 D4)."""
    max_attempts = _attempts(where, table.get("max_attempts", DEFAULT_MAX_ATTEMPTS))
    backoff_s = _seconds(where, "retry_backoff_seconds", table.get("retry_backoff_seconds", DEFAULT_RETRY_BACKOFF_S))
    backoff_max_s = _seconds(
        where, "retry_backoff_max_seconds", table.get("retry_backoff_max_seconds", DEFAULT_RETRY_BACKOFF_MAX_S)
    )
    if backoff_max_s < backoff_s:
        given = "" if "retry_backoff_max_seconds" in table else ", the default"
        raise KindsFileError(
            f"{where}: retry_backoff_max_seconds ({backoff_max_s:g}{given}) must be at least "
            f"retry_backoff_seconds ({backoff_s:g})"
        )
    return {
        "max_attempts": max_attempts,
        "retry_backoff_s": backoff_s,
        "retry_backoff_max_s": backoff_max_s,
        "retry_on_exit_codes": _retry_codes(where, table.get("retry_on_exit_codes", []), exit_reasons),
    }


def _bounds(where: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """What bounds and watches a job of the kind: ``max_running``, ``memory_max_mb``, ``heartbeats`` (a declaration)
    and ``deadline_seconds``."""
    max_running = table.get("max_running")
    if max_running is not None and (
        isinstance(max_running, bool) or not isinstance(max_running, int) or not 1 <= max_running <= MAX_RUNNING_LIMIT
    ):
        raise KindsFileError(
            f"{where}: max_running must be a whole number from 1 to {MAX_RUNNING_LIMIT}, not {max_running!r}"
        )
    memory = table.get("memory_max_mb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or not 16 <= memory <= 1 << 22):
        raise KindsFileError(f"{where}: memory_max_mb must be a whole number of MiB from 16 to 4194304, not {memory!r}")
    heartbeats = table.get("heartbeats", False)
    if not isinstance(heartbeats, bool):
        raise KindsFileError(f"{where}: heartbeats must be true or false")
    deadline = table.get("deadline_seconds")
    if deadline is not None:
        deadline = _seconds(where, "deadline_seconds", deadline)
    return {"max_running": max_running, "deadline_s": deadline, "heartbeats": heartbeats, "memory_max_mb": memory}


def _attempts(where: str, raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_ATTEMPTS_LIMIT:
        raise KindsFileError(
            f"{where}: max_attempts must be a whole number from 1 (never resubmit) to {MAX_ATTEMPTS_LIMIT}, not {raw!r}"
        )
    return raw


def _seconds(where: str, key: str, raw: object) -> float:
    """A wait in seconds: a number above 0, at most ``RETRY_BACKOFF_LIMIT_S`` (so finite: nan and inf fail the
    range, and an integer too large for a float is compared, never converted)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= RETRY_BACKOFF_LIMIT_S:
        raise KindsFileError(
            f"{where}: {key} must be a number of seconds above 0 and at most {RETRY_BACKOFF_LIMIT_S:.0f} (a year), "
            f"not {raw!r}"
        )
    return float(raw)


def _retry_codes(where: str, raw: object, exit_reasons: Mapping[int, str]) -> frozenset[int]:
    """``retry_on_exit_codes``: distinct exit codes 1 to 255, none of them a planned outcome."""
    key = "retry_on_exit_codes"
    if not isinstance(raw, list):
        raise KindsFileError(f"{where}: {key} must be a list of exit codes (1 to 255), not {raw!r}")
    codes: set[int] = set()
    for code in raw:
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise KindsFileError(f"{where}: {key}: {code!r} is not an exit code (1 to 255)")
        if code == 0:
            raise KindsFileError(f"{where}: {key} cannot name exit code 0 (success is never tried again)")
        if code in codes:
            raise KindsFileError(f"{where}: {key} names exit code {code} twice")
        if code in exit_reasons:
            # A planned outcome (a budget) is never a reason to run again (INV-BUDGET-IS-AN-OUTCOME).
            raise KindsFileError(f"{where}: exit code {code} is in both {key} and exit_reasons")
        codes.add(code)
    return frozenset(codes)


def _params(where: str, raw: object) -> tuple[dict[str, str], dict[str, ParamValue], dict[str, ParamRule]]:
    """The ``params`` table: each param's type, the defaults of those declared with one, and their constraints.

    A param is ``name = "type"`` (required) or ``name = { type = "type", default = value, <rules> }`` (``default``
    optional; a param with one may be omitted by the caller; the rules are ``_params.RULE_KEYS``). A default must
    itself be a valid value of the type that keeps its rules, checked here, so that a kinds file cannot declare a
    default no caller could send.
    """
    if not isinstance(raw, dict):
        raise KindsFileError(
            f'{where}: params must be a table of name = "type" or name = {{ type = "type", default = ... }}'
        )
    types: dict[str, str] = {}
    defaults: dict[str, ParamValue] = {}
    rules: dict[str, ParamRule] = {}
    for pname, decl in raw.items():
        if not _NAME.match(pname) or pname == "python":
            raise KindsFileError(f"{where}: param name {pname!r} is not allowed")
        if isinstance(decl, dict):
            unknown = sorted(set(decl) - {"type", "default", *RULE_KEYS})
            if unknown:
                keys = ", ".join(repr(k) for k in unknown)
                raise KindsFileError(
                    f"{where}: param {pname!r}: unknown key{'s' if len(unknown) > 1 else ''} {keys} "
                    f"(a param table takes type, default and the rules {', '.join(RULE_KEYS)})"
                )
            if "type" not in decl:
                raise KindsFileError(f"{where}: param {pname!r}: a param table needs a type")
            ptype = decl["type"]
        else:
            ptype = decl
        if not isinstance(ptype, str) or ptype not in PARAM_TYPES:
            raise KindsFileError(f"{where}: param {pname!r} has type {ptype!r}; use one of {PARAM_TYPES}")
        types[pname] = ptype
        if isinstance(decl, dict) and any(key in decl for key in RULE_KEYS):
            rules[pname] = _rule(where, pname, ptype, decl)
        if isinstance(decl, dict) and "default" in decl:
            try:
                defaults[pname] = convert_param(pname, ptype, decl["default"])
            except ValidationError as exc:
                raise KindsFileError(f"{where}: the default of {exc}") from None
            try:
                if pname in rules:
                    rules[pname].check(defaults[pname])
            except RuleError as exc:
                raise KindsFileError(f"{where}: param {pname!r}: the default {exc}") from None
    return types, defaults, rules


def _rule(where: str, pname: str, ptype: str, decl: Mapping[str, Any]) -> ParamRule:
    def convert(value: object) -> Any:
        try:
            return convert_param(pname, ptype, value)
        except ValidationError as exc:
            raise RuleError(f"a choice {exc}") from None

    try:
        return parse_rule(ptype, decl, convert)
    except RuleError as exc:
        raise KindsFileError(f"{where}: param {pname!r}: {exc}") from None


def _reason_table(where: str, key: str, raw: object) -> dict[int, str]:
    if not isinstance(raw, dict):
        raise KindsFileError(f"{where}: {key} must be a table of code = reason")
    table: dict[int, str] = {}
    for code, reason in raw.items():
        try:
            table[int(code)] = str(reason)
        except ValueError:
            raise KindsFileError(f"{where}: {key} key {code!r} is not an exit code") from None
    return table


def load_kinds(path: Path | None) -> KindCatalog:
    """The built-in kinds plus (overridden by) those in the operator's file."""
    kinds = builtin_kinds()
    if path is not None:
        try:
            with path.open("rb") as fh:
                data: dict[str, Any] = tomllib.load(fh)
        except OSError as exc:
            raise KindsFileError(f"{path}: cannot read: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise KindsFileError(f"{path}: not valid TOML: {exc}") from exc
        unknown = sorted(set(data) - {"kinds"})
        if unknown:
            raise KindsFileError(f"{path}: unknown top-level key {unknown[0]!r} (expected [kinds.NAME] tables)")
        table = data.get("kinds", {})
        if not isinstance(table, dict):
            raise KindsFileError(f"{path}: kinds must be a table")
        for name, spec in table.items():
            try:
                kinds[name] = parse_kind(name, spec)
            except KindsFileError as exc:
                raise KindsFileError(f"{path}: {exc}") from None
    return KindCatalog(kinds)
