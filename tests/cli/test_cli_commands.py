"""The client commands of the CLI against a live server: ``main([...])`` runs in a thread while the server runs on
the test's event loop."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from api_support import API_TOKEN, Live, MakeLive, wait_for_job, wait_running, wait_terminal
from tcp_proxy import CutAfterRequests, LossyProxy  # type: ignore[import-not-found]

from supervisor.cli import EXIT_CONFIG, EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, main
from supervisor.domain import PageRequest

CLI_LIMIT_S = 20.0


@dataclasses.dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def cli(url: str, *argv: str, token: str | None = None, env: dict[str, str] | None = None) -> Ran:
    environ = {"PODCAST_JOB_URL": url} | ({"PODCAST_JOB_API_TOKEN": token} if token else {}) | (env or {})
    out, err = io.StringIO(), io.StringIO()
    run = functools.partial(main, list(argv), environ=environ, stdout=out, stderr=err)
    with trio.fail_after(CLI_LIMIT_S):
        code = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    return Ran(code, out.getvalue(), err.getvalue())


@pytest.fixture
async def live(make_live: MakeLive) -> Live:
    return await make_live()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_show_lists_each_earlier_attempt_of_a_resubmitted_job(live: Live) -> None:
    job_id = (await cli(live.url, "enqueue", "flaky", "--json")).json()["job_id"]
    await wait_terminal(live.supervisor, job_id)
    shown = await cli(live.url, "show", job_id)
    assert shown.code == EXIT_OK, shown.err
    lines = shown.out.splitlines()
    fields = dict(line.split(None, 1) for line in lines if not line.startswith(" "))
    assert (fields["attempts"], fields["max_attempts"], fields["history"]) == ("2", "2", "1 earlier attempt(s)")
    [attempt] = [line for line in lines if line.startswith("  #")]
    assert attempt.startswith("  #1  ") and attempt.endswith("failed/exit_code_75 (exit 75)")


async def test_enqueue_list_show_cancel(live: Live) -> None:
    ran = await cli(live.url, "enqueue", "sleep", "-p", "seconds=30", "--json")
    assert ran.code == EXIT_OK, ran.err
    job_id = ran.json()["job_id"]
    assert ran.json()["status"] == "queued"  # answered once stored; the drainer spawns it
    await wait_running(live.supervisor, job_id)

    table = await cli(live.url, "jobs")
    assert table.code == EXIT_OK
    header, row = table.out.splitlines()
    assert header.split() == ["JOB_ID", "KIND", "STATUS", "POS", "CREATED", "ENDED", "PROGRESS", "REASON"]
    assert row.split()[:3] == [job_id, "sleep", "running"]

    running = await cli(live.url, "jobs", "--status", "running", "--json")
    assert [j["job_id"] for j in running.json()["jobs"]] == [job_id]
    assert (await cli(live.url, "jobs", "--status", "failed", "--json")).json() == {"jobs": [], "next_cursor": None}

    shown = await cli(live.url, "show", job_id)
    assert shown.code == EXIT_OK
    lines = dict(line.split(None, 1) for line in shown.out.splitlines())
    assert (lines["job_id"], lines["status"], lines["params"]) == (job_id, "running", '{"seconds": 30.0}')
    assert (await cli(live.url, "show", job_id, "--json")).json()["job_id"] == job_id

    cancelled = await cli(live.url, "cancel", job_id)
    assert cancelled.code == EXIT_OK
    assert cancelled.out.strip() == f"{job_id}  running; cancel requested, stopping"
    assert (await wait_terminal(live.supervisor, job_id)).status == "cancelled"
    again = await cli(live.url, "cancel", job_id, "--json")
    assert (again.code, again.json()["status"]) == (EXIT_OK, "cancelled")


async def test_params_are_sent_as_strings_and_typed_by_the_kind(live: Live) -> None:
    paused = await cli(live.url, "pause")
    assert (paused.code, paused.out.strip()) == (EXIT_OK, "queue paused: 0 running (max 2), 0 queued")
    ran = await cli(live.url, "enqueue", "typed", "-p", "n=3", "-p", "ratio=0.5", "-p", "flag=true", "-p", "name=a=b")
    assert ran.code == EXIT_OK, ran.err
    job_id, rest = ran.out.split(None, 1)
    assert rest.strip() == "queued (position 1)"
    params = (await cli(live.url, "show", job_id, "--json")).json()["params"]
    assert params == {"n": 3, "ratio": 0.5, "flag": True, "name": "a=b"}

    queue = await cli(live.url, "queue", "--json")
    counts = {k: queue.json()[k] for k in ("paused", "running", "queued", "max_concurrent")}
    assert counts == {"paused": True, "running": 0, "queued": 1, "max_concurrent": 2}
    resumed = await cli(live.url, "resume")
    assert resumed.code == EXIT_OK
    assert resumed.out.startswith("queue active:")
    await wait_terminal(live.supervisor, job_id)


async def test_coalesced_enqueue_says_so(live: Live) -> None:
    await cli(live.url, "pause")
    first = await cli(live.url, "enqueue", "tidy")
    second = await cli(live.url, "enqueue", "tidy")
    assert second.out.split()[0] == first.out.split()[0]
    assert "coalesced" in second.out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["enqueue", "nope"], "unknown kind 'nope'"),
        (["enqueue", "sleep"], "field params.seconds"),
        (["enqueue", "sleep", "-p", "seconds=soon"], "field params.seconds"),
        (["enqueue", "sleep", "-p", "seconds=1", "-p", "colour=red"], "field params.colour"),
        (["show", "nope"], "no job with id 'nope'"),
        (["cancel", "nope"], "HTTP 404"),
        (["logs", "nope"], "not_found"),
    ],
)
async def test_server_errors_exit_non_zero_with_the_server_message(live: Live, argv: list[str], expected: str) -> None:
    ran = await cli(live.url, *argv)
    assert ran.code == EXIT_ERROR
    assert ran.out == ""
    assert ran.err.startswith("error: ")
    assert expected in ran.err


async def test_a_repeated_param_is_a_usage_error(live: Live) -> None:
    ran = await cli(live.url, "enqueue", "sleep", "-p", "seconds=1", "-p", "seconds=2")
    assert ran.code == 2
    assert "seconds given twice" in ran.err


async def test_a_param_without_equals_is_a_usage_error(live: Live) -> None:
    with pytest.raises(SystemExit) as exc:
        await cli(live.url, "enqueue", "sleep", "-p", "seconds")
    assert exc.value.code == 2


async def test_reconcile_prints_each_running_row(live: Live) -> None:
    job_id = (await cli(live.url, "enqueue", "sleep", "-p", "seconds=30", "--json")).json()["job_id"]
    await wait_running(live.supervisor, job_id)
    ran = await cli(live.url, "reconcile")
    assert ran.code == EXIT_OK
    lines = ran.out.splitlines()
    assert lines[0] == "reconciled: 0 row(s) updated"
    assert lines[2].split() == [job_id, "keep", "alive", "alive", "False"]
    report = (await cli(live.url, "reconcile", "--json")).json()
    assert report["updated"] == 0 and report["details"][0]["job_id"] == job_id


async def test_logs_whole_and_tail(live: Live) -> None:
    job_id = (await cli(live.url, "enqueue", "echo", "-p", "text=hello world", "--json")).json()["job_id"]
    await wait_terminal(live.supervisor, job_id)
    assert (await cli(live.url, "logs", job_id)).out == "hello world\n"
    assert (await cli(live.url, "logs", job_id, "--tail-bytes", "6")).out == "world\n"


async def test_logs_follow_prints_everything_once_and_ends_with_the_job(live: Live) -> None:
    job_id = (await cli(live.url, "enqueue", "chatty", "-p", "lines=3", "--json")).json()["job_id"]
    # Start following while the job is still writing.
    await wait_for_job(live.supervisor, job_id, lambda job: job.status == "running")
    ran = await cli(live.url, "logs", job_id, "--follow")
    assert ran.code == EXIT_OK
    assert ran.out == "line 0\nline 1\nline 2\n"
    assert ran.err.strip() == f"job {job_id} is succeeded"
    assert (await live.supervisor.get(job_id)).status == "succeeded"


async def test_logs_follow_with_tail_starts_at_the_tail(live: Live) -> None:
    job_id = (await cli(live.url, "enqueue", "echo", "-p", "text=abcdef", "--json")).json()["job_id"]
    await wait_terminal(live.supervisor, job_id)
    ran = await cli(live.url, "logs", job_id, "--follow", "--tail-bytes", "3")
    assert (ran.code, ran.out) == (EXIT_OK, "ef\n")


async def test_unreachable_server_is_a_clear_message() -> None:
    url = closed_port_url()
    ran = await cli(url, "jobs")
    assert ran.code == EXIT_UNREACHABLE
    assert f"cannot reach the supervisor at {url}" in ran.err
    assert "PODCAST_JOB_URL" in ran.err


async def test_a_malformed_url_is_a_config_error() -> None:
    ran = await cli("localhost:8000", "jobs")
    assert ran.code == EXIT_CONFIG
    assert "PODCAST_JOB_URL" in ran.err


async def test_the_api_token_comes_from_the_environment(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN)
    refused = await cli(live.url, "jobs")
    assert refused.code == EXIT_ERROR
    assert "HTTP 401" in refused.err and "PODCAST_JOB_API_TOKEN" in refused.err
    wrong = await cli(live.url, "jobs", token="not-it")
    assert wrong.code == EXIT_ERROR
    allowed = await cli(live.url, "jobs", "--json", token=API_TOKEN)
    assert (allowed.code, allowed.json()) == (EXIT_OK, {"jobs": [], "next_cursor": None})


async def test_the_api_token_can_come_from_a_file(make_live: MakeLive, tmp_path: Path) -> None:
    live = await make_live(api_token=API_TOKEN)
    token_file = tmp_path / "cli-token"
    token_file.write_text(API_TOKEN + "\n")
    allowed = await cli(live.url, "jobs", "--json", env={"PODCAST_JOB_API_TOKEN_FILE": str(token_file)})
    assert (allowed.code, allowed.json()) == (EXIT_OK, {"jobs": [], "next_cursor": None})
    missing = await cli(live.url, "jobs", env={"PODCAST_JOB_API_TOKEN_FILE": str(tmp_path / "nope")})
    assert missing.code == EXIT_CONFIG and "PODCAST_JOB_API_TOKEN_FILE" in missing.err


async def test_enqueue_from_an_ndjson_file_in_batches(live: Live, tmp_path: Path) -> None:
    await live.supervisor.pause()
    lines = [json.dumps({"kind": "sleep", "params": {"seconds": 1}}) for _ in range(1001)]
    source = tmp_path / "jobs.ndjson"
    source.write_text("\n".join(lines[:500]) + "\n\n" + "\n".join(lines[500:]) + "\n")  # a blank line is skipped
    ran = await cli(live.url, "enqueue", "--from-file", str(source), "--json")
    assert ran.code == EXIT_OK, ran.err
    answers = ran.json()["jobs"]
    assert len(answers) == 1001 and len({a["job_id"] for a in answers}) == 1001  # two batches: 1000 + 1
    assert (await live.supervisor.queue_state()).queued == 1001

    bad = tmp_path / "bad.ndjson"
    bad.write_text(lines[0] + "\n" + json.dumps({"kind": "sleep", "params": {"seconds": "later"}}) + "\n")
    refused = await cli(live.url, "enqueue", "--from-file", str(bad))
    assert refused.code == EXIT_ERROR
    assert "line 2:" in refused.err and "jobs[1].params.seconds" in refused.err
    assert (await live.supervisor.queue_state()).queued == 1001  # all or nothing

    garbage = tmp_path / "garbage.ndjson"
    garbage.write_text(lines[0] + "\n{not json\n")
    usage = await cli(live.url, "enqueue", "--from-file", str(garbage))
    assert usage.code == EXIT_USAGE and "line 2" in usage.err
    both = await cli(live.url, "enqueue", "sleep", "--from-file", str(source))
    assert both.code == EXIT_USAGE


async def test_retry_enqueues_a_finished_job_again_and_show_links_both_ways(live: Live) -> None:
    old = (await cli(live.url, "enqueue", "fail", "--json")).json()["job_id"]
    assert (await wait_terminal(live.supervisor, old)).status == "failed"
    await cli(live.url, "pause")
    ran = await cli(live.url, "retry", old)
    assert ran.code == EXIT_OK, ran.err
    new, rest = ran.out.split(None, 1)
    assert rest.strip() == f"queued (position 1), a retry of {old}"
    new_fields = dict(line.split(None, 1) for line in (await cli(live.url, "show", new)).out.splitlines())
    old_fields = dict(line.split(None, 1) for line in (await cli(live.url, "show", old)).out.splitlines())
    assert (new_fields["kind"], new_fields["retry_of"], new_fields["retried_by"]) == ("fail", old, "-")
    assert (old_fields["retry_of"], old_fields["retried_by"]) == ("-", new)
    assert (await cli(live.url, "show", old, "--json")).json()["retried_by"] == [new]


async def test_retry_of_a_job_that_has_not_finished_says_why(live: Live) -> None:
    await cli(live.url, "pause")
    queued = (await cli(live.url, "enqueue", "sleep", "-p", "seconds=30", "--json")).json()["job_id"]
    ran = await cli(live.url, "retry", queued)
    assert ran.code == EXIT_ERROR
    assert f"job {queued} is queued: only a finished job can be retried" in ran.err
    assert "HTTP 409, conflict, field job_id" in ran.err


async def test_prune_dry_run_lists_what_would_go_and_prune_removes_it(make_live: MakeLive) -> None:
    live = await make_live(retention_days=None, retention_max_jobs=1)
    ids = []
    for _ in range(3):
        # Enqueued without an Idempotency-Key: the CLI's own enqueue keys each job, and a live key's job is kept.
        job_id = (await live.supervisor.enqueue("fail", {})).job.job_id
        await wait_terminal(live.supervisor, job_id)  # one at a time: they end in this order
        ids.append(job_id)
    dry = await cli(live.url, "prune", "--dry-run")
    assert dry.code == EXIT_OK, dry.err
    header, *rows, summary = dry.out.splitlines()
    assert header.split() == ["JOB_ID", "KIND", "STATUS", "ENDED"]
    assert [row.split()[:3] for row in rows] == [[job_id, "fail", "failed"] for job_id in ids[:2]]
    assert summary == "2 finished job(s) would go: past the newest 1 finished"
    assert (await cli(live.url, "show", ids[0])).code == EXIT_OK  # a dry run removes nothing
    ran = await cli(live.url, "prune")
    assert ran.code == EXIT_OK
    assert ran.out.strip() == "pruned 2 finished job(s) with their logs: past the newest 1 finished"
    gone = await cli(live.url, "show", ids[0])
    assert gone.code == EXIT_ERROR and "HTTP 404" in gone.err
    assert (await cli(live.url, "show", ids[2])).code == EXIT_OK
    again = await cli(live.url, "prune", "--json")
    assert (again.json()["pruned"], again.json()["jobs"]) == (0, [])


async def test_prune_says_when_retention_is_off(make_live: MakeLive) -> None:
    live = await make_live(retention_days=None, retention_max_jobs=None)
    ran = await cli(live.url, "prune", "--dry-run")
    assert ran.code == EXIT_OK
    assert ran.out.strip().startswith("retention is off")


async def test_enqueue_with_an_idempotency_key_twice_makes_one_job(live: Live) -> None:
    await cli(live.url, "pause")
    first = await cli(live.url, "enqueue", "sleep", "-p", "seconds=30", "--idempotency-key", "nightly-7", "--json")
    again = await cli(live.url, "enqueue", "sleep", "-p", "seconds=30", "--idempotency-key", "nightly-7", "--json")
    assert first.code == again.code == EXIT_OK
    assert again.json() == first.json()
    other = await cli(live.url, "enqueue", "sleep", "-p", "seconds=31", "--idempotency-key", "nightly-7")
    assert other.code == EXIT_ERROR and "idempotency_key_reused, field Idempotency-Key" in other.err
    shown = dict(line.split(None, 1) for line in (await cli(live.url, "show", first.json()["job_id"])).out.splitlines())
    assert shown["idempotency_key"] == "nightly-7"
    listed = await cli(live.url, "jobs", "--idempotency-key", "nightly-7", "--json")
    assert [j["job_id"] for j in listed.json()["jobs"]] == [first.json()["job_id"]]


async def test_an_idempotency_key_that_is_no_key_is_a_usage_error(live: Live) -> None:
    for bad in ("", " padded", "x" * 256, "caf\u00e9"):
        with pytest.raises(SystemExit) as exc:  # argparse's usage error, which names the option
            await cli(live.url, "enqueue", "tidy", "--idempotency-key", bad)
        assert exc.value.code == EXIT_USAGE, bad
    rows, _ = await live.supervisor.list_jobs()
    assert rows == []


async def test_enqueue_sends_its_request_again_after_a_lost_answer_and_makes_one_job(
    live: Live, nursery: trio.Nursery
) -> None:
    """No --idempotency-key: the CLI keys the invocation itself, so that its own retry replays, never duplicates."""
    await cli(live.url, "pause")
    host, port = live.url.removeprefix("http://").rsplit(":", 1)
    proxy = LossyProxy(host, int(port), first=("answer", "request"))
    await nursery.start(proxy.run)
    ran = await cli(f"http://127.0.0.1:{proxy.port}", "enqueue", "sleep", "-p", "seconds=30", "--json")
    assert ran.code == EXIT_OK, ran.err
    assert (proxy.lost_answers, proxy.lost_requests) == (1, 1)
    assert ran.err.count("sending it again") == 2 and "Idempotency-Key cli-" in ran.err
    rows, _ = await live.supervisor.list_jobs()
    assert [row.job_id for row in rows] == [ran.json()["job_id"]]
    assert rows[0].idempotency_key is not None and rows[0].idempotency_key.startswith("cli-")


async def test_queue_says_what_holds_the_queue_as_of_the_last_sweep(live: Live) -> None:
    await cli(live.url, "pause")
    await live.supervisor.sweeper.sweep()  # the queue's watch looks at every sweep
    await live.supervisor.enqueue("sleep", {"seconds": 1})
    shown = await cli(live.url, "queue")
    assert shown.code == EXIT_OK
    first, kinds, held = shown.out.splitlines()
    assert first.startswith("queue paused:") and held.startswith("held by pause_operator since ")
    assert kinds == "by kind (running[/max_running] +queued): sleep 0 +1"


async def test_more_waits_than_event_stream_slots_each_exit_with_their_jobs_outcome(make_live: MakeLive) -> None:
    """With every stream slot taken, `wait` exited 4 "cannot reach the supervisor" -- a busy server reported
    as a dead one. A full stream is busy: each `wait` says so, learns its job's outcome from the rows meanwhile, and
    exits with it."""
    live = await make_live(events_max_clients=1, max_concurrent=4)
    jobs = [(await live.supervisor.enqueue("sleep", {"seconds": 1})).job.job_id for _ in range(4)]
    waits: list[Ran] = []

    async def wait(job_id: str) -> None:
        waits.append(await cli(live.url, "wait", job_id))

    async with trio.open_nursery() as nursery:
        for job_id in jobs:
            nursery.start_soon(wait, job_id)
    assert [ran.code for ran in waits] == [EXIT_OK] * 4, [ran.err for ran in waits]
    assert not any("cannot reach" in ran.err for ran in waits)
    assert any("busy" in ran.err and "too_many_streams" in ran.err for ran in waits), [r.err for r in waits]


async def test_logs_follow_prints_every_attempt_of_a_resubmitted_job_whole_and_in_order(
    live: Live, tmp_path: Path
) -> None:
    """The follower kept one byte offset across attempts while the API served the current attempt's log,
    so the second attempt was printed from the wrong place (or not at all)."""
    job_id = (await live.supervisor.enqueue("twice", {"marker": str(tmp_path / "marker")})).job.job_id
    followed = await cli(live.url, "logs", job_id, "--follow")
    assert followed.code == EXIT_OK, followed.err
    expected = [f"attempt {a} line {i}" for a in (1, 2) for i in range(40)]
    assert followed.out.splitlines() == expected
    assert f"job {job_id}: attempt 2" in followed.err and "succeeded" in followed.err
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as client:
        first = await client.get(f"/api/jobs/{job_id}/log", params={"attempt": 1, "offset": 0}, timeout=10)
        assert first.text.splitlines() == expected[:40]  # an earlier attempt's log, whole
        never = await client.get(f"/api/jobs/{job_id}/log", params={"attempt": 3}, timeout=10)
        assert never.status_code == 404 and never.json()["error"]["field"] == "attempt"



async def test_an_interrupted_enqueue_from_file_says_what_it_stored_and_its_rerun_stores_only_the_rest(
    live: Live, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """4,000 jobs in a file, the server gone after the first two batches: the CLI said only "cannot reach",
    and the obvious rerun stored all 4,000 again (a new key per invocation). Now a file's batches are keyed by its
    content: the rerun stores only what the first run did not."""
    await live.supervisor.pause()  # the jobs stay queued: only their rows are counted
    path = tmp_path / "jobs.ndjson"
    path.write_text("".join(json.dumps({"kind": "sleep", "params": {"seconds": i / 1000}}) + "\n" for i in range(2500)))
    host, port = live.url.removeprefix("http://").rsplit(":", 1)
    proxy = CutAfterRequests(host, int(port), marker=b"POST /api/jobs/batch", count=2)
    await nursery.start(proxy.run)
    first = await cli(f"http://127.0.0.1:{proxy.port}", "enqueue", "--from-file", str(path))
    assert first.code == EXIT_UNREACHABLE, first.err
    assert "batches 1-2 of 3 (2000 jobs, lines 1-2000) were stored" in first.err
    assert "run the same command again" in first.err
    again = await cli(live.url, "enqueue", "--from-file", str(path))
    assert again.code == EXIT_OK, again.err
    assert len(again.out.splitlines()) == 2500  # every job of the file, the stored ones replayed
    rows, cursor = [], None
    while True:
        page, cursor = await live.supervisor.list_jobs(PageRequest.parse(limit=1000, cursor=cursor))
        rows += page
        if cursor is None:
            break
    assert len(rows) == 2500  # none stored twice


async def test_jobs_filters_by_reason_param_time_and_host(live: Live) -> None:
    failed = (await live.supervisor.enqueue("fail", {})).job.job_id
    three = (await live.supervisor.enqueue("typed", {"n": 3, "ratio": 0.5, "flag": True, "name": "x"})).job.job_id
    four = (await live.supervisor.enqueue("typed", {"n": 4, "ratio": 0.5, "flag": False, "name": "x"})).job.job_id
    for job_id in (failed, three, four):
        await wait_terminal(live.supervisor, job_id)
    since = "2000-01-01T00:00:00Z"
    found = await cli(live.url, "jobs", "--json", "--reason", "exit_code_3", "--since", since)
    assert found.code == EXIT_OK, found.err
    assert [job["job_id"] for job in found.json()["jobs"]] == [failed]
    host = live.supervisor.config.host_id
    found = await cli(live.url, "jobs", "--json", "--param", "n=3", "--param", "flag=true", "--host", host)
    assert [job["job_id"] for job in found.json()["jobs"]] == [three]
    bad = await cli(live.url, "jobs", "--param", "n=three")
    assert bad.code == EXIT_USAGE and "--param n: param.n must be an int" in bad.err
    # Beyond the registry's limits: the caller's usage error (exit 2, one line naming the flag), never a server error.
    for verb in (("jobs",), ("retry", "--all", "--dry-run"), ("cancel", "--all", "--dry-run")):
        big = await cli(live.url, *verb, "--param", "n=9223372036854775808")
        assert (big.code, big.err.count("\n")) == (EXIT_USAGE, 1), big.err
        assert big.err.startswith("error: --param n: param.n must be an int from -9223372036854775808"), big.err
        for flag, when in (("--since", "0001-01-01T00:00:00+01:00"), ("--until", "9999-12-31T23:59:59-01:00")):
            early = await cli(live.url, *verb, flag, when)
            assert (early.code, early.err.count("\n")) == (EXIT_USAGE, 1), early.err
            assert early.err.startswith(f"error: {flag}: {flag[2:]} must be from 0001-01-01"), early.err
    usage = await cli(live.url, "jobs", "--param", "n")
    assert usage.code == EXIT_USAGE and "NAME=VALUE" in usage.err


async def test_retry_all_acts_on_the_dry_runs_jobs_once_and_asks_for_yes_above_the_threshold(live: Live) -> None:
    failed = [(await live.supervisor.enqueue("fail", {})).job.job_id for _ in range(3)]
    for job_id in failed:
        await wait_terminal(live.supervisor, job_id)
    dry = await cli(live.url, "retry", "--all", "--kind", "fail", "--status", "failed", "--dry-run")
    assert dry.code == EXIT_OK, dry.err
    assert dry.out.splitlines()[0] == "retry would act on 3 job(s):" and set(failed) <= set(dry.out.split())
    done = await cli(live.url, "retry", "--all", "--kind", "fail", "--status", "failed")
    assert done.code == EXIT_OK, done.err
    assert done.out.splitlines()[0] == "retry: 3 job(s): retried 3"
    rows, _ = await live.supervisor.list_jobs(PageRequest.parse(kind="fail"))
    assert sorted(row.retry_of for row in rows if row.retry_of) == sorted(failed)
    assert (await cli(live.url, "cancel")).code == EXIT_USAGE  # neither a job nor --all
    many = [(await live.supervisor.enqueue("sleep", {"seconds": 60})).job.job_id for _ in range(11)]
    refused = await cli(live.url, "cancel", "--all", "--kind", "sleep")  # no terminal to ask on: --yes is needed
    assert refused.code == EXIT_USAGE and "--yes" in refused.err
    cancelled = await cli(live.url, "cancel", "--all", "--kind", "sleep", "--yes", "--json")
    assert cancelled.code == EXIT_OK and cancelled.json()["count"] == 11
    for job_id in many:
        await wait_terminal(live.supervisor, job_id)


async def test_a_schedules_tick_makes_one_job_however_often_the_timer_fires(live: Live) -> None:
    tick = ("--schedule", "feed-a", "--every", "1h", "--tick", "2026-12-07T02:17:00Z")
    runs = [await cli(live.url, "enqueue", "sleep", "-p", "seconds=30", *tick, "--json") for _ in range(3)]
    assert [run.code for run in runs] == [EXIT_OK] * 3, runs[0].err
    assert len({run.json()["job_id"] for run in runs}) == 1  # three firings of one tick: one job
    job = await live.supervisor.get(runs[0].json()["job_id"])
    assert (job.schedule, job.schedule_every_s, job.idempotency_key) == (
        "feed-a",
        3600.0,
        "schedule/feed-a/2026-12-07T02:00:00Z",
    )
    # The next tick, with --if-idle, while the first still runs: skipped, exit 0, one line, no job.
    skipped = await cli(
        live.url, "enqueue", "sleep", "-p", "seconds=30", "--schedule", "feed-a", "--every", "1h",
        "--tick", "2026-12-07T03:05:00Z", "--if-idle",
    )  # fmt: skip
    assert skipped.code == EXIT_OK, skipped.err
    assert skipped.out.strip() == f"skipped: schedule feed-a has job {job.job_id} running (--if-idle)"
    rows, _ = await live.supervisor.list_jobs(PageRequest.parse(kind="sleep"))
    assert [row.job_id for row in rows] == [job.job_id]
    usage = await cli(live.url, "enqueue", "sleep", "-p", "seconds=1", "--schedule", "feed-a")
    assert usage.code == EXIT_USAGE and "--every" in usage.err
    await live.supervisor.cancel(job.job_id)
    await wait_terminal(live.supervisor, job.job_id)
