"""Runner settings as validated value objects, with units in the names.

Precedence for every setting: command-line flag > environment > config file (TOML) > default.
Only the job budget and the contract's ``PODCAST_JOB_*`` variables are read from the environment.

The job budget (``processing_loop_budget_seconds``) has its own rules, from ADR-150 D1: it is
disabled only by an explicit ``<= 0``; a malformed value (not a number, NaN, infinite, a boolean)
falls back to the *default* with a WARNING -- a typo must never be able to make a run unbounded.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import tomllib
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Final

import httpx

from ._errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_PROCESSING_LOOP_BUDGET_S: Final = 4 * 60 * 60.0
"""~2x the longest legitimate run (ADR-150 D1)."""
PROCESSING_LOOP_BUDGET_ENV: Final = "PODCAST_PROCESSING_LOOP_BUDGET_SECONDS"
MAX_EPISODES: Final = 1_000_000
"""The most episodes one run may be asked for (0: all); the supervisor's ``pipeline`` kind declares the same bound."""
FEED_URL_MAX_LENGTH: Final = 2048
"""The longest feed URL a run takes; the supervisor's ``pipeline`` kind declares the same bound."""
HTTP_URL_PATTERN: Final = (
    r"[Hh][Tt][Tt][Pp][Ss]?://(?:[^\x00-\x20\x7f/?#@\[\]]+@)?"
    r"(?:\[[0-9A-Fa-f:.]+\]|[^\x00-\x20\x7f/?#@:\[\]]+)(?::[0-9]{1,5})?(?:[/?#][^\x00-\x20\x7f]*)?"
)
"""What a run takes as a feed (or transcription) URL: http or https, a host, no space or control character. The
supervisor's ``format = "url"`` is this very pattern (a contract test holds the two equal), so a job the runner would
refuse for its URL is refused at enqueue instead. A URL that matches but that the HTTP client still cannot use (an
invalid IDNA host, a bad IPv6 literal) fails as that feed's fetch, not as a usage error."""
_HTTP_URL = re.compile(HTTP_URL_PATTERN)
PROCESSING_LOOP_BUDGET_KEY: Final = "processing_loop_budget_seconds"


def _require_positive_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _require_non_negative_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")


def _is_http_url(url: str) -> bool:
    return _HTTP_URL.fullmatch(url) is not None


def _require_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be an integer > 0, got {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class TransportTimeouts:
    """The tight deadline (ADR-150 D6): every outbound HTTP call carries all four."""

    connect_s: float = 10.0
    read_s: float = 30.0
    write_s: float = 30.0
    pool_s: float = 10.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _require_positive_finite(field.name, getattr(self, field.name))

    def as_httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_s, read=self.read_s, write=self.write_s, pool=self.pool_s)


