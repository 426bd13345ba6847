"""Every param checked at enqueue (ADR 0017): the built-in pipeline's params and a kind's declared rules, at their
edges, through the API (422 naming ``params.NAME``, nothing stored) and the CLI (exit 1, the field named). Before,
``-p feed=notaurl`` and ``-p max_episodes=-3`` were queued, took a slot and failed with ``exit_code_2``."""

from __future__ import annotations

import functools
import io
from typing import Any

import pytest
import trio
from api_support import Harness, Live, MakeLive, assert_error

from supervisor.cli import EXIT_ERROR, EXIT_OK, main

FEED = "https://example.org/feed.xml"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"feed": "notaurl"}, "params.feed"),
        ({"feed": "ftp://example.org/feed.xml"}, "params.feed"),
        ({"feed": "https://"}, "params.feed"),
        ({"feed": "https://e.org/" + "a" * (2049 - 14)}, "params.feed"),
        ({"feed": FEED, "max_episodes": -3}, "params.max_episodes"),
        ({"feed": FEED, "max_episodes": "-1"}, "params.max_episodes"),
        ({"feed": FEED, "max_episodes": 1_000_001}, "params.max_episodes"),
        ({"feed": FEED, "max_episodes": 99999999999999999999999}, "params.max_episodes"),
        ({"feed": FEED, "max_episodes": 2**63}, "params.max_episodes"),
        ({"feed": FEED, "max_episodes": 2.5}, "params.max_episodes"),
    ],
)
async def test_a_pipeline_param_its_runner_would_refuse_is_a_422_and_stores_nothing(
    harness: Harness, params: dict[str, Any], field: str
) -> None:
    status, body = await harness.json("POST", "/api/jobs", json={"kind": "pipeline", "params": params})
    assert status == 422, body
    assert_error(body, "validation_error", field)
    status, body = await harness.json(
        "POST", "/api/jobs/batch", json={"jobs": [{"kind": "tidy"}, {"kind": "pipeline", "params": params}]}
    )
    assert status == 422
    assert_error(body, "validation_error", f"jobs[1].{field}")
    assert sum((await harness.supervisor.registry.counts()).values()) == 0


@pytest.mark.parametrize(
    "params",
    [
        {"feed": "https://e.org/" + "a" * (2048 - 14)},
        {"feed": "HTTP://[::1]:8080/f?x=1", "max_episodes": 0},
        {"feed": FEED, "max_episodes": 1_000_000},
        {"feed": FEED, "max_episodes": "1000000"},
        {"feed": FEED, "max_episodes": 7.0},  # an integer to JSON, as to the document
    ],
)
async def test_a_pipeline_param_at_its_edge_is_queued(harness: Harness, params: dict[str, Any]) -> None:
    await harness.supervisor.pause()  # queued, never run: nothing here may fetch a feed
    status, body = await harness.json("POST", "/api/jobs", json={"kind": "pipeline", "params": params})
    assert status == 202, body
    job = await harness.supervisor.get(body["job_id"])
    assert job.params["feed"] == params["feed"] and job.status == "queued"


async def cli(url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    run = functools.partial(main, list(argv), environ={"PODCAST_JOB_URL": url}, stdout=out, stderr=err)
    with trio.fail_after(20):
        code = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    return code, out.getvalue(), err.getvalue()


async def test_the_cli_refuses_a_bad_param_with_exit_1_naming_the_field(make_live: MakeLive) -> None:
    live: Live = await make_live()
    await live.supervisor.pause()
    for argv, field, why in [
        (["-p", "feed=notaurl"], "params.feed", "must be an http or https URL with a host, got 'notaurl'"),
        (["-p", f"feed={FEED}", "-p", "max_episodes=-3"], "params.max_episodes", "must be at least 0, got -3"),
        (["-p", f"feed={FEED}", "-p", "max_episodes=99999999999999999999999"], "params.max_episodes", "at most 18"),
    ]:
        code, out, err = await cli(live.url, "enqueue", "pipeline", *argv)
        assert (code, out) == (EXIT_ERROR, ""), err
        assert field in err and why in err, err
    assert sum((await live.supervisor.registry.counts()).values()) == 0
    code, out, err = await cli(live.url, "enqueue", "pipeline", "-p", f"feed={FEED}", "-p", "max_episodes=1000000")
    assert code == EXIT_OK, err
