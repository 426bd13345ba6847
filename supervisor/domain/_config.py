"""Configuration: one validated, immutable value object built from the environment and an optional TOML file.

Rules (ADR-0002, INV-MALFORMED-NEVER-UNBOUNDED):
- a malformed number falls back to its default with a WARNING naming the variable, never to "unbounded";
- a value below its floor is raised to the floor, with a WARNING;
- a setting with no safe fallback (an unknown exec mode, an unparsable bind address, an unknown key in the
  TOML file) is collected into one ``ConfigError`` that names every such setting.

Precedence: environment variable > TOML file (``--config``) > default.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import socket
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from ._errors import ConfigError

# The one list of exec modes (``execution.create_executor`` builds each; the OpenAPI document enumerates these).
ExecMode = Literal["subprocess", "docker"]
EXEC_MODES: tuple[ExecMode, ...] = get_args(ExecMode)
DEFAULT_DOCKER_IMAGE = "podcast-job-supervisor:local"
# Docker object names: a network or a named volume.
_DOCKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
StallAction = Literal["alert", "terminate"]
STALL_ACTIONS: tuple[StallAction, ...] = get_args(StallAction)

MIB = 1024 * 1024
_HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Config:
    """The supervisor's effective settings. Durations are seconds (``_s``), sizes bytes (``_bytes``)."""

    data_dir: Path = Path("./var")
    bind_host: str = "127.0.0.1"
    bind_port: int = 8000
    max_concurrent: int = 1
    sweep_interval_s: float = 30.0
    # None disables the wall-clock rule (written explicitly as <= 0).
    stale_after_s: float | None = 86400.0
    progress_stale_after_s: float | None = 1800.0
    # A job that heartbeated and then stopped for this long while its process lives is "silent". The default is
    # 3 x the runner's heartbeat interval (5 s), but at least 60 s. None disables (written explicitly as <= 0).
    silent_after_s: float | None = 60.0
    # What the sweeper does with a stalled job: "alert" flags it; "terminate" also stops it (SIGTERM, SIGKILL after
    # cancel_grace_s), and the row ends stale / progress_stalled once the process is gone.
    stall_action: StallAction = "alert"
    exec_mode: ExecMode = "subprocess"
    api_token: str | None = field(default=None, repr=False)
    # Where api_token was read from (re-read on SIGHUP); None when it came from PODCAST_JOB_API_TOKEN or is unset.
    api_token_file: Path | None = None
    kinds_file: Path | None = None
    webhook_url: str | None = None
    webhook_timeout_s: float = 5.0
    # HMAC-SHA256 key for X-Podcast-Signature; never printed, never passed to jobs.
    webhook_secret: str | None = field(default=None, repr=False)
    # The outbox keeps undelivered events up to this many and this old; what goes past is dropped (counted, logged).
    webhook_outbox_max_events: int = 10_000
    webhook_outbox_max_age_s: float = 7 * 86400.0
    # The event stream (GET /api/events): events kept for readers that resume (Last-Event-ID), each reader's queue
    # (a reader that lets it fill is dropped), readers at once, and how often an idle stream sends a keep-alive.
    events_replay_events: int = 1000
    # The queue absorbs a burst: the bus announces a batch enqueue (up to 1,000 jobs) in one go, before any reader runs.
    events_client_buffer_events: int = 2048
    events_max_clients: int = 64
    events_keepalive_s: float = 15.0
    # History retention (issue 28): the sweeper removes finished jobs -- their rows, each attempt's log and its
    # state records -- that ended more than this many days ago, and those past the newest this many finished ones.
    # None: that rule is off (written explicitly as <= 0); both None: history is kept for ever.
    retention_days: float | None = 30.0
    retention_max_jobs: int | None = 100_000
    log_max_bytes: int = 50 * MIB
    # How long a registry write waits for another writer's lock before it counts as failed (and is retried).
    registry_busy_timeout_ms: int = 10_000
    # A fleet on one registry (ADR 0012): this supervisor's host name (default: the machine's), and how long its
    # lease lasts unrenewed (renewed every third of it; a leader that cannot renew stops leading before it ends).
    host_id: str = field(default_factory=socket.gethostname)
    host_lease_s: float = 15.0
    # This host's own cap on its running jobs, within the fleet-wide max_concurrent. None: none of its own.
    host_max_concurrent: int | None = None
    cancel_grace_s: float = 30.0
    docker_image: str = DEFAULT_DOCKER_IMAGE
    # None: the engine's default bridge network.
    docker_network: str | None = None
    # None: the supervisor's data dir, bind-mounted (a supervisor on the host). A volume name or an absolute host path.
    docker_data_volume: str | None = None
    # Every call to the Docker engine gives up after this long (a wait for a container's exit: its own slice; a stop:
    # this plus the grace period): an engine that accepts and never answers is UNKNOWN after it, never a hang.
    docker_timeout_s: float = 10.0
    # None: the address the server is bound to (see api.public_base_url).
    heartbeat_base_url: str | None = None
    # Where the shepherd writes jobs' state records while this supervisor is connected (ADR 0004): "auto" is
    # /dev/shm/podcast-supervisor-<uid>/<hash of the data dir> where /dev/shm is a directory, else none; "off" is
    # none (records next to the logs at once); or an absolute path. See run_dirs().
    run_dir: str = "auto"
    # Diagnostics: a file the shepherd appends one JSON line to at every job's start and exit (its clock). None: off.
    shepherd_trace_file: Path | None = None
    # The registry: None is the SQLite file under the data dir (the embedded default); a postgresql:// URL is that
    # database (ADR 0011). Never printed whole: it may hold a password.
    database_url: str | None = field(default=None, repr=False)
    # The bound of every call to a PostgreSQL registry, from asking for a connection to the commit.
    database_timeout_s: float = 10.0
    # Whether a PostgreSQL registry brings its schema up to date at start (False: `supervisor migrate` does, and a
    # supervisor refuses a schema that is not current).
    database_auto_migrate: bool = True
    # What stands between a PostgreSQL registry and its server: "none" (the server itself, or a pooler in session
    # mode), or "transaction" (a pooler in transaction mode, pgbouncer's pool_mode = transaction): then no statement
    # is prepared by name, no setting is sent at connection start, and no LISTEN is made (the sweeps move the fleet).
    database_pooler: str = "none"
    # Where a PostgreSQL registry LISTENs for the fleet's wake-ups, when not at database_url: PostgreSQL itself (or a
    # pooler in session mode) for a fleet whose database_url is a pooler in transaction mode, where no LISTEN works.
    # None: at database_url, unless that is a transaction pooler (then none: the sweeps move the fleet).
    database_listen_url: str | None = field(default=None, repr=False)

    # Everything the supervisor writes besides the corpus lives under <data>/.viewer/.
    @property
    def viewer_dir(self) -> Path:
        return self.data_dir / ".viewer"

    @property
    def registry_path(self) -> Path:
        return self.viewer_dir / "jobs.sqlite3"

    @property
    def jobs_log_dir(self) -> Path:
        return self.viewer_dir / "jobs"

    @functools.cached_property
    def pause_flag_path(self) -> Path:
        # Looked at on every job's end (the promotion it makes is skipped while paused): built once.
        return self.viewer_dir / "jobs.paused"

    def run_dirs(self) -> tuple[Path, Path] | None:
        """The run directory and the directory from which down it must be private to this user; None for none.

        Blocking (it resolves the data dir and looks at /dev/shm): called once, when the executor is built.
        """
        if self.run_dir == "off":
            return None
        if self.run_dir != "auto":
            path = Path(self.run_dir)
            return path, path
        shm = Path("/dev/shm")
        if not shm.is_dir():
            return None
        # One directory per data dir: two supervisors on one machine never read each other's records.
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:16]
        mine = shm / f"podcast-supervisor-{os.geteuid()}"
        return mine / digest, mine

    @property
    def bind(self) -> str:
        host = f"[{self.bind_host}]" if ":" in self.bind_host else self.bind_host
        return f"{host}:{self.bind_port}"

    def describe(self) -> dict[str, object]:
        """The effective configuration for ``check-config``; the API token is never printed."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("api_token", "webhook_secret"):
                value = "(set)" if value else None
            elif f.name in ("database_url", "database_listen_url") and value is not None:
                value = redacted_url(value)
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out


@dataclass
class _Loader:
    """Collects WARNING-level fallbacks and hard errors while settings are parsed."""

    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def number(
        self,
        name: str,
        raw: object,
        default: float,
        *,
        integer: bool = False,
        floor: float | None = None,
        ceiling: float | None = None,
        disable_at_or_below_zero: bool = False,
    ) -> Any:
        try:
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise ValueError("not a number")
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError("not finite")
            if integer and value != int(value):
                raise ValueError("not an integer")
        except (TypeError, ValueError):
            # INV-MALFORMED-NEVER-UNBOUNDED: junk means the default, never "no limit".
            self.warnings.append(f"{name}={raw!r} is not a valid number; using the default {default!r}")
            return default
        if disable_at_or_below_zero and value <= 0:
            return None
        if floor is not None and value < floor:
            self.warnings.append(f"{name}={raw!r} is below the floor {floor!r}; using {floor!r}")
            value = floor
        if ceiling is not None and value > ceiling:
            self.warnings.append(f"{name}={raw!r} is above the ceiling {ceiling!r}; using {ceiling!r}")
            value = ceiling
        return int(value) if integer else float(value)


def _str_or_none(raw: object) -> str | None:
    text = str(raw).strip()
    return text or None


def load_config(
    env: Mapping[str, str],
    *,
    config_file: Path | None = None,
) -> tuple[Config, list[str]]:
    """Build the effective ``Config``; return it with the WARNING messages of every fallback taken.

    Raises ``ConfigError`` naming every setting that is invalid and cannot fall back.
    """
    loader = _Loader()
    file_values: dict[str, Any] = {}
    if config_file is not None:
        try:
            with config_file.open("rb") as fh:
                file_values = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError([f"--config {config_file}: {exc}"]) from exc
        if isinstance(file_values.get("supervisor"), dict):
            file_values = file_values["supervisor"]
        unknown = sorted(set(file_values) - set(_TOML_KEYS))
        # Unknown keys are errors: a typo must not silently leave a default in force.
        loader.problems.extend(f"--config {config_file}: unknown key {k!r}" for k in unknown)

    defaults = Config()

    def raw(env_name: str, toml_key: str) -> tuple[str, object] | None:
        if env_name in env and env[env_name].strip() != "":
            return env_name, env[env_name].strip()
        if toml_key in file_values:
            return f"{toml_key} (in {config_file})", file_values[toml_key]
        return None

    values: dict[str, Any] = {}

    def num(attr: str, env_name: str, **kw: Any) -> None:
        got = raw(env_name, attr)
        if got is not None:
            values[attr] = loader.number(got[0], got[1], getattr(defaults, attr), **kw)

    got = raw("PODCAST_JOB_DATA_DIR", "data_dir")
    if got is not None:
        values["data_dir"] = Path(str(got[1]))
    got = raw("PODCAST_JOB_BIND", "bind")
    if got is not None:
        try:
            values["bind_host"], values["bind_port"] = parse_bind(str(got[1]))
        except ValueError as exc:
            loader.problems.append(f"{got[0]}={got[1]!r}: {exc}")
    num("max_concurrent", "PODCAST_JOB_MAX_CONCURRENT", integer=True, floor=1)
    num("sweep_interval_s", "PODCAST_JOB_SWEEP_SECONDS", floor=1.0)
    num("stale_after_s", "PODCAST_JOB_STALE_SECONDS", disable_at_or_below_zero=True)
    num("progress_stale_after_s", "PODCAST_JOB_PROGRESS_STALE_SECONDS", disable_at_or_below_zero=True)
    num("silent_after_s", "PODCAST_JOB_SILENT_SECONDS", floor=1.0, disable_at_or_below_zero=True)
    num("webhook_timeout_s", "PODCAST_JOB_WEBHOOK_TIMEOUT_SEC", floor=0.5)
    num("webhook_outbox_max_events", "PODCAST_JOB_WEBHOOK_OUTBOX_MAX_EVENTS", integer=True, floor=1)
    num("webhook_outbox_max_age_s", "PODCAST_JOB_WEBHOOK_OUTBOX_MAX_AGE_SECONDS", floor=60.0)
    num("events_replay_events", "PODCAST_JOB_EVENTS_REPLAY_EVENTS", integer=True, floor=1)
    num("events_client_buffer_events", "PODCAST_JOB_EVENTS_CLIENT_BUFFER_EVENTS", integer=True, floor=1)
    num("events_max_clients", "PODCAST_JOB_EVENTS_MAX_CLIENTS", integer=True, floor=1)
    # At most a minute: a client that hears nothing for longer takes the connection for dead (the CLI, at 90 s).
    num("events_keepalive_s", "PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS", floor=1.0, ceiling=60.0)
    num("retention_days", "PODCAST_JOB_RETENTION_DAYS", disable_at_or_below_zero=True)
    num("retention_max_jobs", "PODCAST_JOB_RETENTION_MAX_JOBS", integer=True, disable_at_or_below_zero=True)
    num("log_max_bytes", "PODCAST_JOB_LOG_MAX_BYTES", integer=True, floor=4096)
    num("registry_busy_timeout_ms", "PODCAST_JOB_REGISTRY_BUSY_TIMEOUT_MS", integer=True, floor=50)
    num("host_lease_s", "PODCAST_JOB_HOST_LEASE_SECONDS", floor=3.0)
    got = raw("PODCAST_JOB_HOST_MAX_CONCURRENT", "host_max_concurrent")
    if got is not None:
        text = str(got[1]).strip()
        if text.isdigit() and int(text) >= 1:
            values["host_max_concurrent"] = int(text)
        else:
            # No fallback: "no cap of its own" is not what an operator who set one meant.
            loader.problems.append(f"{got[0]}={got[1]!r}: must be a whole number of jobs, at least 1")
    got = raw("PODCAST_JOB_HOST_ID", "host_id")
    if got is not None:
        word = str(got[1])
        if _HOST_ID.fullmatch(word):
            values["host_id"] = word
        else:
            # No fallback: another host's name, or a made-up one, would judge or orphan the wrong jobs.
            loader.problems.append(f"{got[0]}={got[1]!r}: a host id is 1-64 letters, digits, '.', '_' or '-'")
    num("cancel_grace_s", "PODCAST_JOB_CANCEL_GRACE_SECONDS", floor=0.0)
    num("database_timeout_s", "PODCAST_JOB_DATABASE_TIMEOUT_SECONDS", floor=0.1)
    num("docker_timeout_s", "PODCAST_JOB_DOCKER_TIMEOUT_SECONDS", floor=0.5)

    def choice(attr: str, env_name: str, allowed: tuple[str, ...]) -> None:
        """One of a fixed set of words, case-insensitive. No fallback: guessing an exec mode would run jobs where the
        operator did not choose, and a mistyped stall action must not quietly leave stalled jobs running."""
        got = raw(env_name, attr)
        if got is None:
            return
        word = str(got[1]).lower()
        if word in allowed:
            values[attr] = word
        else:
            loader.problems.append(f"{got[0]}={got[1]!r}: must be one of {', '.join(allowed)}")

    choice("exec_mode", "PODCAST_PIPELINE_EXEC_MODE", EXEC_MODES)
    choice("stall_action", "PODCAST_JOB_STALL_ACTION", STALL_ACTIONS)
    for attr, env_name in (
        ("api_token", "PODCAST_JOB_API_TOKEN"),
        ("webhook_url", "PODCAST_JOB_WEBHOOK_URL"),
        ("webhook_secret", "PODCAST_JOB_WEBHOOK_SECRET"),
        ("docker_image", "PODCAST_JOB_DOCKER_IMAGE"),
        ("docker_network", "PODCAST_JOB_DOCKER_NETWORK"),
        ("docker_data_volume", "PODCAST_JOB_DOCKER_DATA_VOLUME"),
        ("heartbeat_base_url", "PODCAST_JOB_HEARTBEAT_BASE_URL"),
    ):
        got = raw(env_name, attr)
        if got is not None:
            values[attr] = _str_or_none(got[1])
    _check_docker_settings(values, loader)
    got = raw("PODCAST_JOB_API_TOKEN_FILE", "api_token_file")
    if got is not None:
        if values.get("api_token"):
            # Two sources would leave an operator guessing which one the server uses.
            loader.problems.append(
                f"{got[0]}: set either PODCAST_JOB_API_TOKEN or PODCAST_JOB_API_TOKEN_FILE, not both"
            )
        else:
            token_file = Path(str(got[1]))
            try:
                values["api_token"] = read_token_file(token_file)
                values["api_token_file"] = token_file
            except ConfigError as exc:
                loader.problems.extend(f"{got[0]}: {problem}" for problem in exc.problems)
    got = raw("PODCAST_JOB_RUN_DIR", "run_dir")
    if got is not None:
        word = str(got[1])
        if word.lower() in ("auto", "off"):
            values["run_dir"] = word.lower()
        elif Path(word).is_absolute():
            values["run_dir"] = word
        else:
            loader.problems.append(f"{got[0]}={got[1]!r}: must be auto, off or an absolute path")
    got = raw("PODCAST_JOB_SHEPHERD_TRACE_FILE", "shepherd_trace_file")
    if got is not None:
        values["shepherd_trace_file"] = Path(str(got[1]))
    got = raw("PODCAST_JOB_KINDS_FILE", "kinds_file")
    if got is not None:
        values["kinds_file"] = Path(str(got[1]))
    got = raw("PODCAST_JOB_DATABASE_URL", "database_url")
    if got is not None:
        url = str(got[1])
        if not url.startswith(DATABASE_URL_SCHEMES):
            # Guessing would put the queue somewhere the operator did not choose: SQLite is chosen by leaving it unset.
            shown = redacted_url(url) if "://" in url else "(not a URL)"
            loader.problems.append(
                f"{got[0]}={shown!r}: must be a postgresql:// URL (unset, the registry is SQLite in the data dir)"
            )
        else:
            values["database_url"] = url
    got = raw("PODCAST_JOB_DATABASE_AUTO_MIGRATE", "database_auto_migrate")
    if got is not None:
        word = str(got[1]).lower()
        if word in ("1", "true", "yes", "on"):
            values["database_auto_migrate"] = True
        elif word in ("0", "false", "no", "off"):
            values["database_auto_migrate"] = False
        else:
            loader.problems.append(f"{got[0]}={got[1]!r}: must be true or false")
    got = raw("PODCAST_JOB_DATABASE_LISTEN_URL", "database_listen_url")
    if got is not None:
        url = str(got[1])
        if not url.startswith(DATABASE_URL_SCHEMES):
            shown = redacted_url(url) if "://" in url else "(not a URL)"
            loader.problems.append(f"{got[0]}={shown!r}: must be a postgresql:// URL")
        else:
            values["database_listen_url"] = url
    got = raw("PODCAST_JOB_DATABASE_POOLER", "database_pooler")
    if got is not None:
        word = str(got[1]).lower()
        if word in DATABASE_POOLERS:
            values["database_pooler"] = word
        else:
            # A wrong guess either way fails later and less clearly (a prepared statement gone, a LISTEN that hears
            # nothing): say it now.
            loader.problems.append(f"{got[0]}={got[1]!r}: must be one of {', '.join(DATABASE_POOLERS)}")
    if "database_listen_url" in values and "database_url" not in values:
        loader.problems.append(
            "PODCAST_JOB_DATABASE_LISTEN_URL is set without PODCAST_JOB_DATABASE_URL: a SQLite registry has nothing to "
            "listen to (unset it, or name the PostgreSQL database)"
        )
    webhook = values.get("webhook_url")
    if webhook and not str(webhook).startswith(("http://", "https://")):
        loader.problems.append(f"PODCAST_JOB_WEBHOOK_URL={webhook!r}: must be an http:// or https:// URL")

    if loader.problems:
        raise ConfigError(loader.problems)
    return Config(**values), loader.warnings


_TOML_KEYS = (
    "registry_busy_timeout_ms",
    "host_id",
    "host_lease_s",
    "host_max_concurrent",
    "data_dir",
    "bind",
    "max_concurrent",
    "sweep_interval_s",
    "stale_after_s",
    "progress_stale_after_s",
    "silent_after_s",
    "stall_action",
    "exec_mode",
    "api_token",
    "api_token_file",
    "kinds_file",
    "webhook_url",
    "webhook_timeout_s",
    "webhook_secret",
    "webhook_outbox_max_events",
    "webhook_outbox_max_age_s",
    "events_replay_events",
    "events_client_buffer_events",
    "events_max_clients",
    "events_keepalive_s",
    "retention_days",
    "retention_max_jobs",
    "log_max_bytes",
    "cancel_grace_s",
    "docker_image",
    "docker_network",
    "docker_data_volume",
    "docker_timeout_s",
    "heartbeat_base_url",
    "run_dir",
    "shepherd_trace_file",
    "database_url",
    "database_timeout_s",
    "database_auto_migrate",
    "database_pooler",
    "database_listen_url",
)

DATABASE_POOLERS = ("none", "transaction")

DATABASE_URL_SCHEMES = ("postgresql://", "postgres://")


def redacted_url(url: str) -> str:
    """``url`` without its password: what logs, errors and ``check-config`` may show."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return "(an unparsable URL)"
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def _check_docker_settings(values: dict[str, Any], loader: _Loader) -> None:
    """Settings that say where jobs run and how they reach us: a wrong one has no safe fallback."""
    image = values.get("docker_image", DEFAULT_DOCKER_IMAGE)
    if image is None or any(ch.isspace() for ch in image):
        # An empty image name would make every docker job fail to start; a default image is no better a guess.
        loader.problems.append(f"PODCAST_JOB_DOCKER_IMAGE={image!r}: must be an image reference, e.g. name:tag")
    network = values.get("docker_network")
    if network is not None and not _DOCKER_NAME.fullmatch(network):
        loader.problems.append(f"PODCAST_JOB_DOCKER_NETWORK={network!r}: must be a Docker network name")
    volume = values.get("docker_data_volume")
    if volume is not None and not (volume.startswith("/") or _DOCKER_NAME.fullmatch(volume)):
        loader.problems.append(
            f"PODCAST_JOB_DOCKER_DATA_VOLUME={volume!r}: must be a volume name or an absolute host path"
        )
    url = values.get("heartbeat_base_url")
    if values.get("exec_mode") == "docker" and url is None and network != "host":
        # Not an error (a job need not heartbeat), but the default, the server's bound address, is loopback for a
        # supervisor on the host, and a container's loopback is its own.
        loader.warnings.append(
            "PODCAST_JOB_HEARTBEAT_BASE_URL is unset in docker mode: jobs are told the server's bound address, "
            "which a container reaches only with PODCAST_JOB_DOCKER_NETWORK=host"
        )
    if url is not None:
        if not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", url):
            loader.problems.append(
                f"PODCAST_JOB_HEARTBEAT_BASE_URL={url!r}: must be an http:// or https:// URL with a host, "
                "e.g. http://supervisor:8000"
            )
        else:
            values["heartbeat_base_url"] = url.rstrip("/")


