"""Every setting of the supervisor, declared once (``SETTINGS``): its ``Config`` field, its environment variable and
TOML key, how a raw value is read (its type, unit, floor, ceiling, what junk falls back to, or that there is no safe
fallback: a reader of ``_setting_readers``), how its default is shown, and what it means; the settings of where jobs
run and of the fleet are declared in ``_execution_fleet_settings``, and joined here. Loading
(``_config.load_config``), the TOML keys a file may hold, ``check-config`` and the settings table of
``docs/settings.md`` (``settings_table``; a test holds the page to it) all follow from this one table.

Rules (ADR-0002, INV-MALFORMED-NEVER-UNBOUNDED): a malformed number falls back to its default with a WARNING naming
the variable, never to "unbounded"; a value below its floor is raised to the floor, with a WARNING; a setting with
no safe fallback is collected into one ``ConfigError`` that names every such setting.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from ._execution_fleet_settings import EXECUTION_AND_FLEET_SETTINGS
from ._setting_readers import (
    BIND,
    HTTP_URL,
    KEEP,
    PATH,
    TEXT,
    TOKEN_FILE,
    WEBHOOK_SECRET,
    Choice,
    Loader,
    Num,
    Setting,
)

# The one list of exec modes (``execution.create_executor`` builds each; the OpenAPI document enumerates these).
ExecMode = Literal["subprocess", "docker"]
EXEC_MODES: tuple[ExecMode, ...] = get_args(ExecMode)
StallAction = Literal["alert", "terminate"]
STALL_ACTIONS: tuple[StallAction, ...] = get_args(StallAction)

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "data_dir",
        "PODCAST_JOB_DATA_DIR",
        PATH,
        default="`./var`",
        help="corpus root; jobs run with it as cwd; the registry, job logs and pause flag live in its `.viewer/`",
    ),
    Setting(
        "bind",
        "PODCAST_JOB_BIND",
        BIND,
        default="`127.0.0.1:8000`",
        rule="unparsable → **error**",
        help="HTTP listen address `HOST:PORT` (`[v6]:PORT`); port 0 picks a free port",
    ),
    Setting(
        "max_concurrent",
        "PODCAST_JOB_MAX_CONCURRENT",
        Num(integer=True, floor=1),
        default="`1`",
        help="most jobs RUNNING at once (across every process sharing the registry)",
    ),
    Setting(
        "sweep_interval_s",
        "PODCAST_JOB_SWEEP_SECONDS",
        Num(floor=1.0),
        default="`30`",
        help="sweeper period (reconcile → drain)",
    ),
    Setting(
        "stale_after_s",
        "PODCAST_JOB_STALE_SECONDS",
        Num(off=True),
        default="`86400`",
        help="wall-clock window: the operator's reconcile marks older rows `stale`; the sweeper only warns",
    ),
    Setting(
        "progress_stale_after_s",
        "PODCAST_JOB_PROGRESS_STALE_SECONDS",
        Num(off=True),
        default="`1800`",
        help=(
            "a running job whose progress watermark has not risen for longer than this (counted from its start "
            "until its first progress) is **stalled**: flagged on its row, a WARNING, a `job.stalled` event (see "
            "[Absence detection](#absence-detection))"
        ),
    ),
    Setting(
        "silent_after_s",
        "PODCAST_JOB_SILENT_SECONDS",
        Num(floor=1.0, off=True),
        default="`60` (three times the runner's 5 s heartbeat interval, but at least 60 s)",
        help=(
            "a job that has sent heartbeats and then sent none for longer than this while its process is verified"
            " alive is **silent** (`job.silent`)"
        ),
    ),
    Setting(
        "stall_action",
        "PODCAST_JOB_STALL_ACTION",
        Choice(STALL_ACTIONS),
        default="`alert`",
        help=(
            "`alert`: only flag and notify. `terminate`: also stop a stalled job whose process is verified alive "
            "(SIGTERM, SIGKILL after `PODCAST_JOB_CANCEL_GRACE_SECONDS`); its row ends `stale` / "
            "`progress_stalled` once the process is gone. A job whose liveness is unknown is never stopped"
        ),
    ),
    Setting(
        "exec_mode",
        "PODCAST_PIPELINE_EXEC_MODE",
        Choice(EXEC_MODES),
        default="`subprocess`",
        help=(
            "`subprocess` (processes of this machine, ADR 0004) or `docker` (containers on a Docker engine, ADR "
            "0005). Read once at start; the boot's `supervisor_started` line and `/api/health` say which"
        ),
    ),
    Setting(
        "api_token",
        "PODCAST_JOB_API_TOKEN",
        TEXT,
        default="unset",
        help="bearer token for the API; without it the server refuses a non-loopback bind. Never passed to jobs.",
    ),
    Setting(
        "api_token_file",
        "PODCAST_JOB_API_TOKEN_FILE",
        TOKEN_FILE,
        default="unset",
        rule="unreadable, empty, several words or set together with `PODCAST_JOB_API_TOKEN` → **error**",
        help=(
            "a file holding the API token (white space around it ignored), so it stays out of the environment and"
            " `ps`; re-read on SIGHUP, and a failed re-read keeps the token in force. Never passed to jobs."
        ),
    ),
    Setting(
        "api_tokens_file",
        "PODCAST_JOB_API_TOKENS_FILE",
        PATH,
        default="`<data dir>/.viewer/api-tokens.toml`",
        rule="unreadable or invalid at start → **error**; at a SIGHUP → the tokens in force are kept",
        help=(
            "the named API tokens with their scopes (`read`, `enqueue`, `operator`), kept as SHA-256 digests only "
            "and managed with `supervisor token` (add, list, revoke); re-read on SIGHUP. Once it exists, or the "
            "operator token is set, every route but health, metrics and the heartbeat needs a token (security.md)"
        ),
    ),
    Setting(
        "kinds_file",
        "PODCAST_JOB_KINDS_FILE",
        PATH,
        default="unset (built-ins only)",
        rule="invalid file → **error**",
        help="TOML file of job kinds ([job-kinds.md](job-kinds.md))",
    ),
    Setting(
        "webhook_url",
        "PODCAST_JOB_WEBHOOK_URL",
        HTTP_URL,
        default="unset (no webhooks, no outbox)",
        rule="not http(s) → **error**",
        help="where job events are POSTed ([Webhooks](api.md#webhooks))",
    ),
    Setting(
        "webhook_timeout_s",
        "PODCAST_JOB_WEBHOOK_TIMEOUT_SEC",
        Num(floor=0.5),
        default="`5`",
        help="transport timeout of every webhook call; a whole attempt is cut at twice this",
    ),
    Setting(
        "webhook_secret",
        "PODCAST_JOB_WEBHOOK_SECRET",
        WEBHOOK_SECRET,
        default="unset (unsigned)",
        rule="`whsec_` not followed by the base64 of 24 to 64 bytes → **error**",
        help=(
            "signs each delivery to the Standard Webhooks specification (`webhook-id`, `webhook-timestamp`, "
            "`webhook-signature: v1,…`; [Webhooks](api.md#webhooks)): a `whsec_` secret is the base64 of the key, "
            "any other is its own UTF-8 bytes. Also `X-Podcast-Signature` (deprecated). Never printed "
            "(`check-config` shows `(set)`), never passed to jobs"
        ),
    ),
    Setting(
        "webhook_outbox_max_events",
        "PODCAST_JOB_WEBHOOK_OUTBOX_MAX_EVENTS",
        Num(integer=True, floor=1),
        default="`10000`",
        help=(
            "undelivered events kept at most; the oldest past it are dropped (counted, logged). Both bounds are "
            "applied at most once a second"
        ),
    ),
    Setting(
        "webhook_outbox_max_age_s",
        "PODCAST_JOB_WEBHOOK_OUTBOX_MAX_AGE_SECONDS",
        Num(floor=60.0),
        default="`604800` (7 days)",
        help="undelivered events older than this are dropped (counted, logged)",
    ),
    Setting(
        "events_replay_events",
        "PODCAST_JOB_EVENTS_REPLAY_EVENTS",
        Num(integer=True, floor=1),
        default="`1000`",
        help=(
            "events the event stream (`GET /api/events`) keeps in memory for readers that resume with "
            "`Last-Event-ID`; a reader further behind is told of the gap (`stream.gap`) and should re-read the "
            "rows. Lost at a restart (the ids name the boot)"
        ),
    ),
    Setting(
        "events_client_buffer_events",
        "PODCAST_JOB_EVENTS_CLIENT_BUFFER_EVENTS",
        Num(integer=True, floor=1),
        default="`2048`",
        help=(
            "each event-stream reader's queue; a reader that lets it fill (it does not read) is disconnected at "
            "once, never held in memory. Keep it above the largest burst: a batch enqueue announces up to 1,000 "
            "events at once (with a filter, only those that match count)"
        ),
    ),
    Setting(
        "events_max_clients",
        "PODCAST_JOB_EVENTS_MAX_CLIENTS",
        Num(integer=True, floor=1),
        default="`64`",
        help="event-stream readers at once; one more is answered 503 `too_many_streams`",
    ),
    Setting(
        "events_keepalive_s",
        "PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS",
        Num(floor=1.0, ceiling=60.0),
        default="`15`",
        help=(
            "an idle event stream sends a `: keep-alive` comment this often (the CLI takes 90 s of silence for a "
            "dead connection)"
        ),
    ),
    Setting(
        "queue_stuck_s",
        "PODCAST_JOB_QUEUE_STUCK_SECONDS",
        Num(floor=1.0),
        default="`900` (15 min)",
        help=(
            "the queue is **stuck** when jobs have waited this long without a break while a slot was free or "
            "promotion was held for any reason but a pause: `queue_stuck` (ERROR), `podcast_queue_stuck`, "
            "`degraded.queue` in health (see [The queue's watch](#the-queues-watch))"
        ),
    ),
    Setting(
        "pause_warn_s",
        "PODCAST_JOB_PAUSE_WARN_SECONDS",
        Num(floor=1.0),
        default="`21600` (6 h)",
        help=(
            "jobs waiting behind a pause (the API's or the file's) this long is the same condition, its reason the "
            "pause"
        ),
    ),
    Setting(
        "idempotency_ttl_s",
        "PODCAST_JOB_IDEMPOTENCY_TTL_SECONDS",
        Num(floor=3600.0),
        default="`86400` (24 h)",
        help=(
            "how long an enqueue's `Idempotency-Key` is kept: a retry with the key within this time answers what the "
            "first request was answered and makes no job; the jobs a live key made are never pruned. Expired keys "
            "are removed by the sweeper (see [Idempotency keys](api.md#idempotency-keys))"
        ),
    ),
    Setting(
        "retention_days",
        "PODCAST_JOB_RETENTION_DAYS",
        Num(off=True),
        default="`30`",
        help=(
            "finished jobs (`succeeded`, `failed`, `cancelled`, `stale`) that ended more than this many days ago "
            "are removed by the sweeper, with their logs (see [History retention](#history-retention))"
        ),
    ),
    Setting(
        "retention_max_jobs",
        "PODCAST_JOB_RETENTION_MAX_JOBS",
        Num(integer=True, off=True),
        default="`100000`",
        help=(
            "finished jobs past the newest this many (by when they ended) are removed too. Queued and running "
            "jobs are never counted nor removed. Both `<= 0`: history is kept for ever"
        ),
    ),
    Setting(
        "log_max_bytes",
        "PODCAST_JOB_LOG_MAX_BYTES",
        Num(integer=True, floor=4096),
        default="`52428800` (50 MiB)",
        help=(
            "cap of each job's log file; output past it is discarded with a note at the end of the log (the job "
            "never blocks on it: the shepherd keeps reading at full speed)"
        ),
    ),
    Setting(
        "registry_busy_timeout_ms",
        "PODCAST_JOB_REGISTRY_BUSY_TIMEOUT_MS",
        Num(integer=True, floor=50),
        default="`10000`",
        help=(
            "how long a registry write waits for another writer's lock (another process holding the SQLite file) "
            "before it counts as failed. A failed write is not lost: see [When the registry cannot "
            "write](#when-the-registry-cannot-write)"
        ),
    ),
    # Where jobs run and how they are reached, and where the registry and the fleet live.
    *EXECUTION_AND_FLEET_SETTINGS,
)

TOML_KEYS = frozenset(setting.toml for setting in SETTINGS)
ENV_NAMES = frozenset(setting.env for setting in SETTINGS)
# Names with the settings' prefix that are no setting of the server: the CLI client's address, what a job's process
# is told (its id, token and heartbeat URL), and the test suites' own (``PODCAST_JOB_TEST_*``).
OTHER_ENV_NAMES = frozenset({"PODCAST_JOB_URL", "PODCAST_JOB_ID", "PODCAST_JOB_TOKEN", "PODCAST_JOB_HEARTBEAT_URL"})


def unknown_env_names(env: Mapping[str, str], prefix: str = "PODCAST_JOB_") -> list[str]:
    """A warning for each ``PODCAST_JOB_*`` variable that is no setting (a typo must not pass unseen while the
    default it meant to change stays in force), naming the setting it most likely meant."""
    known = ENV_NAMES | OTHER_ENV_NAMES
    unknown = [n for n in sorted(env) if n.startswith(prefix) and n not in known and not n.startswith(f"{prefix}TEST_")]
    # Matched on what follows the shared prefix, which would make every name look alike.
    suffixes = sorted(name.removeprefix(prefix) for name in ENV_NAMES)
    found = []
    for name in unknown:
        close = difflib.get_close_matches(name.removeprefix(prefix), suffixes, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        found.append(f"{name} is not a setting{hint}: ignored")
    return found


TABLE_HEADER = ("| variable (TOML key) | default | floor / fallback | meaning |", "|---|---|---|---|")


def settings_table() -> str:
    """The settings table of ``docs/settings.md``, one row per declared setting."""
    rows = [f"| `{s.env}` (`{s.toml}`) | {s.default} | {s.rule_text} | {s.help} |" for s in SETTINGS]
    return "\n".join([*TABLE_HEADER, *rows])


def read_settings(
    raw: Callable[[str, str], tuple[str, object] | None], loader: Loader, defaults: object
) -> dict[str, Any]:
    """The ``Config`` fields that the raw values (``raw(env, toml_key)``: where it came from, and the value; None when
    unset) give, in the declared order; fallbacks and problems on ``loader``; ``defaults``: a default ``Config``."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        got = raw(setting.env, setting.toml)
        if got is None:
            continue
        value = setting.read(loader, got[0], got[1], getattr(defaults, setting.attr, None), values)
        if value is not KEEP:
            values[setting.attr] = value
    return values
