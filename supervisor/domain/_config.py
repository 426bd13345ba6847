"""Configuration: one validated, immutable value object (``Config``) built from the environment and an optional TOML
file, by the declarations of ``_settings`` (each setting declared once there: how it is read, what it falls back to,
what it means).

Precedence: environment variable > TOML file (``--config``) > default.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from ._setting_readers import Loader, read_token_file, redacted_url
from ._settings import SETTINGS, TOML_KEYS, ExecMode, StallAction, read_settings, unknown_env_names

DEFAULT_DOCKER_IMAGE = "podcast-job-supervisor:local"

MIB = 1024 * 1024


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
    # The named tokens with their scopes (ADR 0017); None: <data>/.viewer/api-tokens.toml (see tokens_path).
    api_tokens_file: Path | None = None
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
    # The queue's watch (docs/operations.md § The queue's watch): how long jobs may wait while a slot is free or
    # promotion is held (but by a pause), and how long behind a pause, before the queue is said stuck.
    queue_stuck_s: float = 900.0
    pause_warn_s: float = 21600.0
    # How long an enqueue's Idempotency-Key is kept (ADR 0016): retries within it answer the first request's answer.
    idempotency_ttl_s: float = 86400.0
    # History retention (docs/operations.md § History retention): the sweeper removes finished jobs -- their rows, each
    # attempt's log and its state records -- that ended more than this many days ago, and those past the newest this
    # many finished ones. None: that rule is off (written explicitly as <= 0); both None: history is kept for ever.
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
    # Whether a PostgreSQL registry applies its missing expand migrations at start (False: `supervisor migrate` does,
    # and a supervisor refuses a schema that lacks them); contracts always wait for `supervisor migrate`.
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
    def tokens_path(self) -> Path:
        """The file of named API tokens (``supervisor token``)."""
        return self.api_tokens_file if self.api_tokens_file is not None else self.viewer_dir / "api-tokens.toml"

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


def load_config(
    env: Mapping[str, str],
    *,
    config_file: Path | None = None,
) -> tuple[Config, list[str]]:
    """Build the effective ``Config``; return it with the WARNING messages of every fallback taken.

    Raises ``ConfigError`` naming every setting that is invalid and cannot fall back.
    """
    loader = Loader()
    file_values: dict[str, Any] = {}
    if config_file is not None:
        try:
            with config_file.open("rb") as fh:
                file_values = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError([f"--config {config_file}: {exc}"]) from exc
        if isinstance(file_values.get("supervisor"), dict):
            file_values = file_values["supervisor"]
        # Unknown keys are errors: a typo must not silently leave a default in force.
        unknown = sorted(set(file_values) - TOML_KEYS)
        loader.problems.extend(f"--config {config_file}: unknown key {key!r}" for key in unknown)

    def raw(env_name: str, toml_key: str) -> tuple[str, object] | None:
        if env_name in env and env[env_name].strip() != "":
            return env_name, env[env_name].strip()
        if toml_key in file_values:
            return f"{toml_key} (in {config_file})", file_values[toml_key]
        return None

    values = read_settings(raw, loader, Config())
    loader.warnings.extend(unknown_env_names(env))
    _check_docker_settings(values, loader)
    if "database_listen_url" in values and "database_url" not in values:
        loader.problems.append(
            "PODCAST_JOB_DATABASE_LISTEN_URL is set without PODCAST_JOB_DATABASE_URL: a SQLite registry has nothing to "
            "listen to (unset it, or name the PostgreSQL database)"
        )
    if loader.problems:
        raise ConfigError(loader.problems)
    return Config(**values), loader.warnings


def config_from(values: Mapping[str, object]) -> Config:
    """A ``Config`` from settings given by field name (``max_concurrent=2``, ``stall_action="terminate"``), each read
    and checked as a config file's value of that name is: a ``ConfigError`` names every bad one. An embedder's and
    the scenario kit's way to a config, with no environment."""
    loader = Loader()
    attr_of = {setting.toml: setting.attr for setting in SETTINGS}
    loader.problems.extend(f"{name}: no such setting" for name in sorted(set(values) - set(attr_of.values())))

    def raw(env_name: str, toml_key: str) -> tuple[str, object] | None:
        attr = attr_of.get(toml_key, toml_key)
        return (attr, values[attr]) if attr in values else None

    read = read_settings(raw, loader, Config())
    # A fallback is an operator's convenience at start-up (said as a WARNING); a caller that passes a value gets an
    # error instead, never a value it did not ask for.
    if loader.problems or loader.warnings:
        raise ConfigError(loader.problems + loader.warnings)
    return Config(**read)


def _check_docker_settings(values: dict[str, Any], loader: Loader) -> None:
    """Docker mode's settings read together (each one alone is checked by its reader)."""
    unset = values.get("heartbeat_base_url") is None
    if values.get("exec_mode") == "docker" and unset and values.get("docker_network") != "host":
        # Not an error (a job need not heartbeat), but the default, the server's bound address, is loopback for a
        # supervisor on the host, and a container's loopback is its own.
        loader.warnings.append(
            "PODCAST_JOB_HEARTBEAT_BASE_URL is unset in docker mode: jobs are told the server's bound address, "
            "which a container reaches only with PODCAST_JOB_DOCKER_NETWORK=host"
        )


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


def is_loopback(host: str) -> bool:
    """True when ``host`` can only be reached from this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
