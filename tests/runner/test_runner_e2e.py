"""End to end: the real ``python -m pipeline_runner`` subprocess against a real misbehaving HTTP server.

Timeouts are configured small (read 0.3 s, episode budget 1-2 s) so the whole file stays fast; each
subprocess is bounded by ``trio.fail_after`` inside ``run_runner``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import trio
from runner_helpers import (
    BILLION_LAUGHS,
    MALFORMED_XML,
    HttpServer,
    drip,
    hang_after_headers,
    json_answer,
    no_content,
    respond,
    rss,
    run_runner,
    runner_env,
    spawn_runner,
)

from pipeline_runner import (
    EXIT_ALL_FEEDS_FAILED,
    EXIT_BUDGET_EXHAUSTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_TIME_BUDGET_EXHAUSTED,
    EXIT_TRANSIENT,
    EXIT_USAGE,
    configure_logging,
    episode_key,
)
from pipeline_runner._staging import read_own_identity, staging_name

pytestmark = pytest.mark.e2e

FAST = ["--read-timeout-seconds", "0.3", "--connect-timeout-seconds", "1", "--heartbeat-interval-seconds", "0.2"]


def manifest(data_dir: Path, job_id: str = "job-1") -> dict:
    return json.loads((data_dir / "corpus" / ".runs" / job_id / "run.json").read_text())


def complete(data_dir: Path, guid: str) -> bool:
    return (data_dir / "corpus" / "episodes" / episode_key(guid) / "COMPLETE").exists()


async def test_happy_run_writes_corpus_manifest_events_and_heartbeats(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url(f"/a{i}"), "10:00") for i in range(3)]))
    for i in range(3):
        s.routes[f"/a{i}"] = respond(200, b"A" * 5000)
    s.routes["/transcribe"] = json_answer({"text": "hello"})
    s.routes["/hb"] = no_content()
    env = runner_env(tmp_path, PODCAST_JOB_HEARTBEAT_URL=s.url("/hb"), PODCAST_JOB_TOKEN="tok")

    result = await run_runner(
        ["run", "--feed", s.url("/feed"), "--max-episodes", "5", "--transcribe-url", s.url("/transcribe"), *FAST],
        env,
        cwd=tmp_path,
    )

    assert result.returncode == EXIT_OK, result.stderr
    assert result.events[0]["event"] == "run_started"
    assert len(result.of("episode_done")) == 3
    assert result.of("run_finished")[0]["reason"] == "completed"
    m = manifest(tmp_path)
    assert m["reason"] == "completed"
    assert m["counts"] == {"done": 3, "skipped": 0, "failed": 0, "poisoned": 0, "cancelled": 0}
    assert m["spend_usd"] == pytest.approx(3 * 10 * 0.0043)
    assert all(complete(tmp_path, f"g{i}") for i in range(3))
    beats = s.requests_to("/hb")
    assert beats and all(b.headers["authorization"] == "Bearer tok" for b in beats)
    marks = [b.json()["completed_units"] for b in beats]
    assert marks == sorted(marks) and marks[-1] == 3
    assert beats[-1].json() == {"completed_units": 3, "total_units": 3, "stage": "finished"}


async def test_misbehaving_servers_fail_only_their_episode_or_feed(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/feed"] = respond(
        200,
        rss(
            [
                ("good", s.url("/good"), None),
                ("hang", s.url("/hang"), None),  # transport read timeout (0.3 s)
                ("drip", s.url("/drip"), None),  # beats the read timeout; the episode budget (1.5 s) cuts it
                ("err", s.url("/err"), None),
                ("huge", s.url("/huge"), None),  # claims 2 GB
            ]
        ),
    )
    s.routes["/malformed"] = respond(200, MALFORMED_XML)
    s.routes["/laughs"] = respond(200, BILLION_LAUGHS)
    s.routes.update(
        {
            "/good": respond(200, b"G" * 1000),
            "/hang": hang_after_headers(),
            "/drip": drip(1000, 0.2),
            "/err": respond(500, b"boom"),
            "/huge": respond(200, b"x" * 100, content_length=2_000_000_000),
        }
    )
    feeds = ["--feed", s.url("/malformed"), "--feed", s.url("/feed"), "--feed", s.url("/laughs")]
    # Unbounded, /hang and /drip would never end (drip alone: 200 s): the bound is the deadlines' proof.
    with trio.fail_after(15):
        result = await run_runner(
            ["run", *feeds, "--workers", "5", "--episode-budget-seconds", "1.5", *FAST],
            runner_env(tmp_path),
            cwd=tmp_path,
        )

    assert result.returncode == EXIT_OK, result.stderr
    reasons = {e["guid"]: e["reason"] for e in result.of("episode_failed")}
    assert set(reasons) == {"hang", "drip", "err", "huge"}
    assert "ReadTimeout" in reasons["hang"]
    assert "budget" in reasons["drip"]
    assert "HTTP 500" in reasons["err"]
    assert "2000000000" in reasons["huge"]
    feed_failures = {e["feed_url"]: e["reason"] for e in result.of("feed_failed")}
    assert "malformed XML" in feed_failures[s.url("/malformed")]
    assert "hostile XML" in feed_failures[s.url("/laughs")]
    m = manifest(tmp_path)
    assert m["counts"]["done"] == 1 and m["counts"]["failed"] == 4
    assert len(m["feeds"]["failed"]) == 2
    assert complete(tmp_path, "good") and not complete(tmp_path, "drip")


async def test_job_budget_from_environment_ends_run_with_exit_11(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([("g0", s.url("/hang"), None), ("g1", s.url("/hang"), None)]))
    s.routes["/hang"] = hang_after_headers()
    env = runner_env(tmp_path, PODCAST_PROCESSING_LOOP_BUDGET_SECONDS="1")
    result = await run_runner(["run", "--feed", s.url("/feed"), "--read-timeout-seconds", "60"], env, cwd=tmp_path)
    assert result.returncode == EXIT_TIME_BUDGET_EXHAUSTED
    m = manifest(tmp_path)
    assert m["reason"] == "time_budget_exhausted" and m["processing_loop_budget_s"] == 1.0
    assert m["counts"]["cancelled"] == 2


async def test_job_budget_from_config_file_and_flag(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([("g0", s.url("/hang"), None)]))
    s.routes["/hang"] = hang_after_headers()
    cfg = tmp_path / "runner.toml"
    cfg.write_text("processing_loop_budget_seconds = 0.5\nread_timeout_seconds = 60\n")
    # env says "disabled", but the flag wins; the file would say 0.5
    env = runner_env(tmp_path, PODCAST_PROCESSING_LOOP_BUDGET_SECONDS="0")
    result = await run_runner(
        ["run", "--feed", s.url("/feed"), "--config", str(cfg), "--processing-loop-budget-seconds", "0.7"],
        env,
        cwd=tmp_path,
    )
    assert result.returncode == EXIT_TIME_BUDGET_EXHAUSTED
    assert manifest(tmp_path)["processing_loop_budget_s"] == 0.7
    result = await run_runner(
        ["run", "--feed", s.url("/feed"), "--config", str(cfg), "--job-id", "job-2"],
        runner_env(tmp_path),
        cwd=tmp_path,
    )
    assert result.returncode == EXIT_TIME_BUDGET_EXHAUSTED
    assert manifest(tmp_path, "job-2")["processing_loop_budget_s"] == 0.5


async def test_cost_cap_exit_10(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url(f"/a{i}"), "60:00") for i in range(5)]))
    for i in range(5):
        s.routes[f"/a{i}"] = respond(200, b"A" * 100)
    s.routes["/transcribe"] = json_answer({"text": "t"})
    args = ["run", "--feed", s.url("/feed"), "--transcribe-url", s.url("/transcribe")]
    args += ["--transcribe-usd-per-audio-minute", "0.05", "--cost-cap-usd", "6.00", "--workers", "1", *FAST]
    result = await run_runner(args, runner_env(tmp_path), cwd=tmp_path)
    assert result.returncode == EXIT_BUDGET_EXHAUSTED
    m = manifest(tmp_path)
    assert (m["reason"], m["spend_usd"], m["counts"]["done"]) == ("budget_exhausted", 6.0, 2)
    assert len(s.requests_to("/transcribe")) == 2


async def test_killed_mid_write_rerun_redoes_only_the_unfinished(
    http_server: HttpServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """ADR-150 D4: kill -9 mid-episode, resubmit: finished episodes are skipped, the torn one redone."""
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url(f"/a{i}"), None) for i in range(3)]))
    s.routes["/a0"] = respond(200, b"0" * 1000)
    s.routes["/a1"] = respond(200, b"1" * 1000)
    s.routes["/a2"] = drip(1000, 0.05, after=b"2" * 500)  # half an enclosure, then trickles
    args = ["run", "--feed", s.url("/feed"), "--workers", "1", *FAST]
    with trio.fail_after(15):
        live = await spawn_runner(nursery, args, runner_env(tmp_path), cwd=tmp_path)
        await live.wait_for_event("episode_done", 2)
        await s.wait_for_requests("/a2")
        live.process.send_signal(signal.SIGKILL)
        await live.process.wait()
    staging_root = tmp_path / "corpus" / ".tmp"
    [staged] = staging_root.iterdir()  # the torn episode's staging directory, left behind by the kill
    assert staged.name.startswith("job-1.") and f".pid-{live.process.pid}." in staged.name  # it names its owner
    assert not complete(tmp_path, "g2")
    # Beside it: a directory in the old format (no owner in its name) and one whose owner is alive (this process).
    (staging_root / "job-0-0123456789ab").mkdir()
    me = read_own_identity()
    assert me is not None
    alive = staging_root / staging_name("job-elsewhere", me)
    alive.mkdir()

    s.routes["/a2"] = respond(200, b"2" * 1000)
    result = await run_runner([*args, "--job-id", "job-2"], runner_env(tmp_path), cwd=tmp_path)
    assert result.returncode == EXIT_OK, result.stderr
    # The killed run's directory went; the one of a live run and the one that names no owner stayed.
    assert sorted(p.name for p in staging_root.iterdir()) == sorted(["job-0-0123456789ab", alive.name])
    assert f"removed staging directory {staged.name}" in result.stderr
    assert f"kept staging directory {alive.name}" in result.stderr
    assert [e["guid"] for e in result.of("episode_skipped")] == ["g0", "g1"]
    assert [e["guid"] for e in result.of("episode_done")] == ["g2"]
    assert len(s.requests_to("/a0")) == len(s.requests_to("/a1")) == 1
    audio = tmp_path / "corpus" / "episodes" / episode_key("g2") / "audio.bin"
    assert audio.read_bytes() == b"2" * 1000


async def test_sigterm_ends_hung_workers_and_process_quickly(
    http_server: HttpServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The incident: nothing may keep running after the run is told to stop."""
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url("/hang"), None) for i in range(3)]))
    s.routes["/hang"] = hang_after_headers()
    args = ["run", "--feed", s.url("/feed"), "--workers", "3", "--read-timeout-seconds", "600"]
    with trio.fail_after(15):
        live = await spawn_runner(nursery, args, runner_env(tmp_path), cwd=tmp_path)
        await s.wait_for_requests("/hang", 3)
        live.process.send_signal(signal.SIGTERM)
        with trio.fail_after(5):
            await live.drain()
            code = await live.process.wait()
    assert code == EXIT_TERMINATED  # its own code for a polite kill, which the kinds resubmit (ADR 0014)
    assert live.events[-1]["event"] == "run_finished" and live.events[-1]["reason"] == "terminated"
    assert manifest(tmp_path)["counts"]["cancelled"] == 3


