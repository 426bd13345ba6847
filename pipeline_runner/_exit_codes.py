"""Process exit codes: the whole contract with the supervisor besides HTTP heartbeats.

The supervisor maps 10 and 11 to the terminal reasons ``budget_exhausted`` and
``time_budget_exhausted`` (planned outcomes), and 3 to the failure reason ``all_feeds_failed``.
75 (``EX_TEMPFAIL`` in sysexits.h) asks it to try the job again later. Everything else that is not a
finished run is 1.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
"""The run finished. Episode and feed failures are reported in run.json and events, not here."""
EXIT_CRASH: Final = 1
"""Unexpected crash, termination by signal, or a scheduling failure that stopped the run early."""
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
