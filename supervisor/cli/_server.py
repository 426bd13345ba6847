"""The verbs that run on this machine's settings, no server asked: ``serve`` runs the supervisor, ``check-config``
prints the configuration it would run with (or names every invalid setting), ``migrate`` brings the registry's
schema up to date.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ..domain import (
    Config,
    ConfigError,
    Credentials,
    KindCatalog,
    KindsFileError,
    RegistryError,
    RegistryNotOpened,
    SchemaNotHonoured,
    TokenFile,
    is_loopback,
    kind_warnings,
    load_config,
    load_kinds,
)
from ..observe import configure_logging, get_logger
from ._args import add_local_verb
from ._command import EXIT_CONFIG, EXIT_ERROR, EXIT_OK, EXIT_SCHEMA_CONTRACTED, EXIT_TEMPFAIL

if TYPE_CHECKING:
    from ..api import HttpLimits


T = TypeVar("T", bound=BaseException)
SWITCH_INTERVAL_S = 0.0005  # `serve` only: see cmd_serve


def _load(args: argparse.Namespace) -> tuple[Config, KindCatalog, list[str]]:
    config, warnings = load_config(os.environ, config_file=args.config)
    kinds = load_kinds(config.kinds_file)
    return config, kinds, warnings


def cmd_check_config(args: argparse.Namespace) -> int:
    problems: list[str] = []
    try:
        config, kinds, warnings = _load(args)
    except ConfigError as exc:
        problems.extend(exc.problems)
    except KindsFileError as exc:
        problems.append(f"PODCAST_JOB_KINDS_FILE: {exc}")
    named: int | None = None
    if not problems:
        try:
            named = len(TokenFile(config.tokens_path).read())
        except ConfigError as exc:
            problems.extend(f"PODCAST_JOB_API_TOKENS_FILE: {problem}" for problem in exc.problems)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in [*warnings, *kind_warnings(kinds)]:
        print(f"warning: {warning}", file=sys.stderr)
    effective = config.describe()
    effective["kinds"] = kinds.names()
    effective["api_tokens_file"] = str(config.tokens_path)  # where `token add` writes (the default resolved)
    effective["api_tokens"] = named
    if config.exec_mode == "subprocess":  # where "auto" lands on this machine, for this data dir
        run_dirs = config.run_dirs()
        effective["run_dir_path"] = str(run_dirs[0]) if run_dirs else None
    if args.json:
        print(json.dumps(effective, indent=2, sort_keys=True))
    else:
        for key, value in effective.items():
            print(f"{key:24} {value}")
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    """Bring the configured registry's schema up to date (what a supervisor does at start unless
    PODCAST_JOB_DATABASE_AUTO_MIGRATE=false), and say where it is and its version."""
    from ..registry import migrate_registry, registry_runtime

    try:
        config, _, warnings = _load(args)
    except (ConfigError, KindsFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)

    async def run() -> tuple[str, int]:
        async with registry_runtime(config):
            return await migrate_registry(config)

    try:
        where, version = trio.run(run)
    except BaseException as exc:
        # A refusal (a contract held back by a host, named) or a failure, in one line; inside the registry runtime's
        # own nursery (PostgreSQL's asyncio loop) it comes wrapped in a group.
        refused = _only(exc, RegistryError)
        if refused is None:
            raise
        print(f"error: {refused}", file=sys.stderr)
        return EXIT_ERROR
    print(f"registry {where}: schema version {version}")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from .. import run_supervisor

    configure_logging()
    log = get_logger()
    try:
        config, kinds, warnings = _load(args)
    except (ConfigError, KindsFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in warnings:
        log.warning("config_fallback", detail=warning)
    credentials = Credentials.from_config(config)
    try:
        credentials.load()
    except ConfigError as exc:
        print(f"error: PODCAST_JOB_API_TOKENS_FILE: {'; '.join(exc.problems)}", file=sys.stderr)
        return EXIT_CONFIG
    if not credentials.required and not is_loopback(config.bind_host):
        print(
            f"error: refusing to serve on {config.bind} without a token: set PODCAST_JOB_API_TOKEN(_FILE), add one "
            "with `supervisor token add NAME --scope operator`, or bind to a loopback address",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    # Threads hand the GIL over within this interval, not the default 5 ms: a worker thread that finished its
    # registry call waited up to that long behind a busy event loop before it could hand the result back (the
    # enqueue's and the promotion's tail latencies).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    limits = _open_files_for_connections(log)
    held = args.held.take if args.held is not None else None
    try:
        trio.run(
            functools.partial(
                run_supervisor, config, kinds, freeze_heap=True, credentials=credentials, http_limits=limits,
                held_signals=held,
            )
        )
    except OSError as exc:
        print(f"error: cannot serve on {config.bind}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BaseException as exc:
        # A registry that cannot be opened is the operator's to fix (configuration, exit 3), said in one line; the
        # same error inside the registry runtime's own nursery (PostgreSQL's asyncio loop) comes wrapped in a group.
        # One only locked by another process is a moment's: exit 75, which a unit restarts and an operator retries.
        opening = _only(exc, RegistryNotOpened)
        if opening is None:
            raise
        print(f"error: {opening}", file=sys.stderr)
        if isinstance(opening, SchemaNotHonoured):
            return EXIT_SCHEMA_CONTRACTED
        return EXIT_TEMPFAIL if opening.temporary else EXIT_CONFIG
    return EXIT_OK


def _open_files_for_connections(log: Any) -> HttpLimits:
    """Raise this process's soft limit on open files to its hard limit (the unit's ``LimitNOFILE``), and fit the HTTP
    server's connection bound to what it then allows (``HttpLimits.fitted_to``): a supervisor that runs out of
    descriptors can neither accept a connection nor start a job."""
    from ..api import HttpLimits  # the HTTP stack, only for serve: the client verbs start without it

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError) as exc:
            log.warning("open_files_limit_not_raised", soft=soft, hard=hard, error=str(exc))
    limits = HttpLimits().fitted_to(soft)
    if limits.max_connections < HttpLimits().max_connections:
        log.warning(
            "http_connections_bounded_by_open_files",
            open_files=soft,
            max_connections=limits.max_connections,
            fix="raise LimitNOFILE (systemd) or ulimit -n",
        )
    return limits


def _only(exc: BaseException, kind: type[T]) -> T | None:
    """``exc`` if it is a ``kind``, or the one ``kind`` a group of them (nested) holds; else None."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _only(exc.exceptions[0], kind)
    return None


def add_server_verbs(verbs: Any) -> None:
    """serve, check-config, migrate."""
    p = add_local_verb(verbs, "serve", "run the supervisor (HTTP API, sweeper, job monitors)")
    # serve's signal watcher takes the signals the entry held through the imports (run_supervisor's held_signals).
    p.set_defaults(func=cmd_serve, keeps_signals=True)
    p = add_local_verb(verbs, "check-config", "print the effective configuration, or name every invalid setting")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check_config)
    p = add_local_verb(verbs, "migrate", "bring the registry's schema up to date (as serve does unless told not to)")
    p.set_defaults(func=cmd_migrate)