async def test_dead_heartbeat_endpoint_changes_nothing(
    http_server: HttpServer, tmp_path: Path, closed_port_url: str
) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url(f"/a{i}"), None) for i in range(3)]))
    for i in range(3):
        s.routes[f"/a{i}"] = respond(200, b"A" * 100)
    s.routes["/hb-hang"] = hang_after_headers()
    args = ["run", "--feed", s.url("/feed"), *FAST, "--heartbeat-timeout-seconds", "0.3"]
    for job, url in (("job-dead", closed_port_url), ("job-hang", s.url("/hb-hang"))):
        env = runner_env(tmp_path / job, PODCAST_JOB_HEARTBEAT_URL=url, PODCAST_JOB_TOKEN="t")
        (tmp_path / job).mkdir()
        result = await run_runner([*args, "--job-id", job], env, cwd=tmp_path / job, limit_s=10)
        assert result.returncode == EXIT_OK, result.stderr
        assert len(result.of("episode_done")) == 3
        assert "heartbeat to" in result.stderr


async def test_enrich_indexes_only_complete_episodes(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([("g0", s.url("/a0"), "1:00"), ("g1", s.url("/a1"), None)]))
    s.routes["/a0"] = respond(200, b"0")
    s.routes["/a1"] = respond(200, b"1")
    assert (
        await run_runner(["run", "--feed", s.url("/feed"), *FAST], runner_env(tmp_path), cwd=tmp_path)
    ).returncode == 0
    # a torn episode (renamed, marker never written) must not be indexed
    (tmp_path / "corpus" / "episodes" / episode_key("g1") / "COMPLETE").unlink()
    result = await run_runner(["enrich", "--job-id", "enrich-1"], runner_env(tmp_path), cwd=tmp_path)
    assert result.returncode == EXIT_OK, result.stderr
    index = json.loads((tmp_path / "corpus" / "index.json").read_text())
    assert [e["guid"] for e in index["episodes"]] == ["g0"]
    assert index["feeds"] == [{"feed_url": s.url("/feed"), "episodes": [episode_key("g0")]}]
    assert manifest(tmp_path, "enrich-1")["kind"] == "enrich"


