"""The second alert channel as an operator installs it (docs/alerting.md), on this machine: VictoriaMetrics scraping a
real ``supervisor serve``, vmalert evaluating the shipped rules, Alertmanager routing to a receiver of the test's own.

Every configuration is read from what the project ships -- ``deploy/alerting/`` (the scrape config, VictoriaMetrics'
arguments, vmalert's unit, Alertmanager's routes) and ``docs/alerts/`` (the rules) -- and changed only where a test
must: its ports and files, one-second scrapes and evaluations, and each rule's durations and thresholds scaled down
(``SCALED``; the expressions stay as shipped)."""

from __future__ import annotations

import http.server
import json
import re
import shlex
import shutil
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "alerting"
RULES = REPO / "docs" / "alerts" / "podcast-supervisor.rules.yml"
# The binaries of Debian's victoria-metrics and prometheus-alertmanager packages (.ci/run installs them).
BINARIES = {"victoria-metrics": ("victoria-metrics",), "vmalert": ("vmalert",),
            "alertmanager": ("prometheus-alertmanager", "alertmanager")}  # fmt: skip

# Each rule's shipped durations and thresholds, and what the test runs instead. A rule that is not here, or whose
# text no longer holds what is replaced, fails the test: a rule changed must be scaled on purpose.
SCALED: dict[str, dict[str, str]] = {
    "PodcastJobStalled": {"> 1800": "> 8"},  # the stall threshold: 30 min -> 8 s
    "PodcastJobSilent": {"for": "5s"},
    "PodcastSupervisorDown": {"for": "5s"},  # above the query delay and a scrape (docs/alerting.md)
    "PodcastSweeperNotSweeping": {"[5m]": "[15s]", "for": "5s"},  # 10 sweeps of the supervisor's 30 s, of its 1 s
    "PodcastWebhookOutboxGrowing": {"[15m]": "[15s]"},
    "PodcastWebhookEventsDropped": {"[1h]": "[60s]"},
    "PodcastRegistryUnwritable": {"for": "4s"},
    "PodcastQueueStuck": {},  # the supervisor's own judgement (PODCAST_JOB_QUEUE_STUCK_SECONDS)
    "PodcastQueueHeld": {"for": "6s"},
    "PodcastQueuePausedLong": {},  # the supervisor's own judgement (PODCAST_JOB_PAUSE_WARN_SECONDS)
}
# Alertmanager's waits, scaled as much (its repeat interval is kept: nothing is repeated within a test).
ROUTE_TIMES = {"group_wait": "1s", "group_interval": "2s"}
# The scrapes and evaluations, and VictoriaMetrics' query delay: a second each.
INTERVAL = "1s"


def scaled_rules(text: str) -> str:
    """The shipped rules with ``SCALED``'s changes, each of which must apply."""
    doc = yaml.safe_load(text)
    names = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            names.append(name)
            changes = dict(SCALED[name])
            if "for" in rule or "for" in changes:
                assert "for" in rule and "for" in changes, f"{name}: its for: and the test's scaling disagree"
                rule["for"] = changes.pop("for")
            for old, new in changes.items():
                assert old in rule["expr"], f"{name}: {old!r} is no longer in its expression"
                rule["expr"] = rule["expr"].replace(old, new)
    assert sorted(names) == sorted(SCALED), "a rule was added or removed: scale it in SCALED"
    return yaml.safe_dump(doc, sort_keys=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary(name: str) -> str | None:
    return next((path for candidate in BINARIES[name] if (path := shutil.which(candidate))), None)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if binary(name) is None]


def replaced_flags(args: list[str], changes: dict[str, str]) -> list[str]:
    """``args`` with each ``-flag=`` of ``changes`` given its new value; every one must be there."""
    out, seen = [], set()
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in changes:
            out.append(f"{flag}={changes[flag]}")
            seen.add(flag)
        else:
            out.append(arg)
    assert seen == set(changes), f"the shipped command line lacks {set(changes) - seen}: {args}"
    return out


def victoria_metrics_args() -> list[str]:
    """The ARGS of deploy/alerting/victoria-metrics.default (Debian's /etc/default/victoria-metrics)."""
    text = (DEPLOY / "victoria-metrics.default").read_text()
    [args] = re.findall(r'^ARGS="(.*)"$', text, flags=re.M)
    return shlex.split(args)


def vmalert_args() -> list[str]:
    """The ExecStart of deploy/alerting/podcast-vmalert.service, past the binary."""
    text = (DEPLOY / "podcast-vmalert.service").read_text().replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))[1:]


@dataclass(frozen=True)
class Alert:
    route: str  # the receiver's path: /page or /warn
    status: str  # firing or resolved
    labels: dict[str, str]
    at: float  # time.monotonic() when received

    @property
    def name(self) -> str:
        return self.labels["alertname"]


