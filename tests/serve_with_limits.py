"""A supervisor serving with the HTTP edge's limits given by the test (``TEST_HTTP_LIMITS``, a JSON object of
``HttpLimits`` fields), so that a test over real sockets meets each of the edge's timeouts in seconds, not minutes.
Everything else is what ``supervisor serve`` runs, through the public API: its settings and kinds from the
environment, its JSON log, its signals and its root nursery (``run_supervisor``).

    python tests/serve_with_limits.py        (with PODCAST_JOB_* and TEST_HTTP_LIMITS in the environment)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import trio

from supervisor import load_config, load_kinds, run_supervisor
from supervisor.api import HttpLimits
from supervisor.observe import configure_logging

if __name__ == "__main__":
    configure_logging()
    given = json.loads(os.environ.get("TEST_HTTP_LIMITS", "{}"))
    # Only the fields this build has (a test compares builds): a field it lacks is a limit it does not have.
    limits = HttpLimits(**{f.name: given[f.name] for f in dataclasses.fields(HttpLimits) if f.name in given})
    config, _ = load_config(os.environ)
    trio.run(functools.partial(run_supervisor, config, load_kinds(config.kinds_file), http_limits=limits))