async def test_usage_errors_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("procesing_loop_budget_seconds = 5\n")  # typo: unknown keys are errors
    for args in (
        ["run"],
        ["run", "--feed", "ftp://x"],
        ["run", "--feed", "http://x", "--config", str(bad)],
        ["run", "--feed", "http://x", "--max-episodes", "-1"],
    ):
        result = await run_runner(args, runner_env(tmp_path), cwd=tmp_path)
        assert result.returncode == EXIT_USAGE, (args, result.stderr)


async def test_a_run_whose_every_feed_failed_exits_3_not_0(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/malformed"] = respond(200, MALFORMED_XML)
    s.routes["/err"] = respond(500, b"down")
    result = await run_runner(
        ["run", "--feed", s.url("/malformed"), "--feed", s.url("/err"), *FAST], runner_env(tmp_path), cwd=tmp_path
    )
    assert result.returncode == EXIT_ALL_FEEDS_FAILED, result.stderr
    assert manifest(tmp_path)["reason"] == "all_feeds_failed"
    assert result.of("run_finished")[0]["reason"] == "all_feeds_failed"


async def test_every_feed_unreachable_or_overloaded_exits_75_try_again_later(
    http_server: HttpServer, tmp_path: Path, closed_port_url: str
) -> None:
    """Nothing was wrong with the feeds themselves: the supervisor may resubmit the job (EX_TEMPFAIL)."""
    s = http_server
    s.routes["/503"] = respond(503, b"overloaded")
    s.routes["/429"] = respond(429, b"slow down")
    s.routes["/hang"] = hang_after_headers()  # read timeout (0.3 s)
    feeds = [s.url("/503"), s.url("/429"), s.url("/hang"), closed_port_url]
    result = await run_runner(
        ["run", *(arg for url in feeds for arg in ("--feed", url)), *FAST], runner_env(tmp_path), cwd=tmp_path
    )
    assert result.returncode == EXIT_TRANSIENT == 75, result.stderr
    m = manifest(tmp_path)
    assert (m["reason"], m["exit_code"]) == ("all_feeds_unavailable", 75)
    assert [f["feed_url"] for f in m["feeds"]["failed"]] == feeds
    assert all(f["transient"] for f in m["feeds"]["failed"]), m["feeds"]["failed"]
    assert [e["transient"] for e in result.of("feed_failed")] == [True] * 4
    assert result.of("run_finished")[0]["exit_code"] == 75


async def test_one_feed_failed_for_its_content_keeps_exit_3(
    http_server: HttpServer, tmp_path: Path, closed_port_url: str
) -> None:
    """A 404 is the feed's answer, not a passing trouble: trying again later would change nothing."""
    s = http_server
    s.routes["/503"] = respond(503, b"overloaded")
    s.routes["/gone"] = respond(404, b"no such feed")
    feeds = ["--feed", s.url("/503"), "--feed", closed_port_url, "--feed", s.url("/gone")]
    # Every answer here is immediate: a read timeout that a loaded machine can miss would turn the 404 into a
    # passing trouble (exit 75), so this one is generous (the last flag wins).
    args = ["run", *feeds, *FAST, "--read-timeout-seconds", "10"]
    result = await run_runner(args, runner_env(tmp_path), cwd=tmp_path)
    assert result.returncode == EXIT_ALL_FEEDS_FAILED, result.stderr
    m = manifest(tmp_path)
    assert m["reason"] == "all_feeds_failed"
    assert [f["transient"] for f in m["feeds"]["failed"]] == [True, True, False]


async def test_an_episode_that_kills_the_process_is_poisoned_after_n_kills(
    http_server: HttpServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """ADR-150 D4 hazard: an episode fatal to the whole process must not loop forever across resubmissions.

    The attempt is counted before the work, so a SIGKILL mid-episode (as an OOM kill would be) still counts.
    """
    s = http_server
    s.routes["/feed"] = respond(200, rss([("fatal", s.url("/fatal"), None), ("fine", s.url("/fine"), None)]))
    s.routes["/fatal"] = hang_after_headers()
    s.routes["/fine"] = respond(200, b"F" * 100)
    args = ["run", "--feed", s.url("/feed"), "--workers", "1", "--poison-threshold", "2", *FAST]
    for attempt in (1, 2):
        with trio.fail_after(15):
            live = await spawn_runner(
                nursery, [*args, "--read-timeout-seconds", "600"], runner_env(tmp_path), cwd=tmp_path
            )
            await s.wait_for_requests("/fatal", attempt)
            live.process.send_signal(signal.SIGKILL)
            await live.process.wait()
    memo = json.loads((tmp_path / "corpus" / ".poison.json").read_text())
    assert memo[episode_key("fatal")]["failures"] == 2
    result = await run_runner([*args, "--job-id", "job-3"], runner_env(tmp_path), cwd=tmp_path)
    assert result.returncode == EXIT_OK, result.stderr
    skipped = {e["guid"]: e["reason"] for e in result.of("episode_skipped")}
    assert skipped == {"fatal": "poisoned"}
    assert [e["guid"] for e in result.of("episode_done")] == ["fine"]
    assert len(s.requests_to("/fatal")) == 2  # never tried a third time


async def test_every_line_of_a_jobs_output_is_one_json_object_its_warnings_too(
    tmp_path: Path, closed_port_url: str
) -> None:
    """A feed that cannot be reached made a plain-text ``WARNING pipeline_runner._run: ...`` line among the
    JSON events of the job's log. Now the log is JSON on stderr, shaped like an event."""
    result = await run_runner(["run", "--feed", closed_port_url, *FAST], runner_env(tmp_path), cwd=tmp_path)
    assert result.returncode == EXIT_TRANSIENT, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every stderr line is JSON
    warned = [line for line in lines if line["level"] == "warning" and line["logger"] == "pipeline_runner._run"]
    assert warned and closed_port_url.split("//")[1] in warned[0]["message"]
    assert {(line["event"], line["job_id"]) for line in lines} == {("log", "job-1")}
    assert all(line["ts"].endswith("Z") for line in lines)


def test_python_warnings_and_tracebacks_are_json_lines_too(capsys: pytest.CaptureFixture[str]) -> None:
    import logging
    import warnings

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging("INFO", "job-9")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("an old way", DeprecationWarning, stacklevel=1)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("pipeline_runner").exception("crashed")
    finally:
        logging.captureWarnings(False)
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    warned, crashed = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert (warned["logger"], warned["level"], warned["job_id"]) == ("py.warnings", "warning", "job-9")
    assert "an old way" in warned["message"]
    assert crashed["message"] == "crashed" and "ValueError: boom" in crashed["exception"]
