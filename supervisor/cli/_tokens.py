"""``supervisor token``: the named API tokens with a scope, in the tokens file this machine's settings name (no
server asked; a running one applies a change on SIGHUP).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..domain import SCOPES, ConfigError, TokenFile, load_config, to_iso, utc_now
from ._args import add_local_verb
from ._command import EXIT_CONFIG, EXIT_ERROR, EXIT_OK, EXIT_USAGE, Io


def cmd_token(args: argparse.Namespace) -> int:
    """``token add|list|revoke``: the named API tokens, in the file this machine's settings name. A new token is
    printed once, alone on stdout; everything else goes to stderr. A running server applies a change on SIGHUP."""
    io: Io = args.io
    usage = {
        "add": (args.name is None or args.scope is None, "token add needs NAME and --scope read|enqueue|operator"),
        "revoke": (args.name is None or args.scope is not None, "token revoke takes NAME only"),
        "list": (args.name is not None or args.scope is not None, "token list takes no NAME or --scope"),
    }
    wrong, why = usage[args.action]
    if wrong:
        io.error(why)
        return EXIT_USAGE
    try:
        config, _ = load_config(io.environ, config_file=args.config)
    except ConfigError as exc:
        io.error(str(exc))
        return EXIT_CONFIG
    tokens = TokenFile(config.tokens_path)
    try:
        if args.action == "add":
            token = tokens.add(args.name, args.scope, utc_now())
            io.print(token)
            io.note(
                f"added token {args.name!r} (scope {args.scope}) to {tokens.path}: it is shown this once, never "
                "stored. A running supervisor takes it after a SIGHUP."
            )
            if config.api_token is None and args.scope != "operator":
                operators = [t for t in tokens.read().values() if t.scope == "operator"]
                if not operators:
                    io.note(
                        "note: every route but health and metrics now needs a token, and no token has the operator "
                        "scope: add one (--scope operator) or set PODCAST_JOB_API_TOKEN"
                    )
        elif args.action == "revoke":
            gone = tokens.revoke(args.name)
            io.note(f"revoked token {gone.name!r} (scope {gone.scope}); a running supervisor drops it after a SIGHUP")
        else:
            listed = sorted(tokens.read().values(), key=lambda t: t.name)
            if args.json:
                rows = [{"name": t.name, "scope": t.scope, "created_at": to_iso(t.created_at)} for t in listed]
                io.print(json.dumps(rows, indent=2))
            else:
                for t in listed:
                    io.print(f"{t.name:24} {t.scope:9} {to_iso(t.created_at)}")
                if not listed:
                    io.note(f"no named tokens in {tokens.path}")
    except ConfigError as exc:
        io.error("; ".join(exc.problems))
        return EXIT_ERROR
    except OSError as exc:
        io.error(f"{tokens.path}: {exc.strerror or exc}")
        return EXIT_CONFIG
    return EXIT_OK


def add_token_verb(verbs: Any) -> None:
    """token add|list|revoke."""
    p = add_local_verb(
        verbs,
        "token",
        "named API tokens with a scope (read, enqueue, operator): add prints a new one, list shows them, revoke "
        "removes one; a running supervisor applies the change on SIGHUP",
    )
    p.add_argument("action", choices=["add", "list", "revoke"])
    p.add_argument("name", nargs="?", help="the token's name: 1-64 letters, digits, '.', '_' or '-'")
    p.add_argument(
        "--scope",
        choices=SCOPES,
        help="add: read (every GET), enqueue (read and adding jobs) or operator (everything)",
    )
    p.add_argument("--json", action="store_true", help="list: as JSON")
    p.set_defaults(func=cmd_token)
