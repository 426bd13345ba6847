"""``supervisor hosts``: the fleet's hosts, and taking one out of service: forget a lost one, drain one (and wait
until it holds nothing), undrain it (docs/fleet.md § Draining a host).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from . import _live
from ._args import add_client_verb, timeout_arg
from ._client import Client
from ._command import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Io

WAIT_DRAINED_POLL_S = 0.5  # hosts wait-drained: how often the hosts are read


def cmd_hosts(client: Client, args: argparse.Namespace, io: Io) -> int:
    """``hosts``: the fleet's hosts; ``hosts forget HOST``: end a lost host's jobs and free their slots; ``hosts drain
    HOST`` / ``undrain HOST``: take a host out of service on purpose and back; ``hosts wait-drained HOST``: wait until
    a drained host holds nothing (docs/fleet.md § Draining a host)."""
    if args.action != "list" and not args.host_id:
        io.error(f"hosts {args.action}: name the host (supervisor hosts {args.action} HOST)")
        return EXIT_USAGE
    if args.timeout is not None and args.action != "wait-drained":
        io.error("--timeout is wait-drained's (supervisor hosts wait-drained HOST --timeout S)")
        return EXIT_USAGE
    if args.action == "forget":
        return _forget(client, args, io)
    if args.action in ("drain", "undrain"):
        return _drain_or_undrain(client, args, io)
    if args.action == "wait-drained":
        return _wait_drained(client, args, io)
    return _list_hosts(client, args, io)


def _forget(client: Client, args: argparse.Namespace, io: Io) -> int:
    answer = client.forget_host(args.host_id)
    if args.json:
        io.json(answer)
    else:
        io.print(f"forgot host {answer['host_id']}: {len(answer['jobs_ended'])} running job(s) ended")
    return EXIT_OK


def _drain_or_undrain(client: Client, args: argparse.Namespace, io: Io) -> int:
    answer = client.drain_host(args.host_id) if args.action == "drain" else client.undrain_host(args.host_id)
    if args.json:
        io.json(answer)
    else:
        state = answer["drain"] or "not drained"
        io.print(f"host {answer['host_id']}: {state}" + ("" if answer["changed"] else " (unchanged)"))
    return EXIT_OK


def _list_hosts(client: Client, args: argparse.Namespace, io: Io) -> int:
    answer = client.hosts()
    if args.json:
        io.json(answer)
        return EXIT_OK
    for host in answer["hosts"]:
        state = "live" if host["live"] else "SILENT"
        lead = " leader" if host["leader"] and host["live"] else ""
        drain = f"  {host['drain'].upper()}" if host.get("drain") else ""
        io.print(
            f"{host['host_id']}  {state}{lead}{drain}  release {host.get('release') or 'before 1.0.0'}  "
            f"running {host.get('running_jobs', 0)}  boot {host['boot_id'][:12]}  last seen {host['last_seen_at']}  "
            f"lease until {host['lease_expires_at']}"
        )
    if not answer["hosts"]:
        io.print("no host has registered")
    return EXIT_OK


def _wait_drained(client: Client, args: argparse.Namespace, io: Io) -> int:
    """Poll the hosts until ``args.host_id`` is drained (0), the timeout passes (124, as ``wait``'s), or it cannot
    become drained: unknown, or nobody drained it (1)."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        hosts = {host["host_id"]: host for host in client.hosts()["hosts"]}
        host = hosts.get(args.host_id)
        if host is None:
            io.error(f"hosts wait-drained: no host {args.host_id} has registered")
            return EXIT_ERROR
        if host.get("drain") is None:
            io.error(f"hosts wait-drained: host {args.host_id} is not drained (supervisor hosts drain {args.host_id})")
            return EXIT_ERROR
        if host["drain"] == "drained":
            if args.json:
                io.json(host)
            else:
                io.print(f"host {args.host_id}: drained (it may be stopped)")
            return EXIT_OK
        if deadline is not None and time.monotonic() >= deadline:
            io.error(f"hosts wait-drained: host {args.host_id} still runs {host.get('running_jobs', 0)} job(s)")
            return _live.EXIT_TIMEOUT
        left = WAIT_DRAINED_POLL_S if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, min(WAIT_DRAINED_POLL_S, left)))


def add_host_verbs(verbs: Any) -> None:
    """hosts [list|forget|drain|undrain|wait-drained]."""
    p = add_client_verb(
        verbs,
        "hosts",
        cmd_hosts,
        "list the fleet's hosts; hosts forget HOST: end a lost host's running jobs; hosts drain / undrain HOST: take "
        "a host out of service and back; hosts wait-drained HOST [--timeout S]: wait until it holds nothing "
        "(0 drained, 124 timed out, 1 not drained or unknown)",
    )
    p.add_argument("action", nargs="?", choices=["list", "forget", "drain", "undrain", "wait-drained"], default="list")
    p.add_argument("host_id", nargs="?")
    p.add_argument("--timeout", type=timeout_arg, metavar="S", help="wait-drained: give up after S seconds (exit 124)")