class Receiver(http.server.ThreadingHTTPServer):
    """Alertmanager's webhook receiver: every alert of every notification, in the order received."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def received(self) -> list[Alert]:
        with self.lock:
            return list(self.alerts)

    def paged(self) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
        """Each alert that was ever sent firing: its route, name and identifying labels."""
        keep = ("job_id", "reason", "instance")
        return {
            (a.route, a.name, tuple((k, a.labels[k]) for k in keep if k in a.labels))
            for a in self.received()
            if a.status == "firing"
        }


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        now = time.monotonic()
        with self.server.lock:
            for alert in body["alerts"]:
                self.server.alerts.append(Alert(self.path, alert["status"], dict(alert["labels"]), now))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Stack:
    """The running channel: where each part answers."""

    victoria_metrics: str
    vmalert: str
    alertmanager: str
    receiver: Receiver
    client: httpx.AsyncClient

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query to VictoriaMetrics: its result vector."""
        answer = await self.client.get(f"{self.victoria_metrics}/api/v1/query", params={"query": expr})
        assert answer.status_code == 200, answer.text
        return list(answer.json()["data"]["result"])

    async def active(self) -> list[tuple[str, str, dict[str, str]]]:
        """vmalert's alerts now, pending or firing: (name, state, labels)."""
        answer = await self.client.get(f"{self.vmalert}/api/v1/alerts")
        assert answer.status_code == 200, answer.text
        return [(a["name"], a["state"], a["labels"]) for a in answer.json()["data"]["alerts"]]


async def _ready(client: httpx.AsyncClient, url: str, process: trio.Process, log: Path, limit_s: float) -> None:
    with trio.fail_after(limit_s):
        while True:
            if process.returncode is not None:
                output = await trio.Path(log).read_text()
                raise AssertionError(f"{url} exited {process.returncode}: {output[-3000:]}")
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.1)


@asynccontextmanager
async def alert_stack(tmp_path: Path, target: str) -> AsyncIterator[tuple[Stack, Any]]:
    """VictoriaMetrics scraping ``target`` (host:port) and Alertmanager, running, and a function that starts vmalert
    (a test starts it once the scrapes are visible: see docs/alerting.md, "The query delay"). Everything is killed on
    the way out."""
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    ports = {name: free_port() for name in ("vm", "vmalert", "am")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

    scrape = yaml.safe_load((DEPLOY / "scrape.yml").read_text())
    scrape["global"].update(scrape_interval=INTERVAL, scrape_timeout=INTERVAL)
    [job] = scrape["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    (tmp_path / "scrape.yml").write_text(yaml.safe_dump(scrape))

    routes = yaml.safe_load((DEPLOY / "alertmanager.yml").read_text())
    for name, value in ROUTE_TIMES.items():
        assert name in routes["route"], f"deploy/alerting/alertmanager.yml has no {name}"
        routes["route"][name] = value
    here = f"http://127.0.0.1:{receiver.server_address[1]}"
    for entry in routes["receivers"]:
        for hook in entry["webhook_configs"]:
            hook["url"] = re.sub(r"^https?://[^/]+", here, hook["url"])
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(routes))
    (tmp_path / "rules.yml").write_text(scaled_rules(RULES.read_text()))

    vm_args = replaced_flags(victoria_metrics_args(), {
        "-storageDataPath": str(tmp_path / "vm-data"),
        "-httpListenAddr": f"127.0.0.1:{ports['vm']}",
        "-promscrape.config": str(tmp_path / "scrape.yml"),
        "-search.latencyOffset": INTERVAL,
    })  # fmt: skip
    am_args = [
        f"--config.file={tmp_path / 'alertmanager.yml'}",
        f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{ports['am']}",
        "--cluster.listen-address=",  # one Alertmanager: no gossip
    ]
    vmalert_flags = replaced_flags(vmalert_args(), {
        "-rule": str(tmp_path / "rules.yml"),
        "-datasource.url": urls["vm"],
        "-notifier.url": urls["am"],
        "-remoteWrite.url": urls["vm"],
        "-remoteRead.url": urls["vm"],
        "-evaluationInterval": INTERVAL,
        "-httpListenAddr": f"127.0.0.1:{ports['vmalert']}",
    })  # fmt: skip
    processes: list[trio.Process] = []

    async def start(name: str, args: list[str], ready: str) -> None:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as fh:
            bin_path = binary(name)
            assert bin_path is not None, f"{name} is not installed"
            process = await trio.lowlevel.open_process([bin_path, *args], stdout=fh, stderr=fh)
        processes.append(process)
        await _ready(client, ready, process, log, 30)

    client = httpx.AsyncClient(timeout=5.0)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(start, "victoria-metrics", vm_args, f"{urls['vm']}/health")
            nursery.start_soon(start, "alertmanager", am_args, f"{urls['am']}/-/ready")
        stack = Stack(urls["vm"], urls["vmalert"], urls["am"], receiver, client)

        async def start_vmalert() -> None:
            await start("vmalert", vmalert_flags, f"{urls['vmalert']}/health")

        yield stack, start_vmalert
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
        with trio.CancelScope(shield=True):
            for process in processes:
                await process.wait()
            await client.aclose()
        receiver.shutdown()
        receiver.server_close()
