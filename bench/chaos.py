"""Chaos run: an operator's worst day. Jobs run while the supervisor is SIGKILLed and restarted, again and again.

Usage: make chaos   (or .venv/bin/python bench/chaos.py [--jobs 300] [--slots 3] [--kills 50] [--smoke]
                     [--results-dir DIR] [--no-write])

Each job sleeps 0.05-1.5 s, then exits 0, and appends "start"/"end" lines (its job id, wall time) to a shared
journal. The bench enqueues every job straight into the registry (as a CLI in another process would), then starts
`supervisor serve`, SIGKILLs it after a random 0.2-1.5 s, and starts it again, ``--kills`` times; a last boot runs
until every row is terminal. It then checks, and prints:

- nothing acknowledged was lost: every enqueued row is terminal;
- nothing ran twice: every job id starts once in the journal, and every row has attempts == 1;
- never more than ``--slots`` jobs ran at once (the journal's start/end intervals);
- how many jobs that exited 0 are recorded ``succeeded`` (before the job shepherd, 44-49 % of them were recorded
  ``failed/orphan_reconciled_dead_pid``);
- every job recorded as never started (``orphan_reconciled_spawn_window``, ``cancelled_before_start``) has no
  "start" line in the journal, read once no job process of the run is left (INV-IDENTITY-BEFORE-PROGRAM).
Exit status 1 when any check fails. The results (the run's parameters, its outcomes and each check's verdict) are
written to ``bench/results/<UTC date>-chaos.json`` (``--results-dir``; ``--smoke`` writes only where
``--results-dir`` says; ``--no-write`` nowhere); bench/report.py shows the latest in docs/performance.md.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import git_revision, machine, versions  # noqa: E402
from results import default_path, run_header, write_json  # noqa: E402

from supervisor import SqliteRegistry  # noqa: E402
from supervisor.registry import NewJob  # noqa: E402

JOB = """
import os, sys, time
journal = sys.argv[2]
def note(what):
    with open(journal, "a") as fh:
        fh.write("%s %s %.6f\\n" % (what, os.environ["PODCAST_JOB_ID"], time.time()))
