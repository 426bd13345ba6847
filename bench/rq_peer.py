"""RQ as a peer of the supervisor: the job its workers run, and the enqueuing side of the measurement.

Runs under the bench venv's interpreter (RQ is never a dependency of the project). The workers import this module
(``PYTHONPATH`` holds bench/) to find ``true_job``; ``main`` waits for the workers, enqueues ``--n`` jobs with one
``Queue.enqueue`` call each (RQ's ordinary use, one Redis round trip a job) and waits until every job has
finished, then prints one JSON line: ``{"wall_s", "enqueue_s", "finished", "failed"}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def true_job() -> None:
    """What every job of the comparison runs: ``/bin/true``."""
    subprocess.run(["/bin/true"], check=True, timeout=60)


def main(argv: list[str]) -> int:
    from redis import Redis
    from rq import Queue, Worker

    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    conn = Redis.from_url(args.url, socket_timeout=30)
    queue = Queue("bench", connection=conn)
    deadline = time.monotonic() + args.timeout
    while len(Worker.all(connection=conn)) < args.workers:
        if time.monotonic() > deadline:
            print(json.dumps({"error": "the workers did not register"}))
            return 1
        time.sleep(0.05)
    t0 = time.perf_counter()
    for _ in range(args.n):
        queue.enqueue("rq_peer.true_job")
    enqueued = time.perf_counter()
    finished = failed = 0
    while True:
        finished, failed = queue.finished_job_registry.count, queue.failed_job_registry.count
        if finished + failed >= args.n:
            break
        if time.monotonic() > deadline:
            print(json.dumps({"error": f"timed out: {finished} finished, {failed} failed of {args.n}"}))
            return 1
        time.sleep(0.005)
    done = time.perf_counter()
    print(json.dumps({"wall_s": done - t0, "enqueue_s": enqueued - t0, "finished": finished, "failed": failed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
