"""Job kinds: what may be run. The control API is enqueue-only, so callers name a kind and pass params;
they never send a command line.

A kind is declared in TOML::

    [kinds.sleep]
    argv = ["{python}", "-c", "import sys, time; time.sleep(float(sys.argv[1]))", "{seconds}"]
    params = { seconds = "float" }      # str | int | float | bool: required
    # or, optional with a default: params = { seconds = { type = "float", default = 1 } }
    # and with constraints (``_params``): { type = "int", min = 0, max = 100 }, { type = "str", format = "url" },
    # { type = "str", choices = ["a", "b"] }, { type = "str", max_length = 200 }
    coalesce = false                     # identical queued jobs collapse into one
    then = ""                            # a kind to enqueue when this one succeeds
    exit_reasons = { 10 = "budget_exhausted" }   # exit codes that are planned outcomes, not crashes
    failure_reasons = { 3 = "all_feeds_failed" }  # exit codes that are failures with a name
    max_attempts = 1                     # starts a job may have in all; 1 (the default): never resubmitted
    retry_backoff_seconds = 60           # the wait before the first resubmission, doubling with each one ...
    retry_backoff_max_seconds = 3600     # ... up to this
    retry_on_exit_codes = [75]           # exit codes (1-255, none in exit_reasons) that mean "try again"
    max_running = 1                      # never more jobs of this kind running at once, fleet-wide (default: no
                                         # limit but the supervisor's own max_concurrent)
    deadline_seconds = 3600              # one attempt's wall-clock bound from its start: past it, stopped and
                                         # failed / deadline_exceeded, never resubmitted (default: none)
    memory_max_mb = 512                  # one job's memory bound: docker, the container's limit (swap included);
                                         # subprocess, its address space (ulimit -v) (default: none)
    heartbeats = true                    # its program posts heartbeats (PODCAST_JOB_HEARTBEAT_URL): a hang is
                                         # noticed by the absence judge (check-config warns of a kind with neither)

Braces in argv:

- An element that is exactly ``{name}`` is a placeholder, replaced by the param's validated value: no shell, no
  splitting. ``name`` must be a declared param or ``python``, the interpreter jobs run with (the supervisor's own in
  subprocess mode, the image's ``python3`` in docker mode); any other is refused when the file is loaded.
- In any element, ``{{`` writes one literal ``{`` and ``}}`` one ``}``: an element that must literally be ``{x}``
  is written ``{{x}}``.
- Any other brace text is kept as written, so shell code and Python f-strings can be declared as they are::

      argv = ["sh", "-c", "echo ${HOME}"]
      argv = ["{python}", "-c", "import sys; n = sys.argv[1]; print(f'got {n}')", "{n}"]

  A placeholder inside a longer element is therefore not one: ``"--n={n}"`` is passed as written; pass
  ``"--n", "{n}"`` instead. And code that itself contains ``{{`` or ``}}`` (an f-string's escaped brace, a shell's
  ``${a:-${b}}``) must double each of those braces again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ._errors import KindsFileError, ValidationError
from ._params import INT64_MAX, INT64_MIN, INT_TEXT, RULE_KEYS, ParamRule, RuleError, parse_rule

ParamValue = str | int | float | bool
PARAM_TYPES = ("str", "int", "float", "bool")
MAX_STR_PARAM_LEN = 4096

# A placeholder is a whole argv element, ``{name}``; inside any other element ``{{`` and ``}}`` each write one
# literal brace, and any other brace text is kept as written (see the module docstring).
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DOUBLED_BRACE = re.compile(r"\{\{|\}\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
# Numbers given as strings (the CLI's -p k=v): ASCII digits only. Python's \d, int() and float() also accept
# other scripts' digits ('\u0661') and underscores ('1_0'), which no caller means. An int: ``_params.INT_TEXT``.
# Bounded (20 digits either side of the point, a two-digit exponent) so that every match is a finite float: the
# OpenAPI document uses this very pattern, and a pattern cannot say "and not too large" ("1e999" is inf).
ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][+-]?[0-9]{1,2})?")
# The largest finite float: a JSON number beyond it is refused (the document states the same bound).
MAX_FLOAT = sys.float_info.max
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
# Resubmission (ADR-150 D4), per kind: the defaults (a kind that declares nothing is never resubmitted) ...
DEFAULT_MAX_ATTEMPTS = 1
MAX_RUNNING_LIMIT = 10_000
DEFAULT_RETRY_BACKOFF_S = 60.0
DEFAULT_RETRY_BACKOFF_MAX_S = 3600.0
# ... and the bounds. TOML integers and floats are unbounded (99999999999999999999, inf), and a value must stay one
# that a registry column and a date can hold: more starts than this is a loop, not a retry; a wait of more than a
# year is not a backoff.
MAX_ATTEMPTS_LIMIT = 100
RETRY_BACKOFF_LIMIT_S = 365 * 86400.0


@dataclass(frozen=True)
class JobKind:
    """One runnable kind of job."""

    name: str
    argv: tuple[str, ...]
    params: Mapping[str, str] = field(default_factory=dict)  # name -> type
    # The value a caller who omits the param gets (already of its type); a param not here is required.
    param_defaults: Mapping[str, ParamValue] = field(default_factory=dict)
    # The constraints a param declares beside its type (``_params``); a param not here has none.
    param_rules: Mapping[str, ParamRule] = field(default_factory=dict)
    coalesce: bool = False
    then: str | None = None
    exit_reasons: Mapping[int, str] = field(default_factory=dict)
    failure_reasons: Mapping[int, str] = field(default_factory=dict)
    # Resubmission (ADR-150 D4): the starts a job of this kind may have in all (1: it is never resubmitted); the wait
    # before its first resubmission, doubling with each further one up to ``retry_backoff_max_s``; and the exit
    # codes that mean "try again" (EX_TEMPFAIL, 75). Declared here; what is resubmitted is the core's to decide.
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S
    retry_backoff_max_s: float = DEFAULT_RETRY_BACKOFF_MAX_S
    retry_on_exit_codes: frozenset[int] = frozenset()
    # Never more jobs of this kind RUNNING at once, fleet-wide: counted from the running rows in the promotion's own
    # step, like max_concurrent (a count of rows, never a semaphore beside them). None: no limit of its own.
    max_running: int | None = None
    # One attempt's wall-clock bound, from its recorded start: past it the sweeper stops it (identity-verified),
    # and it ends failed / deadline_exceeded. None: no bound of its own.
    deadline_s: float | None = None
    # Its program posts heartbeats (a declaration: check-config warns of a kind that neither beats nor has a deadline,
    # for nothing would notice it hang).
    heartbeats: bool = False
    # One job's memory bound in MiB: in docker mode the container's limit, swap included (the kernel kills it:
    # killed_out_of_memory); in subprocess mode its address space (RLIMIT_AS: allocations past it fail, and the
    # program ends as it handles that). None: no bound of its own.
    memory_max_mb: int | None = None

    def validate_params(self, params: object) -> dict[str, ParamValue]:
        """Return the params converted to their declared types, or raise ``ValidationError`` naming the field.

        Values may arrive typed (JSON) or as strings (the CLI's ``-p key=value``); a string is accepted for a
        number or a bool only when it parses exactly. An omitted param with a default gets it here, so that the
        argv, the stored row and the coalescing key all see the value the job runs with.
        """
        if not isinstance(params, Mapping):
            raise ValidationError("params must be an object", field="params")
        out: dict[str, ParamValue] = {}
        for name in params:
            if name not in self.params:
                raise ValidationError(f"unknown param {name!r} for kind {self.name!r}", field=f"params.{name}")
        for name, type_name in self.params.items():
            if name in params:
                out[name] = _convert(name, type_name, params[name])
                rule = self.param_rules.get(name)
                if rule is not None:
                    try:
                        rule.check(out[name])
                    except RuleError as exc:
                        raise ValidationError(f"param {name!r} {exc}", field=f"params.{name}") from None
            elif name in self.param_defaults:
                out[name] = self.param_defaults[name]
            else:
                raise ValidationError(
                    f"missing param {name!r} ({type_name}) for kind {self.name!r}", field=f"params.{name}"
                )
        return out

    def render_argv(self, params: Mapping[str, ParamValue], *, python: str = sys.executable) -> list[str]:
        """The command line for validated ``params``: each placeholder element replaced whole.

        ``python``: what ``{python}`` becomes: this interpreter, or the one the job finds where it runs (an image's).
        """
        argv: list[str] = []
        for element in self.argv:
            m = _PLACEHOLDER.fullmatch(element)
            if m is None:
                argv.append(_literal(element))
            elif m.group(1) == "python":
                argv.append(python)
            else:
                argv.append(_to_arg(params[m.group(1)]))
        return argv


def coalesce_key(kind: str, params: Mapping[str, ParamValue]) -> str:
    """A canonical text of kind + params: equal keys mean interchangeable jobs."""
    return json.dumps([kind, params], sort_keys=True, separators=(",", ":"))


def _literal(element: str) -> str:
    """An argv element that is not a placeholder, as the job gets it: ``{{`` and ``}}`` become one brace each."""
    return _DOUBLED_BRACE.sub(lambda m: m.group(0)[0], element)


def _to_arg(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _convert(name: str, type_name: str, value: object) -> ParamValue:
    fld = f"params.{name}"

    def bad(why: str) -> ValidationError:
        return ValidationError(f"param {name!r} must be {type_name}: {why}", field=fld)

    if type_name == "str":
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
    if type_name == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad(f"got {value!r}")
    if type_name == "int":
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
    if type_name == "float":
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
    raise AssertionError(f"unvalidated param type {type_name!r}")  # kinds are validated at load


class KindCatalog:
    """The kinds this supervisor may run, built-ins first, then the operator's file."""

    def __init__(self, kinds: Mapping[str, JobKind]) -> None:
        self._kinds = dict(kinds)
        for kind in self._kinds.values():
            if kind.then and kind.then not in self._kinds:
                raise KindsFileError(f"kind {kind.name!r}: then = {kind.then!r} names no known kind")

    def get(self, name: object) -> JobKind:
        if not isinstance(name, str) or name not in self._kinds:
            known = ", ".join(sorted(self._kinds))
            raise ValidationError(f"unknown kind {name!r} (known: {known})", field="kind")
        return self._kinds[name]

    def names(self) -> list[str]:
        return sorted(self._kinds)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def deadlines(self) -> dict[str, float]:
        """Each kind's ``deadline_seconds``, for the kinds that have one."""
        return {name: kind.deadline_s for name, kind in self._kinds.items() if kind.deadline_s is not None}

    def running_limits(self) -> dict[str, int]:
        """Each kind's ``max_running``, for the kinds that have one: what a promotion counts per kind."""
        return {name: kind.max_running for name, kind in self._kinds.items() if kind.max_running is not None}

    def fingerprint(self) -> str:
        """A digest of every kind's definition (its argv template, params, outcome and retry rules): equal on two
        supervisors whose kinds are the same, whatever their files' layout or comments."""
        canonical = {name: _canonical(kind) for name, kind in sorted(self._kinds.items())}
        return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:16]


def _canonical(kind: JobKind) -> dict[str, Any]:
    """A kind as plain JSON values: mappings with text keys, sets as sorted lists."""

    def plain(value: Any) -> Any:
        if isinstance(value, ParamRule):
            return plain(value.declared())
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, frozenset | set):
            return sorted(value)
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value

    return {f.name: plain(getattr(kind, f.name)) for f in fields(kind)}


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
    """Validate one ``[kinds.NAME]`` table; errors name the kind and the key."""
    where = f"kind {name!r}"
    if not _NAME.match(name):
        raise KindsFileError(f"{where}: a kind name is letters, digits, '_' or '-' (at most 64)")
    if not isinstance(spec, dict):
        raise KindsFileError(f"{where}: must be a table")
    unknown = sorted(set(spec) - _KIND_KEYS)
    if unknown:
        raise KindsFileError(f"{where}: unknown key {unknown[0]!r}")
    argv = spec.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise KindsFileError(f"{where}: argv must be a non-empty list of strings")
    params, param_defaults, param_rules = _params(where, spec.get("params", {}))
    for element in argv:
        m = _PLACEHOLDER.fullmatch(element)
        if m is not None and m.group(1) != "python" and m.group(1) not in params:
            raise KindsFileError(
                f"{where}: argv element {element!r} is a placeholder that names no declared param "
                f"(declare {m.group(1)!r} in params, or write '{{{{{m.group(1)}}}}}' for the literal text {element})"
            )
    coalesce = spec.get("coalesce", False)
    if not isinstance(coalesce, bool):
        raise KindsFileError(f"{where}: coalesce must be true or false")
    then = spec.get("then", "")
    if not isinstance(then, str):
        raise KindsFileError(f'{where}: then must be a kind name or ""')
    exit_reasons = _reason_table(where, "exit_reasons", spec.get("exit_reasons", {}))
    failure_reasons = _reason_table(where, "failure_reasons", spec.get("failure_reasons", {}))
    if 0 in failure_reasons:
        raise KindsFileError(f"{where}: failure_reasons cannot name exit code 0")
    both = sorted(set(exit_reasons) & set(failure_reasons))
    if both:
        raise KindsFileError(f"{where}: exit code {both[0]} is in both exit_reasons and failure_reasons")
    max_attempts = _attempts(where, spec.get("max_attempts", DEFAULT_MAX_ATTEMPTS))
    backoff_s = _seconds(where, "retry_backoff_seconds", spec.get("retry_backoff_seconds", DEFAULT_RETRY_BACKOFF_S))
    backoff_max_s = _seconds(
        where, "retry_backoff_max_seconds", spec.get("retry_backoff_max_seconds", DEFAULT_RETRY_BACKOFF_MAX_S)
    )
    if backoff_max_s < backoff_s:
        given = "" if "retry_backoff_max_seconds" in spec else ", the default"
        raise KindsFileError(
            f"{where}: retry_backoff_max_seconds ({backoff_max_s:g}{given}) must be at least "
            f"retry_backoff_seconds ({backoff_s:g})"
        )
    retry_codes = _retry_codes(where, spec.get("retry_on_exit_codes", []), exit_reasons)
    max_running = spec.get("max_running")
    if max_running is not None and (
        isinstance(max_running, bool) or not isinstance(max_running, int) or not 1 <= max_running <= MAX_RUNNING_LIMIT
    ):
        raise KindsFileError(
            f"{where}: max_running must be a whole number from 1 to {MAX_RUNNING_LIMIT}, not {max_running!r}"
        )
    memory = spec.get("memory_max_mb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or not 16 <= memory <= 1 << 22):
        raise KindsFileError(f"{where}: memory_max_mb must be a whole number of MiB from 16 to 4194304, not {memory!r}")
    heartbeats = spec.get("heartbeats", False)
    if not isinstance(heartbeats, bool):
        raise KindsFileError(f"{where}: heartbeats must be true or false")
    deadline = spec.get("deadline_seconds")
    if deadline is not None:
        deadline = _seconds(where, "deadline_seconds", deadline)
    return JobKind(
        name=name,
        argv=tuple(argv),
        params=params,
        param_defaults=param_defaults,
        param_rules=param_rules,
        coalesce=coalesce,
        then=then or None,
        exit_reasons=exit_reasons,
        failure_reasons=failure_reasons,
        max_attempts=max_attempts,
        retry_backoff_s=backoff_s,
        retry_backoff_max_s=backoff_max_s,
        retry_on_exit_codes=retry_codes,
        max_running=max_running,
        deadline_s=deadline,
        heartbeats=heartbeats,
        memory_max_mb=memory,
    )


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
                defaults[pname] = _convert(pname, ptype, decl["default"])
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
            return _convert(pname, ptype, value)
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
