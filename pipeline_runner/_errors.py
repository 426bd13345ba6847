"""The runner's errors, named by whose fault they are.

    RunnerError                      root; never raised itself
    ├── ConfigError                  the operator's fault: bad flag, env or config file  -> exit 2
    ├── FeedError                    the feed's fault: that feed fails, the run goes on
    │   ├── FeedFetchError           transport error, HTTP status, size limit (``transient`` when it may pass)
    │   └── FeedParseError           malformed or hostile XML (DTD, entities), not RSS
    └── EpisodeError                 one episode's fault: it is recorded as failed, the run goes on,
        │                            and it counts towards the poison-pill memo
        ├── DownloadError            transport error or HTTP status while fetching the enclosure
        │   └── EnclosureTooLargeError   Content-Length or streamed size over the limit
        ├── TranscriptionError       the transcription provider failed or answered garbage
        └── EpisodeBudgetExceededError  the episode outlived its own budget and was cancelled

Budget exhaustion (cost cap, job budget) is deliberately *not* in this tree: ADR-150 D5 makes it a
planned outcome, expressed as a stop reason on the run, never as an exception racing the workers.
Programming errors (bugs) propagate as whatever they are; the CLI maps them to exit 1.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Root of every error the runner raises on purpose."""


class ConfigError(RunnerError):
    """A setting is invalid; the operator must fix the flag, environment or config file."""


class FeedError(RunnerError):
    """A feed could not be fetched or parsed; only that feed fails.

    ``transient`` says the failure was at the transport level and may pass by itself (connect error, timeout,
    HTTP 5xx or 429 from the feed's server): nothing was shown to be wrong with the feed. A run whose every feed
    failed that way exits ``EXIT_TRANSIENT`` (try again later) rather than ``EXIT_ALL_FEEDS_FAILED``.
    """

    def __init__(self, feed_url: str, reason: str, *, transient: bool = False) -> None:
        super().__init__(f"feed {feed_url}: {reason}")
        self.feed_url = feed_url
        self.reason = reason
        self.transient = transient


class FeedFetchError(FeedError):
    """The feed document could not be downloaded."""


class FeedParseError(FeedError):
    """The feed document is malformed, hostile, or not RSS."""


class EpisodeError(RunnerError):
    """One episode failed; it is recorded and counted towards the poison-pill memo."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DownloadError(EpisodeError):
    """The enclosure could not be downloaded."""


class EnclosureTooLargeError(DownloadError):
    """The enclosure is (or claims to be) larger than the configured limit."""


class TranscriptionError(EpisodeError):
    """The transcription provider failed."""


class EpisodeBudgetExceededError(EpisodeError):
    """The episode ran past its own budget and was cancelled."""
