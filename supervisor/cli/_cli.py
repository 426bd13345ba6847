"""The supervisor's command line. serve, check-config, migrate and token work on this machine's settings and files;
the other commands talk HTTP to a running supervisor (PODCAST_JOB_URL, default http://127.0.0.1:8000), sending the
token in PODCAST_JOB_API_TOKEN or PODCAST_JOB_API_TOKEN_FILE: the operator token, or one made by supervisor token
add.

Exit codes: 0 done; 1 the server answered with an error (its message is printed); 2 usage; 3 configuration
(including a malformed PODCAST_JOB_URL); 4 the server could not be reached; 130 interrupted; 141 the reader of
its output went away. wait adds the outcome's: 10 failed, 11 cancelled, 12 stale, 124 the timeout passed.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import resource
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar

import trio

from ..domain import (
    FILTER_NAMES,
    PARAM_PREFIX,
    RELEASE,
    SCOPES,
    Config,
    ConfigError,
    Credentials,
    JobStatus,
    KindCatalog,
    KindsFileError,
    RegistryError,
    RegistryNotOpened,
    RequestError,
    Schedule,
    SchemaNotHonoured,
    SupervisorError,
    TokenFile,
    ValidationError,
    is_loopback,
    key_problem,
    kind_warnings,
    load_config,
    load_kinds,
    parse_filter_time,
    parse_period,
    parse_tick,
    read_token_file,
    to_iso,
    utc_now,
)
from ..observe import EVENT_NAMES, configure_logging, get_logger
from . import _live

if TYPE_CHECKING:
    from ..api import HttpLimits
from ._client import DEFAULT_URL, RETRY_ATTEMPTS, ApiError, Client, NotTheApi, Unreachable, with_retries

T = TypeVar("T", bound=BaseException)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_UNREACHABLE = 4
# sysexits' EX_TEMPFAIL: a temporary condition (the registry locked by another process at start), not a broken
# configuration; the same start may succeed later.
EXIT_TEMPFAIL = 75
# serve: a newer release contracted the registry's schema; this release cannot run on it (a restart loop would not
# help: the unit's RestartPreventExitStatus names it). As graphile-worker's exit on a breaking migration.
EXIT_SCHEMA_CONTRACTED = 5
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away
SWITCH_INTERVAL_S = 0.0005  # `serve` only: see cmd_serve

ENV_URL = "PODCAST_JOB_URL"
ENV_API_TOKEN = "PODCAST_JOB_API_TOKEN"
ENV_API_TOKEN_FILE = "PODCAST_JOB_API_TOKEN_FILE"
_TOKEN_HINT = (
    f"set {ENV_API_TOKEN} (or {ENV_API_TOKEN_FILE}) to a token of the server: its operator token, or one that "
    "supervisor token add made there (and the server took with a SIGHUP)"
)
# logs --follow: poll quickly while output flows, back off to at most FOLLOW_MAX_INTERVAL_S while it is quiet.
FOLLOW_MIN_INTERVAL_S = 0.2
FOLLOW_MAX_INTERVAL_S = 2.0
WAIT_DRAINED_POLL_S = 0.5  # hosts wait-drained: how often the hosts are read


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
    # registry call waited up to that long behind a busy event loop before it could hand the result back (issue
    # 10: enqueue and promotion tails).
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


def cmd_token(args: argparse.Namespace) -> int:
    """``token add|list|revoke``: the named API tokens, in the file this machine's settings name. A new token is
    printed once, alone on stdout; everything else goes to stderr. A running server applies a change on SIGHUP."""
    io: _Io = args.io
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


def _only(exc: BaseException, kind: type[T]) -> T | None:
    """``exc`` if it is a ``kind``, or the one ``kind`` a group of them (nested) holds; else None."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _only(exc.exceptions[0], kind)
    return None


# -- client commands: HTTP to a running supervisor ---------------------------------------------------


class _Io:
    """Where a client command writes, and the environment it reads (both injectable for tests)."""

    def __init__(self, environ: Mapping[str, str], out: TextIO, err: TextIO) -> None:
        self.environ = environ
        self.out = out
        self.err = err

    def print(self, *parts: object) -> None:
        print(*parts, file=self.out)

    def json(self, payload: Any) -> None:
        print(json.dumps(payload, indent=2, sort_keys=True), file=self.out)

    def write_bytes(self, data: bytes) -> None:
        buffer = getattr(self.out, "buffer", None)
        if buffer is not None:
            self.out.flush()
            buffer.write(data)
            buffer.flush()
        else:
            self.out.write(data.decode("utf-8", errors="replace"))
            self.out.flush()

    def error(self, message: str) -> None:
        print(f"error: {message}", file=self.err)

    def note(self, message: str) -> None:
        """What a human reads and a script ignores: to stderr, as it is."""
        print(message, file=self.err)


ClientCommand = Callable[[Client, argparse.Namespace, _Io], int]


