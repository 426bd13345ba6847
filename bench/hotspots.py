"""Where the supervisor's time goes under one benchmark load: py-spy on the real ``supervisor serve``.

Usage: .venv/bin/python bench/hotspots.py LOAD [--n N] [--seconds S] [--target supervisor|shepherd] [--top K]

LOAD is one of:
- ``batch``: N x ``noop`` (/bin/true) by batches of 100 on 8 slots (scenario 1);
- ``post``: N x ``noop``, one POST per job (scenario 1);
- ``enqueue``: N POSTs closed loop over 16 connections (scenario 3's saturation);
- ``heartbeat``: 100 running jobs and S seconds of heartbeats (scenario 6).

py-spy (from the bench venv, ``make bench`` installs it) samples the target process for the whole load: with
``--mode cpu`` (default) only the thread holding the GIL — where the Python CPU goes, the scarce resource of a
Trio process (py-spy cannot tell idle threads here, so on-CPU sampling is not used); with ``--mode wall`` every
thread, waits included — where a request or a job spends its wall time. The summary gives the share of samples by
file, by function (self) and by function (inclusive: anywhere on the stack), so a figure that misses its target can
be traced to a file and a function.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH_VENV,
    HTTP_TIMEOUT,
    REPO,
    Supervisor,
    enqueue_jobs,
    has_batch_route,
    read_tokens,
    scratch,
    wait_idle,
    wait_running,
)

LOADS = ("batch", "post", "enqueue", "heartbeat")
# Frames where a thread waits rather than works: a worker thread with no job, the event loop with nothing to run.
IDLE = frozenset(
    {"trio/_core/_thread_cache.py:WorkerThread._work", "trio/_core/_io_epoll.py:EpollIOManager.get_events"}
)
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::\d+)?\)$")


def _short(path: str) -> str:
    """A file as a reader finds it: repo-relative, or the package path inside site-packages / the stdlib."""
    for marker in ("site-packages/", "lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return path


def _package(short_file: str) -> str:
    """The distribution a file belongs to: its top-level package, or the stdlib for a bare module."""
    if "/" not in short_file or short_file.startswith(("<", "json/", "asyncio/", "concurrent/", "importlib/")):
        return "python stdlib"
    return short_file.split("/", 1)[0]


def summarize(raw: Path, top: int) -> str:
    """Shares of samples by file and function, from py-spy's raw (collapsed stack) output."""
    by_self: Counter[str] = Counter()
    by_incl: Counter[str] = Counter()
    by_file: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        if frames and frames[0].startswith("thread ("):
            by_thread["event loop (MainThread)" if "MainThread" in frames[0] else "worker threads"] += count
            frames = frames[1:]
        names = []
        for frame in frames:
            m = _FRAME.match(frame)
            names.append(f"{_short(m['file'])}:{m['func']}" if m else frame)
        if not names:
            continue
        if names[-1] in IDLE:
            idle += count
            continue
        by_self[names[-1]] += count
        leaf_file = names[-1].rsplit(":", 1)[0]
        by_file[leaf_file] += count
        by_package[_package(leaf_file)] += count
        for name in set(names):
            by_incl[name] += count
    if total == 0:
        return "no samples (was the process busy?)"
    out = [f"{total} samples, {idle / total:.1%} of them idle (a worker thread with no job, the loop in epoll)"]
    out.append("shares below are of all samples; idle samples are left out of the rankings")
    if by_thread:
        out.append("\nby thread:")
        out += [f"  {n / total:6.1%}  {t}" for t, n in by_thread.most_common(top)]
    out.append("\nself time by package:")
    out += [f"  {n / total:6.1%}  {f}" for f, n in by_package.most_common(top)]
    out.append("\nself time by file:")
    out += [f"  {n / total:6.1%}  {f}" for f, n in by_file.most_common(top)]
    out.append("\nself time by function:")
    out += [f"  {n / total:6.1%}  {f}" for f, n in by_self.most_common(top)]
    out.append("\ninclusive time by function (anywhere on the stack):")
    out += [f"  {n / total:6.1%}  {f}" for f, n in by_incl.most_common(top * 2)]
    return "\n".join(out)


async def _load(sup: Supervisor, load: str, n: int, seconds: float) -> None:
    async with httpx.AsyncClient(base_url=sup.url, timeout=HTTP_TIMEOUT) as client:
        batch_route = await has_batch_route(client)
        if load in ("batch", "post"):
            jobs = [{"kind": "noop", "params": {}} for _ in range(n)]
            await enqueue_jobs(client, jobs, batch_size=100 if load == "batch" else None, batch_route=batch_route)
            await wait_idle(client, 600)
        elif load == "enqueue":
            from latency import closed_loop

            host, port = sup.host_port
            await closed_loop(host, port, n)
            await wait_idle(client, 600)
        else:
            from footprint import heartbeat_load

            jobs = [{"kind": "token_nap", "params": {"seconds": 3600}} for _ in range(100)]
            ids = await enqueue_jobs(client, jobs, batch_size=100, batch_route=batch_route)
            await wait_running(client, len(ids), 120)
            tokens = await read_tokens(client, ids, 120)
            host, port = sup.host_port
            await heartbeat_load(host, port, tokens, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("load", choices=LOADS)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--target", choices=("supervisor", "shepherd"), default="supervisor")
    parser.add_argument(
        "--mode",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: only the thread holding the GIL (where Python's CPU goes); wall: every thread, idle included",
    )
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--keep", type=Path, help="also keep py-spy's raw output here")
    args = parser.parse_args()
    py_spy = BENCH_VENV / "bin" / "py-spy"
    if not py_spy.exists():
        print(f"py-spy is not installed ({py_spy}); `make bench` installs it into the bench venv", file=sys.stderr)
        return 2
    slots = 100 if args.load == "heartbeat" else 8
    with scratch("profile") as tmp, Supervisor(tmp, max_concurrent=slots) as sup:
        assert sup.proc is not None
        target_pid = sup.proc.pid
        if args.target == "shepherd":
            # The shepherd starts with the first job: start one, and read its pid from the job's state file.
            async def first() -> None:
                async with httpx.AsyncClient(base_url=sup.url, timeout=HTTP_TIMEOUT) as client:
                    await enqueue_jobs(client, [{"kind": "noop", "params": {}}], batch_size=None, batch_route=False)
                    await wait_idle(client, 60)

            trio.run(first)
            shepherd = sup.job_states()[0].shepherd_pid
            assert shepherd is not None
            target_pid = shepherd
        raw = tmp / "py-spy.txt"
        spy = subprocess.Popen(
            [
                str(py_spy),
                "record",
                "--pid",
                str(target_pid),
                "--format",
                "raw",
                "--threads",
                *(["--gil"] if args.mode == "cpu" else ["--idle"]),
                "--rate",
                str(args.rate),
                "-o",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)  # py-spy attaches
        t0 = time.perf_counter()
        trio.run(_load, sup, args.load, args.n, args.seconds)
        elapsed = time.perf_counter() - t0
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        _, err = spy.communicate(timeout=60)
        if not raw.exists():
            print(f"py-spy wrote nothing: {err.decode(errors='replace')[-1000:]}", file=sys.stderr)
            return 1
        if args.keep:
            args.keep.write_bytes(raw.read_bytes())
        print(f"load {args.load} (n={args.n}) took {elapsed:.2f} s; profile of the {args.target} (pid {target_pid})")
        print(summarize(raw, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
