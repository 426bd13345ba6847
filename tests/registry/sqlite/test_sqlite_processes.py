"""Several OS processes on one SQLite registry file: INV-PROMOTION-NEVER-OVERSHOOTS holds across processes (SQLite's
write lock, not this process's, is what a promotion counts under), enqueues from every process all land, and
processes opening an old file at once migrate it once.

Each worker opens the registry (its own Trio loop, its own connections), then waits for a start line on stdin, so
every process is ready before any of them writes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from registry_helpers import new_job
from registry_v3 import PROCESS, build_v3

from supervisor.domain import PageRequest
from supervisor.registry import SqliteRegistry
from supervisor.registry.sqlite import migrations

WAIT_S = 120.0  # a backstop for a broken test, never a timing assertion

WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import trio

    from supervisor.domain import JobStatus
    from supervisor.registry import Ending, NewJob, Outcome, PromoteRequest, SqliteRegistry, hash_token

    DONE = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


    async def main(path: Path, mode: str, max_concurrent: int, name: str) -> None:
        reg = await SqliteRegistry.open(path)
        await trio.to_thread.run_sync(sys.stdin.readline)  # the start line
        try:
            for n in range(100_000):
                request = PromoteRequest(max_concurrent, name, [hash_token(f"{name}-{n}")])
                if mode == "enqueue":
                    if n == 10:
                        return
                    result = await reg.enqueue(NewJob("k", {"by": name, "n": n}, ["x"]))
                    print("enqueued", result.job.job_id, flush=True)
                promotion = await reg.promote(request)
                if not promotion.jobs:
                    if mode == "hold" or (mode == "finish" and (await reg.counts())["queued"] == 0):
                        return
                    continue  # finish: the slots are another process's; it frees them
                [job] = promotion.jobs
                print("promoted", job.job_id, (await reg.counts())["running"], flush=True)
                if mode == "finish":
                    await reg.finalize(job.job_id, DONE)
        finally:
            await reg.aclose()


    trio.run(main, Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4])
    """
)

OPENER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import trio

    from supervisor.registry import SqliteRegistry


    async def main(path: Path) -> None:
        await trio.to_thread.run_sync(sys.stdin.readline)  # the start line: every process opens at once
        reg = await SqliteRegistry.open(path)
        print(reg.file.schema_version, (await reg.get("proc")).identity.fields["pid"], flush=True)
        await reg.aclose()


    trio.run(main, Path(sys.argv[1]))
    """
)


def _race(script: str, args: list[list[str]]) -> list[list[str]]:
    """Start one process per argument list, let them all go at once; each one's output lines, split."""
    procs = [
        subprocess.Popen([sys.executable, "-c", script, *a], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for a in args
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    lines: list[list[str]] = []
    for p in procs:
        out, _ = p.communicate(timeout=WAIT_S)
        assert p.returncode == 0
        lines.extend(line.split() for line in out.splitlines())
    return lines


async def _queued(path: Path, n: int) -> set[str]:
    reg = await SqliteRegistry.open(path)
    try:
        return {(await reg.enqueue(new_job(i))).job.job_id for i in range(n)}
    finally:
        await reg.aclose()


async def test_processes_racing_to_promote_never_pass_max_concurrent_INV_PROMOTION_NEVER_OVERSHOOTS(
    path: Path,
) -> None:
    await _queued(path, 30)
    lines = _race(WORKER, [[str(path), "hold", "3", f"p{i}"] for i in range(6)])
    promoted = [job_id for _, job_id, _ in lines]
    assert len(promoted) == len(set(promoted)) == 3
    reg = await SqliteRegistry.open(path)
    try:
        assert (await reg.counts())["running"] == 3
        assert {j.boot_id for j in await reg.running_jobs()} <= {f"p{i}" for i in range(6)}
    finally:
        await reg.aclose()


async def test_processes_draining_one_queue_promote_every_row_exactly_once(path: Path) -> None:
    ids = await _queued(path, 40)
    lines = _race(WORKER, [[str(path), "finish", "2", f"p{i}"] for i in range(5)])
    assert sorted(job_id for _, job_id, _ in lines) == sorted(ids)  # none twice, none lost
    assert max(int(running) for _, _, running in lines) <= 2
    reg = await SqliteRegistry.open(path)
    try:
        assert (await reg.counts())["succeeded"] == 40
    finally:
        await reg.aclose()


async def test_processes_enqueueing_and_promoting_all_land_and_never_overshoot(path: Path) -> None:
    lines = _race(WORKER, [[str(path), "enqueue", "2", f"p{i}"] for i in range(4)])
    enqueued = [job_id for verb, job_id, *_ in lines if verb == "enqueued"]
    promoted = [(job_id, int(running)) for verb, job_id, *rest in lines if verb == "promoted" for running in rest]
    assert len(set(enqueued)) == 40
    assert len(promoted) == 2 and all(running <= 2 for _, running in promoted)
    reg = await SqliteRegistry.open(path)
    try:
        assert await reg.counts() == {
            "queued": 38,
            "running": 2,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "stale": 0,
        }
        assert sorted(j.job_id for j in await reg.running_jobs()) == sorted(job_id for job_id, _ in promoted)
        queued, _ = await reg.list_jobs(PageRequest.parse(status="queued", limit=100))
        assert sorted(j.queue_position or 0 for j in queued) == list(range(1, 39))
    finally:
        await reg.aclose()


def test_processes_opening_an_old_file_at_once_migrate_it_once(path: Path) -> None:
    """Each migration re-reads the version under the write lock: the process that comes second finds it done."""
    build_v3(path)
    lines = _race(OPENER, [[str(path)] for _ in range(3)])
    pid = PROCESS.fields["pid"]
    # An old file opens to the expands: the contract after them waits for supervisor migrate.
    first_contract = min(m.version for m in migrations() if m.phase == "contract")
    opened = max(m.version for m in migrations() if m.version < first_contract)
    assert lines == [[str(opened), str(pid)]] * 3
