"""INV-PROMOTION-NEVER-OVERSHOOTS across OS processes sharing one database file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from supervisor import SqliteRegistry

WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from supervisor import JobStatus, SqliteRegistry
    from supervisor._registry import hash_token

    path, max_concurrent, finish = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "finish"
    reg = SqliteRegistry(path)
    sys.stdin.readline()  # start line: every process is ready before any promotes
    while True:
        job = reg.promote_queued_if_slot(max_concurrent, boot_id="b", token_hash=hash_token("t"))
        if job is None:
            if not finish or reg.counts()["queued"] == 0:
                break
            continue
        running = reg.counts()["running"]
        print(f"{job.job_id} {running}", flush=True)
        if finish:
            reg.finalize(job.job_id, JobStatus.SUCCEEDED)
    reg.close()
    """
)


def _race(path: Path, processes: int, max_concurrent: int, finish: bool) -> list[tuple[str, int]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), str(max_concurrent), "finish" if finish else "hold"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    lines: list[tuple[str, int]] = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        for line in out.splitlines():
            job_id, running = line.split()
            lines.append((job_id, int(running)))
    return lines


def test_concurrent_processes_never_promote_past_max_concurrent_INV_PROMOTION_NEVER_OVERSHOOTS(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    reg = SqliteRegistry(path)
    for i in range(30):
        reg.enqueue("k", {"i": i}, ["x"])
    promoted = _race(path, processes=6, max_concurrent=3, finish=False)
    assert len(promoted) == 3
    assert reg.counts()["running"] == 3
    reg.close()


def test_concurrent_drains_promote_every_job_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    reg = SqliteRegistry(path)
    ids = {reg.enqueue("k", {"i": i}, ["x"]).job.job_id for i in range(40)}
    promoted = _race(path, processes=5, max_concurrent=2, finish=True)
    assert sorted(j for j, _ in promoted) == sorted(ids)  # none twice, none lost
    assert max(running for _, running in promoted) <= 2
    assert reg.counts()["succeeded"] == 40
    reg.close()
