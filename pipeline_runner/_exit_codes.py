"""Process exit codes: the whole contract with the supervisor besides HTTP heartbeats.

``EXIT_CODES`` is that contract as one table: for each code, what a supervisor records (a planned outcome or a named
failure) and whether the job may be started again (attempts permitting). The supervisor's built-in ``pipeline`` and
``enrichment`` kinds must read every code the same way: a contract test compares the two tables
(``tests/runner/test_runner_exit_code_contract.py``), since the two packages share no code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

EXIT_OK: Final = 0
"""The run finished. Episode and feed failures are reported in run.json and events, not here."""
EXIT_CRASH: Final = 1
"""Unexpected crash, or a scheduling failure that stopped the run early."""
EXIT_USAGE: Final = 2
"""Usage or configuration error; nothing was run."""
EXIT_ALL_FEEDS_FAILED: Final = 3
"""Every feed failed (unreachable, malformed, hostile): the run did nothing, and that must not look like success."""
EXIT_BUDGET_EXHAUSTED: Final = 10
"""The cost cap stopped the run (reason ``budget_exhausted``)."""
EXIT_TIME_BUDGET_EXHAUSTED: Final = 11
"""The job budget (``processing_loop_budget_seconds``) stopped the run (reason ``time_budget_exhausted``)."""
EXIT_TRANSIENT: Final = 75
"""Try again later (sysexits.h ``EX_TEMPFAIL``; reason ``all_feeds_unavailable``): every feed failed, and every failure
was at the transport level and may pass by itself -- connect error, timeout, HTTP 5xx or 429 from the feed's server.
Nothing was shown to be wrong with the feeds, so a resubmission may succeed. One feed that failed for its content
(malformed or hostile XML, a 4xx other than 429, too large) makes it ``EXIT_ALL_FEEDS_FAILED`` instead."""
EXIT_TERMINATED: Final = 143
"""Stopped from outside by SIGTERM or SIGINT (a host shutdown, ``kill``, ``docker stop``), gracefully: the episode in
progress is abandoned unwritten (the corpus is crash-only) and the poison-pill memo is not touched, so a new start
picks up where this one left off (reason ``terminated``). 128 + SIGTERM: what a shell or a Docker engine reports for a
process that SIGTERM ended, so the code means the same whether or not the runner caught the signal."""


@dataclass(frozen=True)
class ExitMeaning:
    """What one exit code tells the supervisor. ``reason``: the terminal reason it records (None: its own generic
    ``exit_code_N``); ``status``: how the job ends; ``retry``: the job may be started again, attempts permitting."""

    code: int
    status: Literal["succeeded", "failed"]
    reason: str | None = None
    retry: bool = False


EXIT_CODES: Final[tuple[ExitMeaning, ...]] = (
    ExitMeaning(EXIT_OK, "succeeded"),
    ExitMeaning(EXIT_CRASH, "failed"),  # a bug fails again the same way: not resubmitted
    # Its params were refused: the same params would be refused again, so never resubmitted.
    ExitMeaning(EXIT_USAGE, "failed", "invalid_params"),
    ExitMeaning(EXIT_ALL_FEEDS_FAILED, "failed", "all_feeds_failed"),
    ExitMeaning(EXIT_BUDGET_EXHAUSTED, "succeeded", "budget_exhausted"),
    ExitMeaning(EXIT_TIME_BUDGET_EXHAUSTED, "succeeded", "time_budget_exhausted"),
    ExitMeaning(EXIT_TRANSIENT, "failed", "all_feeds_unavailable", retry=True),
    # ADR-150 D4: kill and resubmit is the only recovery verb; a polite kill is a kill.
    ExitMeaning(EXIT_TERMINATED, "failed", "terminated", retry=True),
)
