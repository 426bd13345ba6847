"""The pipeline runner: the child process that the supervisor's ``pipeline`` and ``enrichment`` kinds run.

It implements ADR-150 (supervision bounds) on Trio: nested cancel-scope deadlines, budgets that end
gracefully, a crash-only corpus, heartbeats. It never imports ``supervisor``: the two talk only over
HTTP (heartbeats) and exit codes. See docs/pipeline-runner.md.
"""

from ._budget import CostLedger, Reservation
from ._config import (
    DEFAULT_PROCESSING_LOOP_BUDGET_S,
    FEED_URL_MAX_LENGTH,
    HTTP_URL_PATTERN,
    MAX_EPISODES,
    PROCESSING_LOOP_BUDGET_ENV,
    HeartbeatConfig,
    RunnerConfig,
    TransportTimeouts,
    resolve_processing_loop_budget_s,
)
from ._corpus import Corpus, PoisonMemo, episode_key
from ._enrich import EnrichRun
from ._errors import (
    ConfigError,
    DownloadError,
    EnclosureTooLargeError,
    EpisodeBudgetExceededError,
    EpisodeError,
    FeedError,
    FeedFetchError,
    FeedParseError,
    RunnerError,
    TranscriptionError,
)
from ._events import EventSink, JsonLogFormatter, configure_logging
from ._exit_codes import (
    EXIT_ALL_FEEDS_FAILED,
    EXIT_BUDGET_EXHAUSTED,
    EXIT_CODES,
    EXIT_CRASH,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_TIME_BUDGET_EXHAUSTED,
    EXIT_TRANSIENT,
    EXIT_USAGE,
    ExitMeaning,
)
from ._feed import Episode, Feed, parse_feed
from ._heartbeat import Heartbeat
from ._run import (
    REASON_ALL_FEEDS_FAILED,
    REASON_ALL_FEEDS_UNAVAILABLE,
    REASON_BUDGET_EXHAUSTED,
    REASON_COMPLETED,
    REASON_CRASHED,
    REASON_SCHEDULING_FAILED,
    REASON_TERMINATED,
    REASON_TIME_BUDGET_EXHAUSTED,
    Counts,
    PipelineRun,
    RunOutcome,
    StopSignal,
)

__all__ = [
    "DEFAULT_PROCESSING_LOOP_BUDGET_S",
    "EXIT_ALL_FEEDS_FAILED",
    "EXIT_BUDGET_EXHAUSTED",
    "EXIT_CODES",
    "EXIT_CRASH",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_TIME_BUDGET_EXHAUSTED",
    "EXIT_TRANSIENT",
    "EXIT_USAGE",
    "FEED_URL_MAX_LENGTH",
    "HTTP_URL_PATTERN",
    "MAX_EPISODES",
    "PROCESSING_LOOP_BUDGET_ENV",
    "REASON_ALL_FEEDS_FAILED",
    "REASON_ALL_FEEDS_UNAVAILABLE",
    "REASON_BUDGET_EXHAUSTED",
    "REASON_COMPLETED",
    "REASON_CRASHED",
    "REASON_SCHEDULING_FAILED",
    "REASON_TERMINATED",
    "REASON_TIME_BUDGET_EXHAUSTED",
    "ConfigError",
    "Corpus",
    "CostLedger",
    "Counts",
    "DownloadError",
    "EnclosureTooLargeError",
    "EnrichRun",
    "Episode",
    "EpisodeBudgetExceededError",
    "EpisodeError",
    "EventSink",
    "ExitMeaning",
    "Feed",
    "FeedError",
    "FeedFetchError",
    "FeedParseError",
    "Heartbeat",
    "HeartbeatConfig",
    "JsonLogFormatter",
    "PipelineRun",
    "PoisonMemo",
    "Reservation",
    "RunOutcome",
    "RunnerConfig",
    "RunnerError",
    "StopSignal",
    "TranscriptionError",
    "TransportTimeouts",
    "configure_logging",
    "episode_key",
    "parse_feed",
    "resolve_processing_loop_budget_s",
]