MAX_TOKEN_FILE_BYTES = 4096


def read_token_file(path: Path) -> str:
    """The operator token held in ``path`` (surrounding white space dropped). Blocking: call it off the loop.

    An unreadable or empty file is a ``ConfigError``: never a silent fallback to "no token" (an open API).
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"cannot read the API token file {path}: {exc.strerror or exc}"]) from exc
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError([f"the API token file {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes"])
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError([f"the API token file {path} is not UTF-8 text"]) from None
    if not token:
        raise ConfigError([f"the API token file {path} is empty"])
    if any(ch.isspace() or not ch.isprintable() for ch in token):
        raise ConfigError([f"the API token file {path} holds more than one printable word"])
    return token


class ApiToken:
    """The operator token the API checks now: fixed, or re-read from its file on SIGHUP (``reload``).

    A reload that fails keeps the token in force: a broken edit must never open the API.
    """

    def __init__(self, token: str | None, path: Path | None = None) -> None:
        self._token = token
        self.path = path

    @classmethod
    def from_config(cls, config: Config) -> ApiToken:
        return cls(config.api_token, config.api_token_file)

    @property
    def current(self) -> str | None:
        return self._token

    def reload(self) -> bool:
        """Re-read the token file (blocking). False when the token does not come from a file."""
        if self.path is None:
            return False
        self._token = read_token_file(self.path)
        return True


def parse_bind(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` for IPv6) into its parts."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError("expected HOST:PORT")
    host = host.removeprefix("[").removesuffix("]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    return host, port


def is_loopback(host: str) -> bool:
    """True when ``host`` can only be reached from this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
