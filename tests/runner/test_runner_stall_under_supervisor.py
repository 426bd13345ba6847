"""End to end (ADR 0002 D9-D10): a real `pipeline` job whose feed server stops answering mid-run keeps heartbeating but
makes no progress; the supervisor's sweeper flags it stalled, not dead, and it keeps running until cancelled."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio
from runner_helpers import HttpServer, hang_after_headers, respond, rss

from supervisor import Config, JobStatus, Liveness, load_kinds, run_supervisor
from supervisor.domain import Job
from supervisor.execution.subprocess import identity_of, probe

pytestmark = pytest.mark.e2e

# The built-in `pipeline` kind, overridden only to beat every 0.3 s (the runner's default is 5 s).
KINDS = """
[kinds.pipeline]
argv = ["{python}", "-m", "pipeline_runner", "run", "--feed", "{feed}", "--max-episodes", "{max_episodes}",
        "--heartbeat-interval-seconds", "0.3"]
params = { feed = "str", max_episodes = "int" }
exit_reasons = { 10 = "budget_exhausted", 11 = "time_budget_exhausted" }
"""


async def test_a_pipeline_job_whose_feed_server_stops_answering_is_flagged_stalled_not_dead(
    http_server: HttpServer, tmp_path: Path
) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url(f"/a{i}"), "1:00") for i in range(3)]))
    s.routes["/a0"] = respond(200, b"A" * 2000)
    s.routes["/a1"] = hang_after_headers()  # the server stops answering: headers, then nothing
    s.routes["/a2"] = hang_after_headers()
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    config = Config(
        data_dir=tmp_path / "data",
        bind_port=0,
        kinds_file=kinds,
        sweep_interval_s=0.25,
        progress_stale_after_s=2.0,
        silent_after_s=2.0,
        cancel_grace_s=5.0,
    )
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        sup = await nursery.start(functools.partial(run_supervisor, config, load_kinds(kinds), shutdown=shutdown))
        job_id = (await sup.enqueue("pipeline", {"feed": s.url("/feed"), "max_episodes": 3})).job.job_id

        async def until(check: object) -> Job:
            with trio.fail_after(30):
                while not check(row := await sup.get(job_id)):  # type: ignore[operator]  # noqa: ASYNC110
                    await trio.sleep(0.05)  # a real process in another program: polled
                return row

        stalled = await until(lambda r: (r.stalled and r.completed_units == 1) or r.status.is_terminal)
        assert (stalled.status, stalled.stalled, stalled.silent) == (JobStatus.RUNNING, True, False)
        assert stalled.completed_units == 1  # one episode done, then no progress
        assert stalled.stalled_since is not None
        # Not dead: its process lives and its heartbeats keep arriving after it was judged stalled.
        beating = await until(lambda r: (r.last_heartbeat_at or "") > (r.stalled_since or "~"))
        assert (beating.status, beating.stalled, beating.silent) == (JobStatus.RUNNING, True, False)
        identity = identity_of(beating)
        assert identity is not None and probe(identity) is Liveness.ALIVE
        # The default stall action only alerts: the operator decides. Cancel ends it as cancelled.
        await sup.cancel(job_id)
        final = await until(lambda r: r.status.is_terminal)
        assert (final.status, final.error_reason) == (JobStatus.CANCELLED, "cancelled")
        shutdown.set()
