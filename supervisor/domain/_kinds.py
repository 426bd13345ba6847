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

import hashlib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ._errors import KindsFileError, ValidationError
from ._param_values import ParamValue, convert_param, param_arg
from ._params import ParamRule, RuleError

# A placeholder is a whole argv element, ``{name}``; inside any other element ``{{`` and ``}}`` each write one
# literal brace, and any other brace text is kept as written (see the module docstring).
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DOUBLED_BRACE = re.compile(r"\{\{|\}\}")
# Resubmission (ADR-150 D4), per kind: the defaults (a kind that declares nothing is never resubmitted; the
# bounds: ``_kinds_file``).
DEFAULT_MAX_ATTEMPTS = 1
DEFAULT_RETRY_BACKOFF_S = 60.0
DEFAULT_RETRY_BACKOFF_MAX_S = 3600.0


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
                out[name] = convert_param(name, type_name, params[name])
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
            m = PLACEHOLDER.fullmatch(element)
            if m is None:
                argv.append(_literal(element))
            elif m.group(1) == "python":
                argv.append(python)
            else:
                argv.append(param_arg(params[m.group(1)]))
        return argv


def coalesce_key(kind: str, params: Mapping[str, ParamValue]) -> str:
    """A canonical text of kind + params: equal keys mean interchangeable jobs."""
    return json.dumps([kind, params], sort_keys=True, separators=(",", ":"))


def _literal(element: str) -> str:
    """An argv element that is not a placeholder, as the job gets it: ``{{`` and ``}}`` become one brace each."""
    return _DOUBLED_BRACE.sub(lambda m: m.group(0)[0], element)


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