note("start")
time.sleep(float(sys.argv[1]))
note("end")
"""


def kinds_toml(journal: Path) -> str:
    argv = ["{python}", "-c", JOB, "{seconds}", str(journal)]
    return f'[kinds.work]\nargv = {json.dumps(argv)}\nparams = {{ seconds = "float" }}\n'


def start_supervisor(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=fh
        )


# The outcomes that say a job's program never ran (the spawn window closed on a start that never happened).
NEVER_STARTED = ("orphan_reconciled_spawn_window", "cancelled_before_start")


def wait_for_jobs_gone(journal: Path, timeout_s: float) -> bool:
    """Until no process runs a job of this run (each names the journal in its argv); False on timeout."""
    needle = str(journal).encode()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = False
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if needle in (entry / "cmdline").read_bytes():
                    running = True
                    break
            except OSError:
                continue
        if not running:
            return True
        time.sleep(0.1)
    return False


def max_overlap(journal: Path) -> int:
    edges = []
    for line in journal.read_text().splitlines():
        what, _, at = line.split()
        edges.append((float(at), 1 if what == "start" else -1))
    held = peak = 0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):
        held += delta
        peak = max(peak, held)
    return peak


def run(jobs: int, slots: int, kills: int, seed: int, results_dir: Path | None = None) -> int:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        journal = root / "journal"
        journal.touch()
        kinds = root / "kinds.toml"
        kinds.write_text(kinds_toml(journal))
        data = root / "data"
        env = dict(os.environ)
        env.update(
            PODCAST_JOB_DATA_DIR=str(data),
            PODCAST_JOB_BIND="127.0.0.1:0",
            PODCAST_JOB_KINDS_FILE=str(kinds),
            PODCAST_JOB_MAX_CONCURRENT=str(slots),
            PODCAST_JOB_SWEEP_SECONDS="1",
        )
        registry = SqliteRegistry(data / ".viewer" / "jobs.sqlite3")

        def call(method: Any, *args: Any, **kwargs: Any) -> Any:
            """A registry call from this blocking script: each in a Trio run of its own."""
            return trio.run(functools.partial(method, *args, **kwargs))

        argv_of = json.loads(json.dumps(["{python}", "-c", JOB, "{seconds}", str(journal)]))
        ids = []
        for _ in range(jobs):
            seconds = round(rng.uniform(0.05, 1.5), 3)
            argv = [sys.executable if a == "{python}" else (str(seconds) if a == "{seconds}" else a) for a in argv_of]
            enqueued, _ = call(registry.enqueue, NewJob("work", {"seconds": seconds}, argv))
            ids.append(enqueued.job.job_id)
        log = root / "supervisor.log"
        started = time.monotonic()
        for _ in range(kills):
            proc = start_supervisor(env, log)
            time.sleep(rng.uniform(0.2, 1.5))
            if proc.poll() is not None:
                print(f"the supervisor exited by itself ({proc.returncode}); see {log}:\n{log.read_text()[-2000:]}")
                return 2
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        last = start_supervisor(env, log)
        deadline = time.monotonic() + 600
        try:
            while time.monotonic() < deadline:
                counts = call(registry.counts)
                if counts["queued"] == 0 and counts["running"] == 0:
                    break
                time.sleep(0.2)
        finally:
            last.send_signal(signal.SIGTERM)
            last.wait(timeout=30)
        elapsed = time.monotonic() - started
        rows = [call(registry.get, job_id) for job_id in ids]
        registry.close()
        # A job wrongly judged never-started would still be running now: read the journal once every job is gone.
        if not wait_for_jobs_gone(journal, timeout_s=60):
            print("some job processes were still running after 60 s")
            return 1

        starts = collections.Counter(
            line.split()[1] for line in journal.read_text().splitlines() if line.startswith("start ")
        )
        ends = {line.split()[1] for line in journal.read_text().splitlines() if line.startswith("end ")}
        outcomes = collections.Counter((str(r.status), r.error_reason) for r in rows)
        lost = [r.job_id for r in rows if not r.status.is_terminal]
        twice = [job_id for job_id, n in starts.items() if n > 1] + [r.job_id for r in rows if r.attempts > 1]
        exited_zero = [r for r in rows if r.job_id in ends]
        # INV-IDENTITY-BEFORE-PROGRAM: a row ended as never started must be a job whose program never ran.
        never_started = [r.job_id for r in rows if r.error_reason in NEVER_STARTED]
        started_anyway = [job_id for job_id in never_started if job_id in starts]
        recorded_ok = [r for r in exited_zero if str(r.status) == "succeeded"]
        peak = max_overlap(journal)

        print(f"chaos: {jobs} jobs, {slots} slots, supervisor SIGKILLed {kills} times, {elapsed:.1f} s, seed {seed}")
        for (status, reason), n in sorted(outcomes.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {status}{'/' + reason if reason else ''}")
        share = 100 * len(recorded_ok) / len(exited_zero) if exited_zero else 100.0
        print(f"  jobs that exited 0: {len(exited_zero)}; recorded succeeded: {len(recorded_ok)} ({share:.1f} %)")
        checks = {
            "nothing lost (every row terminal)": not lost,
            "nothing ran twice": not twice,
            f"never more than {slots} at once (peak {peak})": peak <= slots,
            "every job that exited 0 is recorded succeeded": len(recorded_ok) == len(exited_zero),
            f"every job recorded as never started never ran ({len(never_started)} such)": not started_anyway,
        }
        for name, ok in checks.items():
            print(f"  {'PASS' if ok else 'FAIL'}  {name}")
        if results_dir is not None:
            data = run_header("chaos", label=None)
            data.update(machine=machine(), versions=versions(), revision=git_revision())
            data.update(
                args={"jobs": jobs, "slots": slots, "kills": kills, "seed": seed},
                elapsed_s=round(elapsed, 1),
                outcomes=[
                    {"status": status, "reason": reason, "count": n}
                    for (status, reason), n in sorted(outcomes.items(), key=lambda kv: -kv[1])
                ],
                exited_zero=len(exited_zero),
                recorded_succeeded=len(recorded_ok),
                never_started=len(never_started),
                peak=peak,
                checks=[{"name": name, "verdict": "PASS" if ok else "FAIL"} for name, ok in checks.items()],
                verdict="PASS" if all(checks.values()) else "FAIL",
            )
            path = default_path("chaos", results_dir)
            write_json(path, data)
            print(f"  results: {path}")
        return 0 if all(checks.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=152)
    parser.add_argument("--smoke", action="store_true", help="a few jobs and kills: that the script still works")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="where the results JSON goes (default bench/results; --smoke: none)",
    )
    parser.add_argument("--no-write", action="store_true", help="write no results file")
    args = parser.parse_args()
    results_dir = None if args.no_write else args.results_dir or (None if args.smoke else REPO / "bench" / "results")
    if args.smoke:
        return run(jobs=12, slots=3, kills=3, seed=args.seed, results_dir=results_dir)
    return run(args.jobs, args.slots, args.kills, args.seed, results_dir)


if __name__ == "__main__":
    raise SystemExit(main())
