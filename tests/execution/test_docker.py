"""Docker mode against the real engine: what only containers have (labels, the engine's own restarts, exit codes
kept across supervisor restarts). The scenarios every mode shares are in test_core_contract.py."""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import subprocess
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from core_executors import IMAGE, DockerWorld, supervisors_in  # type: ignore[import-not-found]
from core_helpers import KINDS, container_of, kinds_file_with, pid_of, poll, serve_env, wait_running, wait_terminal  # type: ignore[import-not-found]
from structlog.testing import capture_logs

from supervisor import Config, JobStatus, Liveness, SqliteRegistry, Supervisor
from supervisor.domain import Job, PageRequest, parse_kind
from supervisor.execution import Executor, create_executor
from supervisor.execution import docker as docker_execution
from supervisor.execution.docker import LABEL_ATTEMPT, LABEL_BOOT, LABEL_JOB, LABEL_KIND
from supervisor.execution.shepherd import JOB_OOM_SCORE_ADJ
from supervisor.execution.subprocess import identify, probe
from supervisor.registry import NewJob

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_SCRIPT = REPO_ROOT / "scripts" / "docker-engine.sh"
ENGINE_WORK = Path(os.environ.get("ENGINE_WORK", "/tmp/podcast-docker-engine"))


def docker_mode(config: Config) -> Executor:
    """The executor `serve` builds for PODCAST_PIPELINE_EXEC_MODE=docker (default image, data dir bind-mounted)."""
    return create_executor(dataclasses.replace(config, exec_mode="docker"), base_env={})


@pytest.fixture
def world() -> DockerWorld:
    return DockerWorld()


@pytest.fixture
async def make(
    make_supervisor: Callable[..., Supervisor], world: DockerWorld
) -> AsyncIterator[Callable[..., Supervisor]]:
    async with supervisors_in(world, make_supervisor, docker_mode) as make_:
        yield make_


async def test_a_job_container_is_labelled_runs_with_init_and_gets_the_jobs_environment_only(
    make: Callable[..., Supervisor], world: DockerWorld
) -> None:
    sup = make(
        base_env={"PODCAST_JOB_API_TOKEN": "operator-secret", "PATH": "/usr/bin"}, heartbeat_base_url="http://127.0.0.1:9"
    )
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    # The label filter finds exactly this job's container, and the row records its id.
    found = await trio.to_thread.run_sync(world.containers, job)
    assert [c["Id"] for c in found] == [container_of(job)]
    info = await trio.to_thread.run_sync(world.client.inspect_container, container_of(job))
    labels = info["Config"]["Labels"]
    assert (labels[LABEL_JOB], labels[LABEL_BOOT], labels[LABEL_KIND]) == (job.job_id, sup.boot_id, "sleep")
    assert info["HostConfig"]["Init"] is True
    assert info["Config"]["Cmd"][0] == "python3"  # {python} is the image's interpreter
    env = dict(entry.split("=", 1) for entry in info["Config"]["Env"])
    assert env["PODCAST_JOB_ID"] == job.job_id and env["PODCAST_JOB_TOKEN"]
    assert env["PODCAST_JOB_DATA_DIR"] == str(sup.data_dir) == info["Config"]["WorkingDir"]
    assert env["PODCAST_JOB_HEARTBEAT_URL"] == f"http://127.0.0.1:9/api/jobs/{job.job_id}/heartbeat"
    assert "PODCAST_JOB_API_TOKEN" not in env and "operator-secret" not in str(info)
    assert [(m["Source"], m["Destination"]) for m in info["Mounts"]] == [(str(sup.data_dir), str(sup.data_dir))]
    assert pid_of(job) is None  # no pid is evidence in this mode

    await sup.cancel(job.job_id)
    ended = await wait_terminal(sup, job.job_id)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")

    async def removed() -> bool | None:  # finalized first, then the container is removed
        return not await trio.to_thread.run_sync(world.containers, job) or None

    await poll(removed)


