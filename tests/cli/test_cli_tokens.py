"""``supervisor token add|list|revoke`` and a real ``supervisor serve`` that applies the tokens file on SIGHUP
(ADR 0017): a new token printed once and alone on stdout, the file holding digests only (mode 0600), a ``read`` token
refused every change, an ``enqueue`` token's job attributed to its name, a revoked token refused."""

from __future__ import annotations

import functools
import io
import json
import os
import re
import signal
import stat
from pathlib import Path

import httpx
import pytest
import trio
from serve_process import serve_process, stop  # type: ignore[import-not-found]
from test_cli_serve import START_LIMIT_S, cli_env, free_port, run_cli

from supervisor.api import ROUTES
from supervisor.cli import EXIT_CONFIG, EXIT_ERROR, EXIT_OK, EXIT_USAGE, main

CLI_LIMIT_S = 20.0


def token_cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["token", *argv], environ=env, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


async def client_cli(env: dict[str, str], token: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    run = functools.partial(main, list(argv), environ={**env, "PODCAST_JOB_API_TOKEN": token}, stdout=out, stderr=err)
    with trio.fail_after(CLI_LIMIT_S):
        code = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    return code, out.getvalue(), err.getvalue()


def test_token_add_prints_the_token_once_alone_and_stores_only_its_digest(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    code, out, err = token_cli(env, "add", "ci.bot-1", "--scope", "enqueue")
    assert code == EXIT_OK, err
    token = out.strip()
    assert out == token + "\n" and token.startswith("pjs_") and len(token) > 40  # one line: a script captures it
    assert err.startswith("added token 'ci.bot-1'") and "shown this once" in err and token not in err
    path = tmp_path / "data" / ".viewer" / "api-tokens.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert token not in text and token[4:] not in text
    assert '[tokens."ci.bot-1"]' in text and 'scope = "enqueue"' in text

    code, out, err = token_cli(env, "list")
    assert code == EXIT_OK
    assert out.split()[:2] == ["ci.bot-1", "enqueue"] and token not in out
    code, out, _ = token_cli(env, "list", "--json")
    assert [(t["name"], t["scope"]) for t in json.loads(out)] == [("ci.bot-1", "enqueue")]

    # A second token of that name is refused, and the first is left as it was.
    code, out, err = token_cli(env, "add", "ci.bot-1", "--scope", "operator")
    assert (code, out) == (EXIT_ERROR, "") and err.startswith("error: a token named 'ci.bot-1' exists already")
    assert path.read_text() == text
    code, _, err = token_cli(env, "revoke", "ci.bot-1")
    assert code == EXIT_OK and "revoked token 'ci.bot-1'" in err
    code, _, err = token_cli(env, "revoke", "ci.bot-1")
    assert code == EXIT_ERROR and "no token named 'ci.bot-1'" in err


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["add", "bot"], EXIT_USAGE, "token add needs NAME and --scope"),
        (["add", "--scope", "read"], EXIT_USAGE, "token add needs NAME and --scope"),
        (["list", "bot"], EXIT_USAGE, "token list takes no NAME"),
        (["revoke"], EXIT_USAGE, "token revoke takes NAME only"),
        (["add", "a b", "--scope", "read"], EXIT_ERROR, "1-64 characters of letters, digits"),
        (["add", "x" * 65, "--scope", "read"], EXIT_ERROR, "1-64 characters"),
        (["add", "operator", "--scope", "read"], EXIT_ERROR, "'operator' is the supervisor's own name"),
        (["add", "anonymous", "--scope", "read"], EXIT_ERROR, "'anonymous' is the supervisor's own name"),
    ],
)
def test_token_commands_refuse_bad_use_naming_what_is_wrong(
    tmp_path: Path, argv: list[str], code: int, said: str
) -> None:
    got, out, err = token_cli(cli_env(tmp_path), *argv)
    assert (got, out) == (code, "")
    assert said in err


