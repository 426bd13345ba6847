"""Process exit codes: the whole contract with the supervisor besides HTTP heartbeats.

The supervisor maps 10 and 11 to the terminal reasons ``budget_exhausted`` and
``time_budget_exhausted`` (planned outcomes), and 3 to the failure reason ``all_feeds_failed``.
Everything else that is not a finished run is 1.
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
