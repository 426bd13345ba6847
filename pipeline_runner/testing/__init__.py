"""Run the pipeline runner in-process against scripted servers, in virtual time (docs/testing.md § The runner's
deadlines).

For the author of a pipeline stage: the runner's three nested deadlines (transport ⊂ episode ⊂ job, ADR-150 D6)
and its budgets, tested under ``trio.testing.MockClock`` as the process would meet them, without a process, a
socket or a real second. Like the runner, it never imports ``supervisor``.
"""

from ._inprocess import HEARTBEAT_URL, Beat, InProcessRun, Sent, run_in_process
from ._transport import FeedEpisode, Reply, ScriptedTransport, drip, episode, hang, respond, rss, unreachable

__all__ = [
    "HEARTBEAT_URL",
    "Beat",
    "FeedEpisode",
    "InProcessRun",
    "Reply",
    "ScriptedTransport",
    "Sent",
    "drip",
    "episode",
    "hang",
    "respond",
    "rss",
    "run_in_process",
    "unreachable",
]