async def test_a_tokens_file_that_cannot_be_parsed_ends_serve_in_one_line_with_exit_3(tmp_path: Path) -> None:
    env = cli_env(tmp_path, PODCAST_JOB_API_TOKENS_FILE=str(tmp_path / "tokens.toml"))
    (tmp_path / "tokens.toml").write_text('[tokens."x"]\nscope = "admin"\n')
    done = await run_cli(["serve"], env, tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert done.stderr.decode().splitlines() == [
        f"error: PODCAST_JOB_API_TOKENS_FILE: {tmp_path / 'tokens.toml'}: token 'x': must hold exactly scope, sha256 "
        "and created_at"
    ]
    code, _, said = token_cli(env, "list")
    assert code == EXIT_ERROR and "must hold exactly scope, sha256 and created_at" in said


async def test_tokens_added_and_revoked_while_serving_take_effect_on_sighup(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(
        tmp_path, PODCAST_JOB_BIND=url.removeprefix("http://"), PODCAST_JOB_URL=url, PODCAST_JOB_API_TOKEN="op-token"
    )
    tokens_path = tmp_path / "data" / ".viewer" / "api-tokens.toml"
    log_path = tmp_path / "serve.log"
    async with serve_process(env, tmp_path, log_path) as process:
        async with httpx.AsyncClient(timeout=5.0) as client:

            async def status_with(token: str) -> int:
                answer = await client.get(f"{url}/api/queue", headers={"Authorization": f"Bearer {token}"})
                return answer.status_code

            async def until_status(token: str, want: int) -> None:
                with trio.fail_after(START_LIMIT_S):
                    while True:
                        try:
                            if await status_with(token) == want:
                                return
                        except httpx.ConnectError:
                            pass
                        await trio.sleep(0.05)  # polling for the server (or its reload), under the deadline above

            await until_status("op-token", 200)
            _, reader, _ = token_cli(env, "add", "dashboard", "--scope", "read")
            _, adder, _ = token_cli(env, "add", "ci-bot", "--scope", "enqueue")
            reader, adder = reader.strip(), adder.strip()
            assert await status_with(reader) == 401  # not before the server is told
            process.send_signal(signal.SIGHUP)
            await until_status(reader, 200)
            assert await status_with(adder) == 200

            # The read token is refused every change, and each refusal names the scope needed.
            code, out, err = await client_cli(env, reader, "enqueue", "enrichment")
            assert code == EXIT_ERROR and "needs a token of scope 'enqueue'" in err, err
            for argv in (["pause"], ["reconcile"], ["prune"], ["cancel", "0" * 32], ["hosts", "forget", "h"]):
                code, _, err = await client_cli(env, reader, *argv)
                assert code == EXIT_ERROR and "needs a token of scope 'operator'" in err, (argv, err)
            code, _, err = await client_cli(env, adder, "pause")
            assert code == EXIT_ERROR and "token 'ci-bot' has scope 'enqueue'" in err
            # And every state-changing route, as its declaration says (the table is the routes', not this test's).
            for route in ROUTES:
                if route.method == "POST" and route.scope is not None:
                    path = re.sub(r"\{[^}]+\}", "0" * 32, route.path)
                    answer = await client.post(f"{url}{path}", json={}, headers={"Authorization": f"Bearer {reader}"})
                    assert answer.status_code == 403, (route.path, answer.text)
                    assert answer.json()["error"]["code"] == "insufficient_scope"

            # The enqueue token's job carries its name; the read token can see it.
            code, out, err = await client_cli(env, adder, "enqueue", "enrichment", "--json")
            assert code == EXIT_OK, err
            job_id = json.loads(out)["job_id"]
            code, out, err = await client_cli(env, reader, "show", job_id, "--json")
            assert code == EXIT_OK, err
            assert json.loads(out)["enqueued_by"] == "ci-bot"
            code, out, _ = await client_cli(env, "op-token", "cancel", job_id, "--json")
            assert code == EXIT_OK

            # A file that cannot be parsed keeps the tokens in force, and says why.
            good = tokens_path.read_text()
            tokens_path.write_text("[tokens\n")
            process.send_signal(signal.SIGHUP)
            with trio.fail_after(START_LIMIT_S):
                while True:
                    if "api_tokens_reload_failed" in await trio.Path(log_path).read_text():
                        break
                    await trio.sleep(0.05)  # polling the server's log for the line, under the deadline above
            assert await status_with(reader) == 200
            tokens_path.write_text(good)

            code, _, _ = token_cli(env, "revoke", "dashboard")
            assert code == EXIT_OK
            process.send_signal(signal.SIGHUP)
            await until_status(reader, 401)
            assert await status_with(adder) == 200

        assert await stop(process, 30) == 0
    text = tokens_path.read_text()
    assert adder not in text and reader not in text
    logged = log_path.read_text()
    assert adder not in logged and reader not in logged and "op-token" not in logged
    lines = [json.loads(line) for line in logged.splitlines()]
    enqueued = [e for e in lines if e.get("event") == "api_request" and e.get("path") == "/api/jobs"]
    assert [(e["by"], e["status"]) for e in enqueued] == [("dashboard", 403), ("dashboard", 403), ("ci-bot", 202)]
    cancelled = [e for e in lines if e.get("event") == "api_request" and e.get("path", "").endswith("/cancel")]
    assert [e["by"] for e in cancelled] == ["dashboard", "dashboard", "operator"]
    assert os.environ.get("PODCAST_JOB_API_TOKEN") != "op-token"  # the test's own environment was not touched
