"""Every client command pointed at the wrong thing: a server answering JSON of another shape, an HTML page,
a closed port, and absurd arguments. Each ends in one ``error:`` line, never a traceback, with the exit code of
``docs/api.md``'s table: 4 when no usable answer came (unreachable, or not this API's answer), 2 for arguments."""

from __future__ import annotations

import functools
import io
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
import pytest
import trio

from supervisor.cli import EXIT_UNREACHABLE, EXIT_USAGE, main

CLI_LIMIT_S = 30.0
JOB = "0123456789abcdef0123456789abcdef"
# Every client command, with arguments it accepts.
COMMANDS: list[list[str]] = [
    ["enqueue", "sleep", "-p", "seconds=1"],
    ["jobs"],
    ["show", JOB],
    ["cancel", JOB],
    ["retry", JOB],
    ["reconcile"],
    ["prune", "--dry-run"],
    ["queue"],
    ["hosts"],
    ["hosts", "forget", "h2"],
    ["hosts", "drain", "h2"],
    ["hosts", "undrain", "h2"],
    ["hosts", "wait-drained", "h2", "--timeout", "5"],
    ["pause"],
    ["resume"],
    ["logs", JOB],
    ["events"],
    ["wait", JOB, "--timeout", "5"],
]


@dataclass
class Ran:
    code: int
    out: str
    err: str


async def cli(url: str, argv: list[str]) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    run = functools.partial(main, argv, environ={"PODCAST_JOB_URL": url}, stdout=out, stderr=err)
    with trio.fail_after(CLI_LIMIT_S):
        code = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    return Ran(code, out.getvalue(), err.getvalue())


def _one_error_line(ran: Ran) -> None:
    assert "Traceback" not in ran.err and "Traceback" not in ran.out, ran.err
    errors = [line for line in ran.err.splitlines() if "error:" in line]
    assert len(errors) == 1, ran.err


def _answering(status: int, content_type: str, body: bytes) -> Callable[[trio.SocketStream], Any]:
    async def handler(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    conn.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, h11.EndOfMessage):
                    headers = [("content-type", content_type), ("content-length", str(len(body)))]
                    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
                    await stream.send_all(conn.send(h11.Data(data=body)))
                    await stream.send_all(conn.send(h11.EndOfMessage()))
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass

    return handler


async def _serve(nursery: trio.Nursery, status: int, content_type: str, body: bytes) -> str:
    listeners = await nursery.start(
        functools.partial(trio.serve_tcp, _answering(status, content_type, body), 0, host="127.0.0.1")
    )
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


WRONG_SERVERS = {
    "json_of_another_shape": (200, "application/json", b'{"unexpected": [1, 2, 3], "status": 7}'),
    "a_json_list": (200, "application/json", b"[1, 2, 3]"),
    "an_html_page": (200, "text/html", b"<!doctype html><html><body>It works!</body></html>"),
}


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: "-".join(argv[:2]))
@pytest.mark.parametrize("server", sorted(WRONG_SERVERS))
async def test_every_command_against_a_server_that_is_not_this_api_says_so_in_one_line(
    nursery: trio.Nursery, server: str, argv: list[str]
) -> None:
    url = await _serve(nursery, *WRONG_SERVERS[server])
    ran = await cli(url, argv)
    _one_error_line(ran)
    assert ran.code == EXIT_UNREACHABLE, (ran.code, ran.err)
    assert "not this API" in ran.err or "is not JSON" in ran.err, ran.err


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: "-".join(argv[:2]))
async def test_every_command_against_a_closed_port_says_unreachable_in_one_line(argv: list[str]) -> None:
    ran = await cli(_closed_port(), argv)
    _one_error_line(ran)
    assert ran.code == EXIT_UNREACHABLE, (ran.code, ran.err)


ABSURD = {"empty": "", "huge": "x" * 70_000, "control": "job\x1b[31mid\n"}


@pytest.mark.parametrize("verb", ["show", "cancel", "retry", "logs", "wait"])
@pytest.mark.parametrize("absurd", sorted(ABSURD))
async def test_an_absurd_job_id_is_a_usage_error_in_one_line(verb: str, absurd: str) -> None:
    """Through the installed command: argparse says a usage error on the process's own stderr, and exits 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")} | {"PODCAST_JOB_URL": _closed_port()}
    with trio.fail_after(CLI_LIMIT_S):
        done = await trio.run_process(
            [sys.executable, "-m", "supervisor", verb, ABSURD[absurd]],
            env=env, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    ran = Ran(done.returncode, done.stdout.decode(), done.stderr.decode())
    _one_error_line(ran)
    assert ran.code == EXIT_USAGE, (ran.code, ran.err)
    assert "job id" in ran.err and len(ran.err) < 2000, ran.err


@pytest.mark.parametrize(
    "argv",
    [["hosts", "drain"], ["hosts", "undrain"], ["hosts", "wait-drained"], ["hosts", "drain", "h2", "--timeout", "5"]],
)
async def test_a_host_verb_without_its_host_or_with_a_foreign_flag_is_a_usage_error(argv: list[str]) -> None:
    ran = await cli(_closed_port(), argv)
    _one_error_line(ran)
    assert ran.code == EXIT_USAGE, (ran.code, ran.err)
