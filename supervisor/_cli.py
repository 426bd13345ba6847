"""``supervisor`` command line: ``serve`` and ``check-config`` run locally; the other commands talk HTTP to a
running supervisor (``PODCAST_JOB_URL``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from ._config import Config, is_loopback, load_config
from ._errors import ConfigError, KindsFileError
from ._kinds import KindCatalog, load_kinds
from ._logging import configure_logging, get_logger

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3


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
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    effective = config.describe()
    effective["kinds"] = kinds.names()
    if args.json:
        print(json.dumps(effective, indent=2, sort_keys=True))
    else:
        for key, value in effective.items():
            print(f"{key:24} {value}")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from ._server import run_supervisor

    configure_logging()
    log = get_logger()
    try:
        config, kinds, warnings = _load(args)
    except (ConfigError, KindsFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in warnings:
        log.warning("config_fallback", detail=warning)
    if config.api_token is None and not is_loopback(config.bind_host):
        print(
            f"error: refusing to serve on {config.bind} without PODCAST_JOB_API_TOKEN: "
            "set a token, or bind to a loopback address",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        trio.run(run_supervisor, config, kinds)
    except OSError as exc:
        print(f"error: cannot serve on {config.bind}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="supervisor", description=__doc__)
    parser.add_argument("--config", type=Path, default=None, help="a TOML file of settings (env vars win)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the supervisor (HTTP API, sweeper, job monitors)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("check-config", help="print the effective configuration, or name every invalid setting")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
