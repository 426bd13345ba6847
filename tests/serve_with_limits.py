"""``supervisor serve`` with the HTTP edge's limits given by the test (``TEST_HTTP_LIMITS``, a JSON object of
``HttpLimits`` fields), so that a test over real sockets meets each of the edge's timeouts in seconds, not minutes.
Everything else is the real command: its settings from the environment, its signals, its root nursery.

    python tests/serve_with_limits.py        (with PODCAST_JOB_* and TEST_HTTP_LIMITS in the environment)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from supervisor.api import HttpLimits
from supervisor.cli import _cli

if __name__ == "__main__":
    given = json.loads(os.environ.get("TEST_HTTP_LIMITS", "{}"))
    # Only the fields this build has (a test compares builds): a field it lacks is a limit it does not have.
    limits = HttpLimits(**{f.name: given[f.name] for f in dataclasses.fields(HttpLimits) if f.name in given})
    _cli.HttpLimits = lambda: limits  # type: ignore[assignment,misc]  # serve builds its limits from HttpLimits()
    sys.exit(_cli.main(["serve"]))