def _run_client(command: ClientCommand) -> Callable[[argparse.Namespace], int]:
    """Wrap a client command: build the client from the environment, turn failures into messages and exit codes."""

    def run(args: argparse.Namespace) -> int:
        io: _Io = args.io
        url = io.environ.get(ENV_URL, "").strip() or DEFAULT_URL
        token = io.environ.get(ENV_API_TOKEN, "").strip() or None
        token_file = io.environ.get(ENV_API_TOKEN_FILE, "").strip()
        if token is None and token_file:
            try:
                token = read_token_file(Path(token_file))
            except ConfigError as exc:
                io.error(f"{ENV_API_TOKEN_FILE}: {exc}")
                return EXIT_CONFIG
        try:
            client = Client(url, token=token)
        except ValueError as exc:
            io.error(f"{ENV_URL}: {exc}")
            return EXIT_CONFIG
        try:
            with client:
                return command(client, args, io)
        except BaseExceptionGroup as group:
            # A live command runs on trio, whose nurseries wrap what they raise: an error of the client's, or the
            # Ctrl-C, is told as from any other command.
            leaf = _only_leaf(group)
            if leaf is None:
                raise
            return _leaf_exit(leaf, io, args)
        except (ApiError, Unreachable) as exc:
            return _leaf_exit(exc, io, args)
        except KeyboardInterrupt:
            return getattr(args, "interrupted_exit", EXIT_INTERRUPTED)

    return run


def _only_leaf(group: BaseExceptionGroup) -> BaseException | None:
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    kinds = (ApiError, Unreachable, KeyboardInterrupt)
    found = [leaf for leaf in leaves if isinstance(leaf, kinds)]
    return found[0] if found and len(found) == len(leaves) else None


def _leaf_exit(leaf: BaseException, io: _Io, args: argparse.Namespace) -> int:
    if isinstance(leaf, ApiError):
        io.error(leaf.describe())
        if leaf.status == 401:
            io.error(_TOKEN_HINT)
        return EXIT_ERROR
    if isinstance(leaf, NotTheApi):
        io.error(f"{leaf}; set {ENV_URL} to a supervisor's address")
        return EXIT_UNREACHABLE
    if isinstance(leaf, Unreachable):
        io.error(f"{leaf}; is `supervisor serve` running there? (set {ENV_URL} to its address)")
        return EXIT_UNREACHABLE
    return int(getattr(args, "interrupted_exit", EXIT_INTERRUPTED))


def _when(ts: object) -> str:
    """An ISO-8601 UTC timestamp, to the second, for tables."""
    if not isinstance(ts, str) or not ts:
        return "-"
    return ts[:19].replace("T", " ") + "Z"