DEFAULT_HEARTBEAT_MIN_GAP_S = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    """Where and how often to beat. ``url=None`` disables heartbeats (logged once)."""

    url: str | None = None
    token: str | None = None
    interval_s: float = 5.0
    # Short on purpose: a slow heartbeat endpoint must never slow the run, only delay the next beat.
    timeout_s: float = 2.0
    # Progress is reported at once, but at most once per gap: a burst of episodes ending together is one beat (a job
    # beats at most 1/min_gap_s times a second, every interval_s when idle). None: 1 s, or the interval if shorter.
    min_gap_s: float | None = None

    def __post_init__(self) -> None:
        _require_positive_finite("heartbeat_interval_s", self.interval_s)
        _require_positive_finite("heartbeat_timeout_s", self.timeout_s)
        if self.min_gap_s is None:
            object.__setattr__(self, "min_gap_s", min(DEFAULT_HEARTBEAT_MIN_GAP_S, self.interval_s))
        assert self.min_gap_s is not None
        _require_positive_finite("heartbeat_min_gap_s", self.min_gap_s)
        if self.min_gap_s > self.interval_s:
            raise ConfigError(
                f"heartbeat_min_gap_s ({self.min_gap_s}) must not exceed heartbeat_interval_s ({self.interval_s})"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerConfig:
    """Everything one ``run`` or ``enrich`` invocation needs. Validated at construction."""

    data_dir: Path
    job_id: str
    feeds: tuple[str, ...] = ()
    max_episodes: int | None = None  # None: all episodes (an explicit 0 is stored as None)
    workers: int = 4
    # None = disabled (only ever by an explicit <= 0; see resolve_processing_loop_budget_s).
    processing_loop_budget_s: float | None = DEFAULT_PROCESSING_LOOP_BUDGET_S
    episode_budget_s: float = 60 * 60.0
    stop_grace_s: float = 30.0
    transport: TransportTimeouts = TransportTimeouts()
    max_enclosure_bytes: int = 1024 * 1024 * 1024
    max_feed_bytes: int = 20 * 1024 * 1024
    transcribe_url: str | None = None
    transcribe_usd_per_audio_minute: Decimal = Decimal("0.0043")
    cost_cap_usd: Decimal = Decimal("10.00")
    poison_threshold: int = 3
    heartbeat: HeartbeatConfig = HeartbeatConfig()

    def __post_init__(self) -> None:
        if not self.job_id or "/" in self.job_id or self.job_id in {".", ".."}:
            raise ConfigError(f"job id {self.job_id!r} is not usable as a directory name")
        for url in (*self.feeds, *([self.transcribe_url] if self.transcribe_url else [])):
            if not _is_http_url(url):
                raise ConfigError(f"not an http(s) URL with a host: {url!r}")
        for url in self.feeds:
            if len(url) > FEED_URL_MAX_LENGTH:
                raise ConfigError(f"a feed URL is longer than {FEED_URL_MAX_LENGTH} characters: {url[:80]!r}...")
        if self.max_episodes is not None and not 0 <= self.max_episodes <= MAX_EPISODES:
            raise ConfigError(f"max_episodes must be 0 (all episodes) to {MAX_EPISODES}, got {self.max_episodes}")
        if self.max_episodes == 0:
            # 0 means "no limit", so that a caller with a fixed argv (the supervisor's `pipeline` kind passes
            # `--max-episodes 0` by default) can ask for every episode; one representation of it from here on.
            object.__setattr__(self, "max_episodes", None)
        _require_positive_int("workers", self.workers)
        _require_positive_int("max_enclosure_bytes", self.max_enclosure_bytes)
        _require_positive_int("max_feed_bytes", self.max_feed_bytes)
        _require_positive_int("poison_threshold", self.poison_threshold)
        if self.processing_loop_budget_s is not None:
            _require_positive_finite("processing_loop_budget_s", self.processing_loop_budget_s)
        _require_positive_finite("episode_budget_s", self.episode_budget_s)
        _require_non_negative_finite("stop_grace_s", self.stop_grace_s)
        for name in ("transcribe_usd_per_audio_minute", "cost_cap_usd"):
            value: Decimal = getattr(self, name)
            if not value.is_finite() or value < 0:
                raise ConfigError(f"{name} must be a finite amount >= 0, got {value}")

    @property
    def corpus_dir(self) -> Path:
        return self.data_dir / "corpus"


def resolve_processing_loop_budget_s(
    *, flag: str | None, env: str | None, file_value: object = None, file_has_key: bool = False
) -> float | None:
    """Pick the job budget by precedence flag > env > file > default and apply ADR-150 D1.

    Returns the budget in seconds, or ``None`` when it was disabled explicitly by a value ``<= 0``.
    A malformed value at the winning layer falls back to the default with a WARNING, never to
    unbounded and never silently to a lower-precedence layer.
    """
    layers: list[tuple[str, object]] = []
    if flag is not None:
        layers.append(("--processing-loop-budget-seconds", flag))
    if env is not None:
        layers.append((PROCESSING_LOOP_BUDGET_ENV, env))
    if file_has_key:
        layers.append((f"config file key {PROCESSING_LOOP_BUDGET_KEY}", file_value))
    if not layers:
        return DEFAULT_PROCESSING_LOOP_BUDGET_S
    source, raw = layers[0]
    value = _parse_seconds(raw)
    if value is None:
        # ADR-150 D1: a malformed budget falls back to the default, never to unbounded.
        log.warning(
            "malformed processing loop budget %r from %s; using the default %.0f s",
            raw,
            source,
            DEFAULT_PROCESSING_LOOP_BUDGET_S,
        )
        return DEFAULT_PROCESSING_LOOP_BUDGET_S
    if value <= 0:
        # ADR-150 D1: disabled only by an explicit <= 0.
        log.warning("processing loop budget disabled explicitly by %s=%r", source, raw)
        return None
    return value


def _parse_seconds(raw: object) -> float | None:
    """A finite number of seconds, or None when malformed. Booleans are not numbers here."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            return None
    else:
        return None
    return value if math.isfinite(value) else None


# The config file's keys and how each is converted; unknown keys are errors (a typo must be loud).
_FILE_KEYS: Final[Mapping[str, str]] = {
    PROCESSING_LOOP_BUDGET_KEY: "processing_loop_budget_s",
    "episode_budget_seconds": "episode_budget_s",
    "stop_grace_seconds": "stop_grace_s",
    "workers": "workers",
    "max_episodes": "max_episodes",
    "max_enclosure_bytes": "max_enclosure_bytes",
    "max_feed_bytes": "max_feed_bytes",
    "transcribe_url": "transcribe_url",
    "transcribe_usd_per_audio_minute": "transcribe_usd_per_audio_minute",
    "cost_cap_usd": "cost_cap_usd",
    "poison_threshold": "poison_threshold",
    "connect_timeout_seconds": "connect_s",
    "read_timeout_seconds": "read_s",
    "write_timeout_seconds": "write_s",
    "pool_timeout_seconds": "pool_s",
    "heartbeat_interval_seconds": "heartbeat_interval_s",
    "heartbeat_min_gap_seconds": "heartbeat_min_gap_s",
    "heartbeat_timeout_seconds": "heartbeat_timeout_s",
}


def load_config_file(path: Path) -> dict[str, Any]:
    """Read the TOML config file. Called before the event loop starts, so plain blocking I/O is fine."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(_FILE_KEYS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown keys {unknown}; known: {sorted(_FILE_KEYS)}")
    return data


def to_decimal(name: str, raw: object) -> Decimal:
    if isinstance(raw, bool):
        raise ConfigError(f"{name} must be an amount, got {raw!r}")
    try:
        return Decimal(str(raw))
    except InvalidOperation as exc:
        raise ConfigError(f"{name} must be an amount, got {raw!r}") from exc


def to_float(name: str, raw: object) -> float:
    value = _parse_seconds(raw)
    if value is None:
        raise ConfigError(f"{name} must be a finite number, got {raw!r}")
    return value


def to_int(name: str, raw: object) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"{name} must be an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            pass
    raise ConfigError(f"{name} must be an integer, got {raw!r}")
