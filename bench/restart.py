"""Restart to full duty after a crash (ADR 0012 §9): a lone ``supervisor serve`` (SQLite, subprocess mode) is SIGKILLed
and started again, N times, with a job running throughout; each restart is timed from the new process's exec to
full duty: ``/api/health`` answers with ``leader: true`` and the first webhook of the new boot (its reconcile adopting
the running job, ``job.adopted``) has reached a receiver on loopback.

Usage: .venv/bin/python bench/restart.py [--restarts 50] [--no-write]

Before ADR 0012 §9 a restarted boot waited for its dead boot's lease (15 s by default) before it led, and so before
it sent a webhook. The figure is compared with the process's own floor: the time from exec to its
``supervisor_started`` line (interpreter, imports, registry, startup sweep), measured in the same restarts. The raw
results go to ``bench/results/<UTC date>-restart.json``.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import git_revision, machine, scratch, versions
from results import run_header

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = '[kinds.sleep]\nargv = ["sleep", "{seconds}"]\nparams = { seconds = "int" }\n'
LIMIT_S = 60.0  # a backstop for a boot that never comes to duty, never a figure


class Receiver(http.server.ThreadingHTTPServer):
    """Takes every webhook on loopback and notes when each arrived (monotonic) and what it was."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, dict[str, Any]]] = []
        self.arrived = threading.Condition()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.end_headers()
        with self.server.arrived:
            self.server.arrivals.append((time.monotonic(), json.loads(body)))
            self.server.arrived.notify_all()

    def log_message(self, *args: Any) -> None:
        pass


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=out
        )


def started_at(log: Path, boot_index: int) -> tuple[str, str] | None:
    """The URL and boot id of the ``boot_index``-th ``supervisor_started`` line, once it is written."""
    lines = [json.loads(t) for t in log.read_text().splitlines() if '"supervisor_started"' in t]
    return (lines[boot_index]["url"], lines[boot_index]["boot_id"]) if len(lines) > boot_index else None


def one_restart(
    env: dict[str, str], log: Path, boot_index: int, receiver: Receiver, *, webhook: bool = True
) -> dict[str, float]:
    """Start boot ``boot_index`` and time it to its start line, its health as leader and (``webhook``) its first
    webhook."""
    t0 = time.monotonic()
    proc = start(env, log)
    deadline = t0 + LIMIT_S
    found = None
    while found is None:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"boot {boot_index} did not start: {log.read_text()[-2000:]}")
        found = started_at(log, boot_index)
        time.sleep(0.002)  # polling another process's log: there is no event to wait on
    start_line_s = time.monotonic() - t0
    url, boot_id = found
    with httpx.Client(timeout=5.0) as client:
        while True:
            health = client.get(f"{url}/api/health", timeout=5.0).json()
            if health["leader"]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"boot {boot_index} never led: {health}")
            time.sleep(0.002)
    leader_s = time.monotonic() - t0
    if not webhook:
        return {"proc": proc, "start_line_s": start_line_s, "leader_s": leader_s}  # type: ignore[dict-item]
    with receiver.arrived:
        mine = lambda: [at for at, body in receiver.arrivals if at >= t0 and body.get("boot_id") == boot_id]  # noqa: E731
        if not receiver.arrived.wait_for(lambda: mine(), timeout=deadline - time.monotonic()):
            raise RuntimeError(f"boot {boot_index} sent no webhook")
        webhook_s = min(mine()) - t0
    return {
        "proc": proc,  # type: ignore[dict-item]
        "start_line_s": start_line_s,
        "leader_s": leader_s,
        "webhook_s": webhook_s,
        "full_duty_s": max(leader_s, webhook_s),
    }


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=50)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    runs: list[dict[str, float]] = []
    with scratch("restart") as root:
        (root / "kinds.toml").write_text(KINDS)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
        env.update(
            PODCAST_JOB_DATA_DIR=str(root / "data"),
            PODCAST_JOB_BIND="127.0.0.1:0",
            PODCAST_JOB_KINDS_FILE=str(root / "kinds.toml"),
            PODCAST_JOB_WEBHOOK_URL=f"http://127.0.0.1:{receiver.server_address[1]}/hook",
        )
        log = root / "serve.log"
        first = one_restart(env, log, 0, receiver, webhook=False)
        url, _ = started_at(log, 0) or ("", "")
        with httpx.Client(timeout=5.0) as client:  # a job that runs through every restart: each boot adopts it
            client.post(f"{url}/api/jobs", json={"kind": "sleep", "params": {"seconds": 3600}}, timeout=5.0)
        proc: subprocess.Popen[bytes] = first["proc"]  # type: ignore[assignment]
        time.sleep(1.0)  # let the job start before the first SIGKILL (its adoption is each restart's webhook)
        try:
            for n in range(1, args.restarts + 1):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                run = one_restart(env, log, n, receiver)
                proc = run.pop("proc")  # type: ignore[assignment]
                runs.append(run)
                print(f"restart {n}: full duty {run['full_duty_s']:.3f} s (start line {run['start_line_s']:.3f} s)")
        finally:
            proc.kill()
            proc.wait()
            subprocess.run(["pkill", "-KILL", "-f", str(root)], check=False)
    receiver.shutdown()
    figures = {
        name: {"p50": statistics.median(v), "p99": p99(v), "max": max(v)}
        for name in ("full_duty_s", "leader_s", "webhook_s", "start_line_s")
        for v in [[r[name] for r in runs]]
    }
    print(json.dumps(figures, indent=1))
    verdict = "PASS" if figures["full_duty_s"]["p99"] <= 1.0 else "MISS"
    print(f"restart to full duty p99 {figures['full_duty_s']['p99']:.3f} s (target 1 s): {verdict}")
    if not args.no_write:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%MZ")
        out = RESULTS / f"{stamp}-restart.json"
        out.write_text(
            json.dumps(
                {**run_header("restart"), "restarts": args.restarts, "figures": figures, "verdict": verdict,
                 "runs": runs, "machine": machine(), "versions": versions(), "revision": git_revision()},
                indent=1,
            )
            + "\n"
        )  # fmt: skip
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