async def test_output_is_copied_into_the_capped_log_and_a_missing_image_fails_only_its_job(
    make: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make(log_max_bytes=4096, max_concurrent=1)
    chatty = (await sup.enqueue("chatty", {"n": 100_000})).job
    done = await wait_terminal(sup, chatty.job_id)
    assert done.status is JobStatus.SUCCEEDED
    text = await sup.read_log(chatty.job_id)
    # The engine keeps the newest output (its own log rotates at the cap): the job's log is its last 4096 bytes.
    note = b"[log capped at 4096 bytes; earlier output discarded]\n"
    assert text == note + b"x" * 4096

    wrong = make(data_dir=tmp_path / "other", docker_image="podcast-no-such-image:never")
    failing = (await wrong.enqueue("exit", {"code": 0})).job
    failed = await wait_terminal(wrong, failing.job_id)
    assert failed.status is JobStatus.FAILED
    assert failed.error_reason is not None and "podcast-no-such-image:never" in failed.error_reason
    assert failed.error_reason.startswith("spawn_failed: image")


async def test_output_that_cannot_be_written_here_is_said_at_once_and_never_holds_up_the_end(tmp_path: Path) -> None:
    """A log the copy cannot write (here its directory is a file; or a disk full, or turned read-only, after the
    start's or the proof's check) is a fault of this host's disk, not the engine's: said at once, with the path, and
    the output asked of the engine once -- not again and again with backoff (7.5 s), which held up the job's end that
    long, and outlasted the leader's round over silent hosts (a third of the lease)."""
    executor = docker_execution.DockerExecutor(
        image=IMAGE, data_volume=str(tmp_path), log_dir=tmp_path, log_max_bytes=4096
    )
    client = executor.client
    container = await trio.to_thread.run_sync(
        lambda: client.create_container(IMAGE, command=["python3", "-c", "print('done')"], labels={LABEL_JOB: "t"})
    )
    container_id = container["Id"]
    asked: list[str] = []
    logs = client.logs

    def counted_logs(*args: Any, **kwargs: Any) -> Any:
        asked.append(args[0])
        return logs(*args, **kwargs)

    try:
        await trio.to_thread.run_sync(client.start, container_id)
        with trio.fail_after(30):
            await trio.to_thread.run_sync(client.wait, container_id)
        (tmp_path / "not-a-dir").write_text("a file where the log's directory should be")
        handle = docker_execution.ContainerHandle("t", container_id, tmp_path / "not-a-dir" / "t.log", 4096)
        client.logs = counted_logs  # type: ignore[method-assign]
        with capture_logs() as said, trio.fail_after(30):
            await executor.collect(handle)
    finally:
        await trio.to_thread.run_sync(lambda: client.remove_container(container_id, force=True))
        await executor.aclose()
    assert asked == [container_id]  # once: nothing to ask the engine again for
    [warning] = [e for e in said if e["log_level"] == "warning"]
    assert warning["event"] == "job_output_not_copied" and "not-a-dir" in warning["log"]
    assert handle.collected  # done with: the monitor (or the leader) records the end now


async def test_a_monitor_waits_in_slices_and_a_slice_ending_is_no_engine_trouble(
    make: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(docker_execution, "WAIT_SLICE_S", 0.2)  # a 1 s job outlasts several slices
    slices: list[object] = []
    real_slice = docker_execution.DockerExecutor.wait_slice

    def counted(self: docker_execution.DockerExecutor, container_id: str) -> object:
        slices.append(container_id)
        return real_slice(self, container_id)

    monkeypatch.setattr(docker_execution.DockerExecutor, "wait_slice", counted)
    sup = make()
    with capture_logs() as logs:
        job = (await sup.enqueue("sleep", {"seconds": 1.0})).job
        done = await wait_terminal(sup, job.job_id)
    assert (done.status, done.exit_code) == (JobStatus.SUCCEEDED, 0)
    assert len(slices) >= 3
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]


def _engine_script(command: str) -> None:
    subprocess.run(["bash", str(ENGINE_SCRIPT), command], check=True, timeout=120, capture_output=True)


async def test_dockerd_stopped_while_a_job_runs_keeps_its_slot_and_fails_nothing_then_finalizes_it_truly(
    make: Callable[..., Supervisor], world: DockerWorld
) -> None:
    """The engine runs with live-restore (scripts/docker-engine.sh): its job containers outlive a daemon stop."""
    if not (ENGINE_WORK / "dockerd.pid").exists():
        message = "the engine was not started by scripts/docker-engine.sh, so this test cannot stop it"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    sup = make(max_concurrent=1, sweep_interval_s=3600)
    gate = sup.data_dir / "gate"
    job = await wait_running(sup, (await sup.enqueue("gated", {"gate": str(gate), "code": 4})).job.job_id)
    queued = (await sup.enqueue("exit", {"code": 0})).job
    info = await trio.to_thread.run_sync(world.client.inspect_container, container_of(job))
    init = await trio.to_thread.run_sync(identify, info["State"]["Pid"])  # the container's init, as the host sees it
    assert init is not None
    try:
        await trio.to_thread.run_sync(_engine_script, "down")
        with capture_logs() as logs:
            report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
            await sup.drainer.drain()
            # A prior boot's view of the same row (nobody watching it): the probe itself says UNKNOWN.
            other = make(boot_id="other-boot", attach=False, max_concurrent=1)
            [seen] = (await other.reconciler.reconcile(stale_marks_live_processes=False)).details
        [detail] = report.details
        assert (detail.action, detail.liveness) == ("keep", "unknown")
        assert (seen.action, seen.reason, seen.liveness) == ("keep", "liveness_unknown_kept", "unknown")
        kept = [e for e in logs if e["event"] == "reconcile_kept_slot"]
        # The outage is said once, by the executor; each kept row only at DEBUG (with the engine's error).
        assert kept and kept[0]["log_level"] == "debug" and kept[0]["detail"]
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["docker_engine_unavailable"]
        assert any(e["event"] == "drain_held" for e in logs)
        assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
        assert (await sup.get(queued.job_id)).status is JobStatus.QUEUED  # no slot was freed

        await trio.to_thread.run_sync(gate.write_text, "open")  # the job ends while the engine is down

        async def init_gone() -> bool | None:
            return await trio.to_thread.run_sync(probe, init) is Liveness.DEAD or None

        await poll(init_gone)
        assert (await sup.get(job.job_id)).status is JobStatus.RUNNING  # nobody could know how it ended
    finally:
        await trio.to_thread.run_sync(_engine_script, "up")
    ended = await wait_terminal(sup, job.job_id, timeout_s=30)
    # INV-TRUE-OUTCOME: the engine kept the exit code across its own restart.
    assert (ended.status, ended.error_reason, ended.exit_code, ended.attempts) == (
        JobStatus.FAILED,
        "exit_code_4",
        4,
        1,
    )
    await sup.drainer.drain()  # the sweeper's (or the monitor's) next drain
    assert (await wait_terminal(sup, queued.job_id)).status is JobStatus.SUCCEEDED


# -- the real `supervisor serve`, SIGKILLed and restarted ------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return serve_env(tmp_path, PODCAST_JOB_MAX_CONCURRENT="2", PODCAST_PIPELINE_EXEC_MODE="docker")


@pytest.fixture
async def registry(tmp_path: Path, world: DockerWorld) -> AsyncIterator[SqliteRegistry]:
    reg = SqliteRegistry(tmp_path / "data" / ".viewer" / "jobs.sqlite3")
    yield reg
    jobs, _ = await reg.list_jobs(PageRequest.parse(limit=1000))
    await trio.to_thread.run_sync(world.clean_up, jobs)  # containers outlive supervisors by design
    await reg.aclose()


async def _enqueue(registry: SqliteRegistry, kind: str, params: dict[str, object]) -> str:
    """Enqueue as another process would, straight into the registry, with the image's interpreter."""
    parsed = parse_kind(kind, tomllib.loads(KINDS)["kinds"][kind])
    validated = parsed.validate_params(params)
    result = await registry.enqueue(NewJob(kind, validated, parsed.render_argv(validated, python="python3")))
    return result.job.job_id


async def _rows(registry: SqliteRegistry) -> dict[str, Job]:
    jobs, _ = await registry.list_jobs(PageRequest.parse(limit=1000))
    return {j.job_id: j for j in jobs}


async def _until(registry: SqliteRegistry, job_id: str, *statuses: JobStatus) -> Job:
    async def check() -> Job | None:
        row = (await _rows(registry))[job_id]
        return row if row.status in statuses else None

    return await poll(check, timeout_s=30)


async def test_serve_sigkilled_while_containers_run_keeps_their_slots_runs_nothing_twice_and_finalizes_truly(
    start_server: Callable[[], Awaitable[Any]], registry: SqliteRegistry, world: DockerWorld, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    gates = {name: data / f"gate-{name}" for name in "abc"}
    a = await _enqueue(registry, "gated", {"gate": str(gates["a"]), "code": 5})
    b = await _enqueue(registry, "gated", {"gate": str(gates["b"]), "code": 7})
    c = await _enqueue(registry, "gated", {"gate": str(gates["c"]), "code": 0})
    d = await _enqueue(registry, "exit", {"code": 0})

    first = await start_server()

    async def both_running() -> dict[str, Job] | None:
        rows = await _rows(registry)
        return rows if all(rows[j].status is JobStatus.RUNNING and container_of(rows[j]) for j in (a, b)) else None

    before = await poll(both_running)
    first.proc.kill()  # SIGKILL: no shutdown hook runs; the containers are the engine's, and run on
    await first.proc.wait()
    assert await trio.to_thread.run_sync(world.state, before[a]) == "running"

    await trio.to_thread.run_sync(gates["b"].write_text, "open")  # b ends while no supervisor runs

    async def b_exited() -> bool | None:
        return await trio.to_thread.run_sync(world.ended, before[b]) or None

    await poll(b_exited)
    second = await start_server()
    # The startup sweep ran before serving: b has its true outcome (the engine kept its exit code), never an orphan.
    rows = await _rows(registry)
    assert (rows[b].status, rows[b].error_reason, rows[b].exit_code, rows[b].attempts) == (
        JobStatus.FAILED,
        "exit_code_7",
        7,
        1,
    )
    assert not await trio.to_thread.run_sync(world.containers, before[b])  # removed once finalized
    # a is alive: it keeps its slot (c took b's; d waits), with its one container, adopted by the new boot.
    assert (rows[a].status, container_of(rows[a]), rows[a].attempts) == (JobStatus.RUNNING, container_of(before[a]), 1)
    await _until(registry, c, JobStatus.RUNNING)
    assert (await _rows(registry))[d].status is JobStatus.QUEUED
    assert [x["Id"] for x in await trio.to_thread.run_sync(world.containers, before[a])] == [container_of(before[a])]

    await trio.to_thread.run_sync(gates["a"].write_text, "open")
    ended = await _until(registry, a, JobStatus.FAILED, JobStatus.SUCCEEDED)
    assert (ended.error_reason, ended.exit_code, ended.attempts) == ("exit_code_5", 5, 1)
    assert (await _until(registry, d, JobStatus.SUCCEEDED)).attempts == 1
    await trio.to_thread.run_sync(gates["c"].write_text, "open")
    assert (await _until(registry, c, JobStatus.SUCCEEDED)).exit_code == 0
    second.proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await second.proc.wait() == 0


async def test_containers_a_dead_boot_recorded_as_ended_but_never_removed_are_removed_by_the_next_boot(
    make: Callable[..., Supervisor], world: DockerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INV-RELEASE-AFTER-END: a boot SIGKILLed between recording a job's end and removing its container left it behind
    for good (found by `make chaos`). The next boot removes every container whose attempt its registry records as
    ended (a terminal row's, a resubmitted job's earlier attempt's); never the container of an attempt that still
    runs, nor one of a job its registry does not know (another supervisor's on the same engine)."""

    async def dies_before_removing(self: docker_execution.DockerExecutor, handle: object) -> None:
        return None

    with monkeypatch.context() as patch:
        patch.setattr(docker_execution.DockerExecutor, "release", dies_before_removing)
        async with trio.open_nursery() as old_boot:
            old = make(boot_id="old", attach=old_boot)
            done = await wait_terminal(old, (await old.enqueue("exit", {"code": 0})).job.job_id)
            first = await wait_running(old, (await old.enqueue("retried_sleep", {"seconds": 60})).job.job_id)
            await world.akill(first)  # 137: resubmitted, and its second attempt started

            async def second_attempt() -> Job | None:
                job = await old.get(first.job_id)
                return job if job.status is JobStatus.RUNNING and job.attempts == 2 and container_of(job) else None

            again = await poll(second_attempt)
            old_boot.cancel_scope.cancel()  # the old boot dies
    assert [c["State"] for c in await trio.to_thread.run_sync(world.containers, done)] == ["exited"]
    states = {c["Id"]: c["State"] for c in await trio.to_thread.run_sync(world.containers, again)}
    assert states == {container_of(first): "exited", container_of(again): "running"}

    def foreign_container() -> str:  # an ended container of a job this registry does not know
        labels = {LABEL_JOB: secrets.token_hex(16), LABEL_ATTEMPT: "1"}
        created = world.client.create_container(IMAGE, command=["true"], labels=labels)
        world.client.start(created["Id"])
        world.client.wait(created["Id"], timeout=30)
        return str(created["Id"])

    foreign = await trio.to_thread.run_sync(foreign_container)
    try:
        new = make(boot_id="new")
        await new.sweeper.sweep()  # the startup sweep: reconcile (adopts the running attempt), drain, leftovers
        assert not await trio.to_thread.run_sync(world.containers, done)
        kept = [c["Id"] for c in await trio.to_thread.run_sync(world.containers, again)]
        assert kept == [container_of(again)]
        assert (await trio.to_thread.run_sync(world.client.inspect_container, foreign))["State"]["Status"] == "exited"
        await new.cancel(again.job_id)
        assert (await wait_terminal(new, again.job_id)).status is JobStatus.CANCELLED
    finally:
        await trio.to_thread.run_sync(lambda: world.client.remove_container(foreign, force=True))


GREEDY = """
[kinds.greedy]
argv = [
    "{python}", "-c", "import sys; x = bytearray(int(sys.argv[1]) * 2**20); x[::4096] = b'x' * len(x[::4096])", "{mb}"
]
params = { mb = "int" }
memory_max_mb = 32
"""


async def test_a_container_past_its_memory_bound_is_killed_out_of_memory_and_nothing_else_is(
    make: Callable[..., Supervisor], world: DockerWorld, tmp_path: Path
) -> None:
    kinds = kinds_file_with(tmp_path, GREEDY)
    sup = make(kinds_file=kinds, max_concurrent=2)
    bystander = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    greedy = await wait_terminal(sup, (await sup.enqueue("greedy", {"mb": 200})).job.job_id, timeout_s=60)
    assert (greedy.status, greedy.error_reason) == (JobStatus.FAILED, "killed_out_of_memory")
    info = await trio.to_thread.run_sync(world.client.inspect_container, container_of(bystander))
    assert info["HostConfig"]["OomScoreAdj"] == JOB_OOM_SCORE_ADJ  # every job, the OOM killer's likelier pick
    assert (await sup.get(bystander.job_id)).status is JobStatus.RUNNING
    await sup.cancel(bystander.job_id)
    await wait_terminal(sup, bystander.job_id, timeout_s=60)


TALKER = """
[kinds.talker]
argv = [
    "{python}",
    "-c",
    "import sys, time\\nfor i in range(3):\\n    print('line', i, flush=True)\\ntime.sleep(float(sys.argv[1]))",
    "{seconds}",
]
params = { seconds = "float" }
"""


async def test_a_running_containers_output_reaches_its_log_while_it_runs_and_once_at_its_end(
    make: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make(kinds_file=kinds_file_with(tmp_path, TALKER))
    job = await wait_running(sup, (await sup.enqueue("talker", {"seconds": 60})).job.job_id)

    async def live() -> bytes | None:
        data = await sup.read_log(job.job_id)  # what `logs --follow` reads, a running job's brought up to date
        return data if b"line 2" in data else None

    assert await poll(live, timeout_s=30) == b"line 0\nline 1\nline 2\n"
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING  # seen while it runs, not copied at its end
    await sup.cancel(job.job_id)
    await wait_terminal(sup, job.job_id, timeout_s=60)
    assert await sup.read_log(job.job_id) == b"line 0\nline 1\nline 2\n"  # the end's copy: each line once