def _table(io: _Io, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers], *[["-" if c is None or c == "" else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        io.print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _progress(job: Mapping[str, Any]) -> str:
    done, total = job.get("completed_units") or 0, job.get("total_units")
    if total is None:
        return str(done) if done else "-"
    return f"{done}/{total}"


def _idempotency_key(text: str) -> str:
    problem = key_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"an idempotency key {problem}")
    return text


def _job_id(text: str) -> str:
    """A job id as an argument: 1 to 200 printable ASCII characters, no space (the server's ids are 32 hex digits):
    anything else is a usage error naming it, never a URL the HTTP client refuses with a traceback."""
    if not re.fullmatch(r"[!-~]{1,200}", text):
        shown = repr(text[:40]) + ("…" if len(text) > 40 else "")
        raise argparse.ArgumentTypeError(f"a job id is 1-200 printable characters without spaces, not {shown}")
    return text


def _param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


BATCH_SIZE = 1000  # the server's limit for one POST /api/jobs/batch


def _read_job_lines(source: str, io: _Io) -> list[tuple[int, dict[str, Any]]] | None:
    """(line number, job) for every non-blank NDJSON line of ``source`` (a path, or - for stdin); None after
    printing what is wrong with the first bad line."""
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        io.error(f"--from-file {source}: {exc}")
        return None
    jobs: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            io.error(f"--from-file {source}, line {number}: not JSON: {exc}")
            return None
        if not isinstance(item, dict) or "kind" not in item:
            io.error(f'--from-file {source}, line {number}: expected an object {{"kind": ..., "params": {{...}}}}')
            return None
        jobs.append((number, item))
    if not jobs:
        io.error(f"--from-file {source}: no job in it")
        return None
    return jobs


def _file_key(jobs: Sequence[tuple[int, dict[str, Any]]]) -> str:
    """The Idempotency-Key of a file's jobs given none: from their content (ADR 0016). The same file sent again (a
    rerun after an interruption, a timer that fires twice) stores none of its batches twice while the keys live
    (``PODCAST_JOB_IDEMPOTENCY_TTL_SECONDS``, 24 h by default); the jobs of another file are another key."""
    content = json.dumps([item for _, item in jobs], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"file-{hashlib.sha256(content.encode()).hexdigest()[:48]}"


def _enqueue_from_file(client: Client, args: argparse.Namespace, io: _Io) -> int:
    jobs = _read_job_lines(args.from_file, io)
    if jobs is None:
        return EXIT_USAGE
    answers: list[dict[str, Any]] = []
    key = args.idempotency_key or _file_key(jobs)
    batches = (len(jobs) + BATCH_SIZE - 1) // BATCH_SIZE
    for start in range(0, len(jobs), BATCH_SIZE):
        chunk = jobs[start : start + BATCH_SIZE]
        # One key per batch: a rerun of the same file (or with the same --idempotency-key) stores none twice.
        batch_key = f"{key}.{start // BATCH_SIZE}" if len(jobs) > BATCH_SIZE else key
        try:
            send = functools.partial(client.enqueue_batch, [item for _, item in chunk], idempotency_key=batch_key)
            answer = with_retries(send, on_retry=_retrying(io, batch_key))
        except (ApiError, Unreachable) as exc:
            where = re.match(r"jobs\[(\d+)\]", exc.field or "") if isinstance(exc, ApiError) else None
            line = f"line {chunk[int(where.group(1))][0]}: " if where else ""
            why = exc.describe() if isinstance(exc, ApiError) else str(exc)
            done = start // BATCH_SIZE
            stored = (
                f"; batches 1-{done} of {batches} ({len(answers)} jobs, lines {jobs[0][0]}-{jobs[start - 1][0]}) were "
                f"stored; run the same command again to store the rest: its batches are keyed by the file's content "
                f"({key}), so none is stored twice"
                if answers
                else "; nothing was stored"
            )
            io.error(f"{line}{why}{stored}")
            return EXIT_UNREACHABLE if isinstance(exc, Unreachable) else EXIT_ERROR
        answers.extend(answer["jobs"])
    if args.json:
        io.json({"jobs": answers})
    else:
        for answer in answers:
            io.print(f"{answer['job_id']}  {'coalesced' if answer['coalesced'] else answer['status']}")
    return EXIT_OK


def _invocation_key() -> str:
    """The Idempotency-Key of an enqueue given none: one per invocation, so that its own retries make no second job."""
    return f"cli-{uuid.uuid4().hex}"


def _retrying(io: _Io, key: str) -> Callable[[SupervisorError, int, float], None]:
    def say(error: SupervisorError, attempt: int, wait_s: float) -> None:
        why = error.describe() if isinstance(error, ApiError) else str(error)
        io.note(
            f"supervisor: {why}; sending it again in {wait_s:g} s with Idempotency-Key {key} "
            f"(attempt {attempt} of {RETRY_ATTEMPTS})"
        )

    return say


def cmd_enqueue(client: Client, args: argparse.Namespace, io: _Io) -> int:
    if args.from_file is not None:
        if args.kind is not None or args.param:
            io.error("give KIND [-p ...] or --from-file, not both")
            return EXIT_USAGE
        return _enqueue_from_file(client, args, io)
    if args.kind is None:
        io.error("give a KIND, or --from-file FILE")
        return EXIT_USAGE
    params: dict[str, str] = {}
    for key, value in args.param or []:
        if key in params:
            io.error(f"-p {key} given twice")
            return EXIT_USAGE
        # Sent as a string: the server converts it to the kind's declared int/float/bool, or names the field.
        params[key] = value
    schedule: Schedule | None = None
    if args.schedule is not None or args.every is not None or args.if_idle or args.tick is not None:
        try:
            schedule, key = _schedule(args)
        except (ValueError, RequestError) as exc:
            io.error(str(exc))
            return EXIT_USAGE
    else:
        key = args.idempotency_key or _invocation_key()
    query = schedule.query if schedule is not None else None
    answer = with_retries(
        lambda: client.enqueue(args.kind, params, idempotency_key=key, schedule=query), on_retry=_retrying(io, key)
    )
    if args.json:
        io.json(answer)
    elif answer.get("skipped"):
        io.print(f"skipped: schedule {answer['schedule']} has job {answer['job_id']} {answer['status']} (--if-idle)")
    elif answer["coalesced"]:
        io.print(f"{answer['job_id']}  coalesced into the identical queued job (position {answer['queue_position']})")
    elif answer["status"] == "queued":
        io.print(f"{answer['job_id']}  queued (position {answer['queue_position']})")
    else:
        io.print(f"{answer['job_id']}  {answer['status']}")
    return EXIT_OK


def _schedule(args: argparse.Namespace) -> tuple[Schedule, str]:
    """--schedule NAME --every PERIOD [--if-idle] [--tick TIME] as a ``Schedule`` and its tick's key, every argument
    checked here (the period's bounds, the tick's form and range, its period's start a time): a usage error names
    what is wrong, before anything is sent."""
    if args.schedule is None or args.every is None:
        raise ValueError("--schedule NAME and --every PERIOD go together (and --if-idle, --tick with them)")
    if args.idempotency_key is not None:
        raise ValueError("a schedule's tick is its key: give --schedule or --idempotency-key, not both")
    schedule = Schedule(args.schedule, parse_period(args.every), args.if_idle)
    at = parse_tick(args.tick) if args.tick is not None else datetime.now(UTC)
    # The tick names the request: every timer or host firing within one period makes one job, fleet-wide.
    return schedule, schedule.key(schedule.tick(at))


def _is_terminal(io: _Io) -> bool:
    isatty = getattr(io.out, "isatty", None)
    return bool(isatty and isatty())


def _run_live(client: Client, run: Any) -> int:
    """Run a live command (``_live``) on trio, with its own async client to the same server."""
    code: int = trio.run(_live.with_api, client.base_url, client.token, run)
    return code


def cmd_events(client: Client, args: argparse.Namespace, io: _Io) -> int:
    args.interrupted_exit = EXIT_OK  # Ctrl-C is how --follow ends
    out = _live.Output(io.out, live=False, err=io.err)
    return _run_live(
        client,
        lambda api: _live.run_events(
            api, out, follow=args.follow, jobs=args.job or (), kinds=args.kind or (), as_json=args.json
        ),
    )


def cmd_wait(client: Client, args: argparse.Namespace, io: _Io) -> int:
    out = _live.Output(io.out, live=_is_terminal(io) and not args.json, quiet=args.json, err=io.err)
    return _run_live(
        client, lambda api: _live.run_wait(api, out, args.job_ids, timeout_s=args.timeout, as_json=args.json)
    )


def _filter_arguments(p: argparse.ArgumentParser) -> None:
    """The list's filters beside --status, --kind and --idempotency-key (the API's names; checked by the server)."""
    p.add_argument("--reason", help="the error or planned-outcome reason (all_feeds_unavailable, exit_code_1, ...)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a declared param's value")
    p.add_argument("--since", metavar="TIME", help="created at or after TIME (ISO 8601 with its offset: ...Z)")
    p.add_argument("--until", metavar="TIME", help="created before TIME")
    p.add_argument("--ended-since", metavar="TIME", help="ended at or after TIME")
    p.add_argument("--host", help="run by this host")


def _bulk_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--all", action="store_true", help="every job the filters select (a dry run first, then once each)")
    p.add_argument("--status", choices=[s.value for s in JobStatus])
    p.add_argument("--kind")
    _filter_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="only say which jobs it would act on")
    p.add_argument("--yes", action="store_true", help=f"act on more than {BULK_CONFIRM_ABOVE} jobs without asking")


def _filters(args: argparse.Namespace) -> dict[str, str]:
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


def _filter_refused(exc: ApiError, io: _Io) -> int:
    """A filter the server refused (a 422 naming one: a type the kinds declare, a value beyond the registry's
    limits) is the caller's usage error, named by its flag; any other error goes on up."""
    field = (exc.field or "").removeprefix("filter.")
    if exc.status != 422 or not (field in FILTER_NAMES or field.startswith(PARAM_PREFIX)):
        raise exc
    io.error(f"{_filter_flag(field)}: {str(exc).removeprefix('filter: ')}")
    return EXIT_USAGE


def cmd_jobs(client: Client, args: argparse.Namespace, io: _Io) -> int:
    try:
        filters = _filters(args)
    except ValueError as exc:
        io.error(str(exc))
        return EXIT_USAGE
    if args.watch:
        if args.json or args.cursor or args.status or args.kind or args.idempotency_key or filters:
            io.error(
                "--watch shows the running jobs and the queue: it takes no --json, --cursor and no filter (--status, "
                "--kind, --idempotency-key, --reason, --param, --since, --until, --ended-since, --host)"
            )
            return EXIT_USAGE
        args.interrupted_exit = EXIT_OK  # Ctrl-C is how a watch ends
        out = _live.Output(io.out, live=_is_terminal(io), err=io.err)
        return _run_live(client, lambda api: _live.run_watch(api, out))
    try:
        answer = client.list_jobs(
            status=args.status,
            kind=args.kind,
            limit=args.limit,
            cursor=args.cursor,
            idempotency_key=args.idempotency_key,
            filters=filters,
        )
    except ApiError as exc:
        return _filter_refused(exc, io)
    if args.json:
        io.json(answer)
        return EXIT_OK
    rows = [
        (
            job["job_id"],
            job["kind"],
            job["status"],
            job.get("queue_position"),
            _when(job["created_at"]),
            _when(job["ended_at"]),
            _progress(job),
            job["error_reason"],
        )
        for job in answer["jobs"]
    ]
    _table(io, ("JOB_ID", "KIND", "STATUS", "POS", "CREATED", "ENDED", "PROGRESS", "REASON"), rows)
    if answer["next_cursor"]:
        io.print(f"(more: supervisor jobs --cursor {answer['next_cursor']})")
    return EXIT_OK


def _show_job(io: _Io, job: Mapping[str, Any]) -> None:
    for key in sorted(job):
        value = job[key]
        if key == "history" and isinstance(value, list):
            # One line per earlier attempt: how each one the job was resubmitted after ended.
            io.print(f"{key:18} {len(value)} earlier attempt(s)" if value else f"{key:18} -")
            for attempt in value:
                io.print(f"  #{attempt.get('attempt')}  {_attempt_line(attempt)}")
            continue
        if key == "retried_by" and isinstance(value, list):
            # The other side of retry_of: the operator's retries of this job, oldest first.
            io.print(f"{key:18} {', '.join(map(str, value)) if value else '-'}")
            continue
        if isinstance(value, dict | list):
            value = json.dumps(value, sort_keys=True)
        io.print(f"{key:18} {'-' if value is None else value}")


def _attempt_line(attempt: Mapping[str, Any]) -> str:
    code = attempt.get("exit_code")
    ended = f"{attempt.get('status')}/{attempt.get('reason') or '-'}" + ("" if code is None else f" (exit {code})")
    return f"{attempt.get('started_at') or '-'} .. {attempt.get('ended_at') or '-'}  {ended}"


def cmd_show(client: Client, args: argparse.Namespace, io: _Io) -> int:
    job = client.get_job(args.job_id)
    if args.json:
        io.json(job)
    else:
        _show_job(io, job)
    return EXIT_OK


# A bulk action on more jobs than this asks first on a terminal; without one, it needs --yes.
BULK_CONFIRM_ABOVE = 10


def cmd_bulk(client: Client, args: argparse.Namespace, io: _Io, action: str) -> int:
    """``cancel --all`` / ``retry --all``: a dry run of the filters, a confirmation above ``BULK_CONFIRM_ABOVE``
    jobs, then the action on exactly the dry run's jobs (sent again on a lost answer: each job is acted on once)."""
    try:
        filters = _filters(args)
    except ValueError as exc:
        io.error(str(exc))
        return EXIT_USAGE
    filters |= {k: v for k, v in (("status", args.status), ("kind", args.kind)) if v is not None}
    try:
        dry = client.bulk(action, filters=filters, dry_run=True)
    except ApiError as exc:
        return _filter_refused(exc, io)
    if args.dry_run or not dry["count"]:
        if args.json:
            io.json(dry)
        else:
            io.print(f"{action} would act on {dry['count']} job(s){':' if dry['count'] else ''}")
            for job_id in dry["job_ids"]:
                io.print(f"  {job_id}")
        return EXIT_OK
    if dry["count"] > BULK_CONFIRM_ABOVE and not args.yes:
        if not _is_terminal(io) or not sys.stdin.isatty():
            io.error(f"{action} of {dry['count']} jobs: give --yes to act without a terminal to confirm on")
            return EXIT_USAGE
        io.out.write(f"{action} {dry['count']} job(s)? [y/N] ")
        io.out.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            io.print("nothing done")
            return EXIT_ERROR
    done = client.bulk(action, selection=dry["selection"])
    if args.json:
        io.json(done)
    else:
        outcomes = ", ".join(f"{what} {n}" for what, n in sorted(done["outcomes"].items()))
        io.print(f"{action}: {done['count']} job(s): {outcomes}")
        for job_id, result in sorted(done["results"].items()):
            if result.startswith("refused"):
                io.print(f"  {job_id}  {result}")
    return EXIT_ERROR if any(r.startswith("refused") for r in done["results"].values()) else EXIT_OK


def cmd_retry(client: Client, args: argparse.Namespace, io: _Io) -> int:
    if args.all or args.job_id is None:
        return _bulk_or_usage(client, args, io, "retry")
    answer = client.retry(args.job_id)
    if args.json:
        io.json(answer)
    elif answer["coalesced"]:
        io.print(
            f"{answer['job_id']}  coalesced into the identical queued job (position {answer['queue_position']}); "
            f"it is not linked to {args.job_id}"
        )
    elif answer["status"] == "queued":
        io.print(f"{answer['job_id']}  queued (position {answer['queue_position']}), a retry of {args.job_id}")
    else:
        io.print(f"{answer['job_id']}  {answer['status']}, a retry of {args.job_id}")
    return EXIT_OK


def _retention(retention: Mapping[str, Any]) -> str:
    rules = []
    if retention.get("days") is not None:
        rules.append(f"ended more than {retention['days']:g} day(s) ago")
    if retention.get("max_jobs") is not None:
        rules.append(f"past the newest {retention['max_jobs']} finished")
    return " or ".join(rules)


def cmd_prune(client: Client, args: argparse.Namespace, io: _Io) -> int:
    """``prune --dry-run``: the finished jobs past the retention, oldest first; ``prune``: remove them now, a batch
    at a time until none is left (the sweeper does the same, a small batch a minute)."""
    answers = [client.prune(dry_run=args.dry_run)]
    while not args.dry_run and answers[-1]["limit_reached"]:
        answers.append(client.prune(dry_run=False))
    if args.json:
        last = answers[-1]
        io.json({**last, "pruned": sum(a["pruned"] for a in answers), "jobs": [j for a in answers for j in a["jobs"]]})
        return EXIT_OK
    retention = answers[0]["retention"]
    if retention["days"] is None and retention["max_jobs"] is None:
        io.print(
            "retention is off (PODCAST_JOB_RETENTION_DAYS and PODCAST_JOB_RETENTION_MAX_JOBS are 0): nothing is pruned"
        )
        return EXIT_OK
    jobs = [job for answer in answers for job in answer["jobs"]]
    if args.dry_run:
        if jobs:
            _table(
                io,
                ("JOB_ID", "KIND", "STATUS", "ENDED"),
                [(j["job_id"], j["kind"], j["status"], _when(j["ended_at"])) for j in jobs],
            )
        more = " (the oldest ones; more are due)" if answers[0]["limit_reached"] else ""
        io.print(f"{len(jobs)} finished job(s) would go{more}: {_retention(retention)}")
    else:
        io.print(f"pruned {len(jobs)} finished job(s) with their logs: {_retention(retention)}")
    return EXIT_OK


def _bulk_or_usage(client: Client, args: argparse.Namespace, io: _Io, action: str) -> int:
    if args.all and args.job_id is not None:
        io.error(f"{action}: give a JOB_ID or --all with filters, not both")
        return EXIT_USAGE
    if not args.all:
        io.error(f"{action}: give a JOB_ID, or --all with filters (--status, --kind, --reason, --param, --since, ...)")
        return EXIT_USAGE
    return cmd_bulk(client, args, io, action)


def cmd_cancel(client: Client, args: argparse.Namespace, io: _Io) -> int:
    if args.all or args.job_id is None:
        return _bulk_or_usage(client, args, io, "cancel")
    job = client.cancel(args.job_id)
    if args.json:
        io.json(job)
    elif job["status"] == "running":
        io.print(f"{job['job_id']}  running; cancel requested, stopping")
    else:
        io.print(f"{job['job_id']}  {job['status']}")
    return EXIT_OK


def cmd_reconcile(client: Client, args: argparse.Namespace, io: _Io) -> int:
    report = client.reconcile()
    if args.json:
        io.json(report)
        return EXIT_OK
    io.print(f"reconciled: {report['updated']} row(s) updated")
    if report["details"]:
        rows = [(d["job_id"], d["action"], d["reason"], d["liveness"], d["prior_boot"]) for d in report["details"]]
        _table(io, ("JOB_ID", "ACTION", "REASON", "LIVENESS", "PRIOR_BOOT"), rows)
    return EXIT_OK


def _show_queue(io: _Io, state: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        io.json(state)
        return
    paused = "paused" if state["paused"] else "active"
    io.print(f"queue {paused}: {state['running']} running (max {state['max_concurrent']}), {state['queued']} queued")
    if _live.kinds_text(state):
        io.print(f"by kind (running[/max_running] +queued): {_live.kinds_text(state)}")
    # The queue's watch (docs/operations.md § The queue's watch), as of the server's last sweep: what holds it, and
    # whether it is stuck.
    for reason, since in sorted((state.get("held") or {}).items()):
        io.print(f"held by {reason} since {since}")
    stuck = state.get("stuck")
    if stuck:
        io.print(
            f"STUCK since {stuck['since']}: {stuck['reason']} (oldest job waiting {state.get('oldest_queued_age_s')} s)"
        )


def cmd_queue(client: Client, args: argparse.Namespace, io: _Io) -> int:
    _show_queue(io, client.queue(), args.json)
    return EXIT_OK


def cmd_hosts(client: Client, args: argparse.Namespace, io: _Io) -> int:
    """``hosts``: the fleet's hosts; ``hosts forget HOST``: end a lost host's jobs and free their slots; ``hosts drain
    HOST`` / ``undrain HOST``: take a host out of service on purpose and back; ``hosts wait-drained HOST``: wait until
    a drained host holds nothing (docs/fleet.md § Draining a host)."""
    if args.action != "list" and not args.host_id:
        io.error(f"hosts {args.action}: name the host (supervisor hosts {args.action} HOST)")
        return EXIT_USAGE
    if args.timeout is not None and args.action != "wait-drained":
        io.error("--timeout is wait-drained's (supervisor hosts wait-drained HOST --timeout S)")
        return EXIT_USAGE
    if args.action == "forget":
        answer = client.forget_host(args.host_id)
        if args.json:
            io.json(answer)
        else:
            io.print(f"forgot host {answer['host_id']}: {len(answer['jobs_ended'])} running job(s) ended")
        return EXIT_OK
    if args.action in ("drain", "undrain"):
        answer = client.drain_host(args.host_id) if args.action == "drain" else client.undrain_host(args.host_id)
        if args.json:
            io.json(answer)
        else:
            state = answer["drain"] or "not drained"
            io.print(f"host {answer['host_id']}: {state}" + ("" if answer["changed"] else " (unchanged)"))
        return EXIT_OK
    if args.action == "wait-drained":
        return _wait_drained(client, args, io)
    answer = client.hosts()
    if args.json:
        io.json(answer)
        return EXIT_OK
    for host in answer["hosts"]:
        state = "live" if host["live"] else "SILENT"
        lead = " leader" if host["leader"] and host["live"] else ""
        drain = f"  {host['drain'].upper()}" if host.get("drain") else ""
        io.print(
            f"{host['host_id']}  {state}{lead}{drain}  release {host.get('release') or 'before 1.0.0'}  "
            f"running {host.get('running_jobs', 0)}  boot {host['boot_id'][:12]}  last seen {host['last_seen_at']}  "
            f"lease until {host['lease_expires_at']}"
        )
    if not answer["hosts"]:
        io.print("no host has registered")
    return EXIT_OK


def _wait_drained(client: Client, args: argparse.Namespace, io: _Io) -> int:
    """Poll the hosts until ``args.host_id`` is drained (0), the timeout passes (124, as ``wait``'s), or it cannot
    become drained: unknown, or nobody drained it (1)."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        hosts = {host["host_id"]: host for host in client.hosts()["hosts"]}
        host = hosts.get(args.host_id)
        if host is None:
            io.error(f"hosts wait-drained: no host {args.host_id} has registered")
            return EXIT_ERROR
        if host.get("drain") is None:
            io.error(f"hosts wait-drained: host {args.host_id} is not drained (supervisor hosts drain {args.host_id})")
            return EXIT_ERROR
        if host["drain"] == "drained":
            if args.json:
                io.json(host)
            else:
                io.print(f"host {args.host_id}: drained (it may be stopped)")
            return EXIT_OK
        if deadline is not None and time.monotonic() >= deadline:
            io.error(f"hosts wait-drained: host {args.host_id} still runs {host.get('running_jobs', 0)} job(s)")
            return _live.EXIT_TIMEOUT
        left = WAIT_DRAINED_POLL_S if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, min(WAIT_DRAINED_POLL_S, left)))


def cmd_pause(client: Client, args: argparse.Namespace, io: _Io) -> int:
    _show_queue(io, client.pause(), args.json)
    return EXIT_OK


def cmd_resume(client: Client, args: argparse.Namespace, io: _Io) -> int:
    _show_queue(io, client.resume(), args.json)
    return EXIT_OK


def cmd_logs(client: Client, args: argparse.Namespace, io: _Io) -> int:
    if not args.follow:
        io.write_bytes(client.log(args.job_id, tail_bytes=args.tail_bytes))
        return EXIT_OK
    # Follow by attempt and byte offset: each attempt of a resubmitted job has its own log, append-only, so what was
    # printed never changes under us; an attempt is read to its end before the next (docs/operations.md § Logs: one
    # offset kept across attempts printed the next one from the wrong place).
    attempt, offset, first = 1, 0, True
    interval = FOLLOW_MIN_INTERVAL_S
    while True:
        # The row before the read: once it is terminal, or a later attempt has begun, this attempt's output is
        # complete and one more read takes the rest of it.
        row = client.get_job(args.job_id)
        status, attempts = JobStatus(row["status"]), max(int(row["attempts"]), 1)
        if first and args.tail_bytes is not None:
            attempt = attempts  # the last bytes of the latest attempt, then on from there
        chunk = client.log(args.job_id, offset=offset, attempt=attempt)
        shown = chunk[-args.tail_bytes :] if first and args.tail_bytes is not None else chunk
        first = False
        if shown:
            io.write_bytes(shown)
        offset += len(chunk)
        if attempt < attempts:
            attempt, offset = attempt + 1, 0  # this attempt has ended, and its log was read to its end
            io.err.write(f"job {args.job_id}: attempt {attempt}\n")
            continue
        if status.is_terminal:
            io.err.write(f"job {args.job_id} is {status}\n")
            return EXIT_OK
        interval = FOLLOW_MIN_INTERVAL_S if chunk else min(interval * 2, FOLLOW_MAX_INTERVAL_S)
        time.sleep(interval)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a positive integer, got 0")
    return value


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


# Each verb's example, shown at the end of its --help.
EXAMPLES = {
    "serve": "  PODCAST_JOB_DATA_DIR=./var supervisor serve\n  supervisor --config /etc/podcast/supervisor.toml serve",
    "check-config": "  supervisor check-config\n  supervisor --config supervisor.toml check-config --json",
    "migrate": (
        "  PODCAST_JOB_DATABASE_URL=postgresql://supervisor@db/jobs PODCAST_JOB_DATABASE_AUTO_MIGRATE=false \\\n"
        "    supervisor migrate"
    ),
    "enqueue": (
        "  supervisor enqueue pipeline -p feed=https://example.org/feed.xml -p max_episodes=5\n"
        "  supervisor enqueue --from-file jobs.ndjson --json"
    ),
    "jobs": "  supervisor jobs --status running\n  supervisor jobs --watch        # live; Ctrl-C quits (exit 0)",
    "show": "  supervisor show 4969cb37d2f8447e9734ed35bf48539b",
    "cancel": "  supervisor cancel 4969cb37d2f8447e9734ed35bf48539b",
    "retry": (
        "  supervisor retry 4969cb37d2f8447e9734ed35bf48539b   # prints the new job's id\n"
        '  supervisor wait "$(supervisor retry JOB_ID --json | jq -r .job_id)"'
    ),
    "reconcile": "  supervisor reconcile --json",
    "prune": (
        "  supervisor prune --dry-run               # the finished jobs past the retention, oldest first\n"
        "  supervisor prune                         # remove them now, with their logs"
    ),
    "queue": "  supervisor queue",
    "hosts": (
        "  supervisor hosts                        # every host of the fleet: live or SILENT, and the leader\n"
        "  supervisor hosts forget web-2           # a host that will never come back: its running jobs end\n"
        "  supervisor hosts drain web-2            # nothing new starts there; its jobs run to their end\n"
        "  supervisor hosts wait-drained web-2 --timeout 3600 && systemctl stop ...   # then stop it\n"
        "  supervisor hosts undrain web-2          # back in service"
    ),
    "pause": "  supervisor pause",
    "resume": "  supervisor resume",
    "logs": "  supervisor logs 4969cb37d2f8447e9734ed35bf48539b --follow\n  supervisor logs JOB_ID --tail-bytes 4096",
    "events": (
        "  supervisor events                       # the recent events the server holds\n"
        "  supervisor events --follow --kind job.stalled --kind job.silent\n"
        "  supervisor events -f --job JOB_ID --json"
    ),
    "wait": (
        "  supervisor wait JOB_ID                  # exit 0 succeeded, 10 failed, 11 cancelled, 12 stale\n"
        '  supervisor wait JOB_A JOB_B --timeout 3600 || echo "worst outcome: $?"   # 124: timed out'
    ),
    "token": (
        "  supervisor token add ci-bot --scope enqueue > ci-bot.token   # the token, once; kept as a digest\n"
        "  supervisor token list\n"
        "  supervisor token revoke ci-bot && kill -HUP \"$(pidof -s supervisor)\""
    ),
    "completion": (
        "  supervisor completion bash > /etc/bash_completion.d/supervisor\n"
        '  supervisor completion zsh > "${fpath[1]}/_supervisor"'
    ),
}


def _epilog(name: str) -> str:
    return "example:\n" + EXAMPLES[name]


def _add_client_commands(sub: Any) -> None:
    def add(name: str, command: ClientCommand, help_text: str, *, json_flag: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if json_flag:
            p.add_argument("--json", action="store_true", help="print the server's JSON answer")
        p.set_defaults(func=_run_client(command))
        return p

    p = add("enqueue", cmd_enqueue, "enqueue a job of KIND, or every job of an NDJSON file")
    p.add_argument("kind", nargs="?")
    p.add_argument(
        "--from-file",
        metavar="FILE",
        help='one {"kind": ..., "params": {...}} per line (- for stdin); sent in batches of 1000, each all or nothing',
    )
    p.add_argument(
        "-p", "--param", type=_param, action="append", metavar="KEY=VALUE", help="a param of the kind (repeatable)"
    )
    p.add_argument(
        "--idempotency-key",
        type=_idempotency_key,
        metavar="KEY",
        help="this request's name (1-255 printable ASCII): the same KEY with the same request never makes a second "
        "job, and answers what it answered (default: a new key per invocation, kept across its own retries; with "
        "--from-file, KEY.N names its Nth batch of 1000)",
    )
    p.add_argument("--schedule", metavar="NAME", help="a schedule's tick (a systemd timer's): one job per period")
    p.add_argument("--every", metavar="PERIOD", help="the schedule's period: 15m, 1h, 1d (at least a minute)")
    p.add_argument("--tick", metavar="TIME", help="the tick to enqueue (default: now, floored to the period, UTC)")
    p.add_argument(
        "--if-idle", action="store_true", help="skip the tick (exit 0) while a job of the schedule is queued or running"
    )
    p = add("jobs", cmd_jobs, "list jobs, newest first; or watch the running ones live (--watch)")
    p.add_argument("--status", choices=[s.value for s in JobStatus])
    p.add_argument("--kind")
    p.add_argument("--limit", type=_positive, help="rows per page (server default 100, at most 1000)")
    p.add_argument("--cursor", help="continue after a previous page")
    p.add_argument(
        "--idempotency-key", type=_idempotency_key, metavar="KEY", help="only the jobs an enqueue with KEY answered"
    )
    _filter_arguments(p)
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="a live table of the running jobs and the queue, redrawn on each event; Ctrl-C quits (exit 0)",
    )
    p = add("show", cmd_show, "show one job")
    p.add_argument("job_id", type=_job_id)
    p = add("cancel", cmd_cancel, "cancel a job (idempotent), or --all the jobs the filters select")
    p.add_argument("job_id", type=_job_id, nargs="?")
    _bulk_arguments(p)
    p = add(
        "retry",
        cmd_retry,
        "enqueue a finished job's kind and params again as a new job (its retry_of names the old one; "
        "supervisor show lists a job's retries), or --all the finished jobs the filters select",
    )
    p.add_argument("job_id", type=_job_id, nargs="?")
    _bulk_arguments(p)
    add("reconcile", cmd_reconcile, "operator reconcile: may mark live jobs past the wall-clock window stale")
    p = add(
        "prune",
        cmd_prune,
        "remove the finished jobs past the retention now, with their logs (PODCAST_JOB_RETENTION_DAYS, "
        "PODCAST_JOB_RETENTION_MAX_JOBS; the sweeper does it a batch a minute)",
    )
    p.add_argument("--dry-run", action="store_true", help="only list what would go; remove nothing")
    add("queue", cmd_queue, "show the queue's state")
    p = add(
        "hosts",
        cmd_hosts,
        "list the fleet's hosts; hosts forget HOST: end a lost host's running jobs; hosts drain / undrain HOST: take "
        "a host out of service and back; hosts wait-drained HOST [--timeout S]: wait until it holds nothing "
        "(0 drained, 124 timed out, 1 not drained or unknown)",
    )
    p.add_argument("action", nargs="?", choices=["list", "forget", "drain", "undrain", "wait-drained"], default="list")
    p.add_argument("host_id", nargs="?")
    p.add_argument("--timeout", type=_timeout, metavar="S", help="wait-drained: give up after S seconds (exit 124)")
    add("pause", cmd_pause, "pause promotion (running jobs continue)")
    add("resume", cmd_resume, "resume promotion")
    p = add("logs", cmd_logs, "print a job's log", json_flag=False)
    p.add_argument("job_id", type=_job_id)
    p.add_argument("--tail-bytes", type=_non_negative, metavar="N", help="only the last N bytes")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    p = add("events", cmd_events, "print job events: those the server holds, then new ones with --follow")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing events as they happen; Ctrl-C quits")
    p.add_argument("--job", action="append", metavar="JOB_ID", help="only this job's events (repeatable)")
    p.add_argument("--kind", action="append", choices=list(EVENT_NAMES), help="only events of this name (repeatable)")
    p = add(
        "wait",
        cmd_wait,
        "wait until every JOB_ID has ended; the exit code is the outcome "
        "(0 succeeded, 10 failed, 11 cancelled, 12 stale, 124 timed out; several jobs: the worst)",
    )
    p.add_argument("job_ids", nargs="+", metavar="JOB_ID", type=_job_id)
    p.add_argument("--timeout", type=_timeout, metavar="S", help="give up after S seconds (exit 124)")


def _version() -> str:
    """This code's release (docs/fleet.md § Upgrading a fleet), whatever an editable install's metadata says."""
    return RELEASE


def cmd_completion(args: argparse.Namespace) -> int:
    from argcomplete import shell_integration

    args.io.out.write(shell_integration.shellcode(["supervisor"], shell=args.shell))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="supervisor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--config", type=Path, default=None, help="a TOML file of settings (env vars win)")
    sub = parser.add_subparsers(dest="command", required=True)

    def local(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return p

    p = local("serve", "run the supervisor (HTTP API, sweeper, job monitors)")
    # serve's signal watcher takes the signals the entry held through the imports (run_supervisor's held_signals).
    p.set_defaults(func=cmd_serve, keeps_signals=True)
    p = local("check-config", "print the effective configuration, or name every invalid setting")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check_config)
    p = local("migrate", "bring the registry's schema up to date (as serve does unless told not to)")
    p.set_defaults(func=cmd_migrate)
    p = local(
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
    _add_client_commands(sub)
    p = local("completion", "print the shell completion script for bash or zsh")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=cmd_completion)
    return parser


class HeldSignals(Protocol):
    """The signals the process's entry held through the imports (``supervisor._entry``, the layer above)."""

    def take(self) -> list[int]: ...

    def release(self) -> None: ...


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    held: HeldSignals | None = None,
) -> int:
    """Run one command. ``environ``/``stdout``/``stderr`` default to the process's (tests pass their own); ``held``:
    the signals the console script held until the command is known (None: nothing held)."""
    parser = build_parser()
    if argv is None:
        # Shell completion: a no-op unless the shell's completion function called us (it then prints and exits).
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    args.io = _Io(os.environ if environ is None else environ, stdout or sys.stdout, stderr or sys.stderr)
    try:
        args.held = held
        if held is not None and not getattr(args, "keeps_signals", False):
            held.release()  # a Ctrl-C or SIGTERM during the imports acts now, as it would have then
        code: int = args.func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`supervisor jobs --json | head -1`): stop quietly, as a tool SIGPIPE stops does,
        # and point stdout at /dev/null so that the interpreter's last flush has nowhere to fail either.
        if stdout is None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
