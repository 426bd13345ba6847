"""Webhooks signed to the Standard Webhooks specification, judged by its maintained verifier (``standardwebhooks``),
never by our own code: what a receiver runs is what passes or refuses here (docs/api.md § Webhooks).

End to end: a real ``supervisor serve`` delivers to a real local receiver; every delivery verifies with the library,
for a ``whsec_`` secret and for a plain one (its UTF-8 bytes are the key). The same delivery replayed later than the
library's tolerance, replayed under a fresh timestamp, or altered in its body or id, is refused by it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks.webhooks as standard
import trio
from standardwebhooks import Webhook, WebhookVerificationError
from webhook_helpers import KINDS, Delivery, Receiver, statuses

from supervisor import Config, ConfigError, SqliteRegistry, load_config
from supervisor.domain import WEBHOOK_SECRET_PREFIX, webhook_signing_key
from supervisor.observe import WebhookSender, sign_standard

WAIT_S = 30.0
REPO_ROOT = Path(__file__).resolve().parents[2]
WHSEC = WEBHOOK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
PLAIN = "webhook-test-secret"


def verifier(secret: str) -> Webhook:
    """What a receiver builds from the secret the operator gave it (docs/api.md § Webhooks)."""
    return Webhook(secret) if secret.startswith(WEBHOOK_SECRET_PREFIX) else Webhook(secret.encode())


def documented_verify() -> Callable[[str, bytes, dict[str, str]], Any]:
    """The receiver example of docs/api.md § Webhooks, as a reader copies it: the end-to-end tests verify with it."""
    page = (REPO_ROOT / "docs" / "api.md").read_text()
    section = page[page.index("## Webhooks") : page.index("## Event stream")]
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)
    verify: Callable[[str, bytes, dict[str, str]], Any] = namespace["verify"]
    return verify


# -- the key a configured secret maps to, judged by the library ----------------------------------------------------


@pytest.mark.parametrize(
    "secret",
    [WHSEC, WHSEC.rstrip("="), PLAIN, "a secret, with spaces and ünïcode"],
    ids=["whsec", "whsec-unpadded", "plain", "plain-unicode"],  # the key is random: ids every worker collects alike
)
def test_a_signature_made_here_verifies_with_the_library(secret: str) -> None:
    body = b'{"event":"job.transition","event_id":"0f3e"}'
    sent_at = int(time.time())
    headers = {
        "webhook-id": "0f3e",
        "webhook-timestamp": str(sent_at),
        "webhook-signature": sign_standard(webhook_signing_key(secret), "0f3e", sent_at, body),
    }
    assert verifier(secret).verify(body, headers) == json.loads(body)


def test_a_whsec_secret_is_the_base64_of_its_key_and_a_plain_one_its_utf8_bytes() -> None:
    key = secrets.token_bytes(24)
    assert webhook_signing_key(WEBHOOK_SECRET_PREFIX + base64.b64encode(key).decode()) == key
    assert webhook_signing_key("s3cret") == b"s3cret"


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        ("whsec_not base64!", "base64"),
        ("whsec_" + base64.b64encode(b"x" * 23).decode(), "24 to 64 bytes"),
        ("whsec_" + base64.b64encode(b"x" * 65).decode(), "24 to 64 bytes"),
        ("whsec_", "24 to 64 bytes"),
    ],
)
def test_a_whsec_secret_that_is_no_key_is_refused_at_start_naming_the_setting(secret: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"PODCAST_JOB_WEBHOOK_SECRET": secret})
    [message] = err.value.problems
    assert message.startswith("PODCAST_JOB_WEBHOOK_SECRET") and problem in message
    assert secret.removeprefix("whsec_") == "" or secret.removeprefix("whsec_") not in message  # never the value


def test_a_whsec_and_a_plain_secret_are_both_accepted() -> None:
    assert load_config({"PODCAST_JOB_WEBHOOK_SECRET": WHSEC})[0].webhook_secret == WHSEC
    assert load_config({"PODCAST_JOB_WEBHOOK_SECRET": PLAIN})[0].webhook_secret == PLAIN


# -- a real serve, a real receiver ---------------------------------------------------------------------------------


async def _serve_deliveries(tmp_path: Path, receiver: Receiver, secret: str) -> list[Delivery]:
    """A real ``supervisor serve`` with ``secret`` runs one job to its end; the deliveries of its three changes."""
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND="127.0.0.1:0",
        PODCAST_JOB_KINDS_FILE=str(kinds),
        PODCAST_JOB_WEBHOOK_URL=receiver.url,
        PODCAST_JOB_WEBHOOK_SECRET=secret,
        PODCAST_JOB_WEBHOOK_TIMEOUT_SEC="1",
    )
    log = tmp_path / "supervisor.log"
    with log.open("wb") as fh:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "supervisor", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=fh
        )
    try:
        url = ""
        with trio.fail_after(WAIT_S):
            while not url:
                for line in (await trio.to_thread.run_sync(log.read_text)).splitlines():
                    if '"supervisor_started"' in line:
                        url = json.loads(line)["url"]
                if proc.returncode is not None:
                    raise AssertionError(f"supervisor exited {proc.returncode}: {log.read_text()}")
                await trio.sleep(0.05)  # polling another process's log, under the deadline above
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(f"{url}/api/jobs", json={"kind": "exit", "params": {"code": 0}})
        job_id = answer.json()["job_id"]
        with trio.fail_after(WAIT_S):
            await receiver.wait_for(lambda r: statuses(r.events(), job_id)[-1:] == ["job.transition:succeeded"])
    finally:
        proc.terminate()
        with trio.move_on_after(WAIT_S) as waited:
            await proc.wait()
        if waited.cancelled_caught:
            proc.kill()
    return receiver.accepted


@pytest.fixture(params=[WHSEC, PLAIN], ids=["whsec", "plain"])
async def delivered(request: pytest.FixtureRequest, tmp_path: Path, receiver: Receiver) -> AsyncIterator[Any]:
    secret: str = request.param
    yield secret, await _serve_deliveries(tmp_path, receiver, secret)


class _SixMinutesLater(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) + timedelta(minutes=6)


@pytest.mark.e2e
async def test_every_delivery_of_a_real_serve_verifies_with_the_library(delivered: Any) -> None:
    secret, deliveries = delivered
    assert [d.json()["job"]["status"] for d in deliveries] == ["queued", "running", "succeeded"]
    verify = documented_verify()
    for delivery in deliveries:
        payload = verify(secret, delivery.body, delivery.headers)
        assert delivery.headers["webhook-id"] == payload["event_id"] == delivery.headers["x-podcast-event-id"]
        assert delivery.headers["webhook-timestamp"] == delivery.headers["x-podcast-timestamp"]
        assert abs(int(delivery.headers["webhook-timestamp"]) - time.time()) < WAIT_S
        assert delivery.signed_by(secret)  # the deprecated header, kept for one release, still holds


@pytest.mark.e2e
async def test_a_replayed_or_altered_delivery_is_refused_by_the_library(
    delivered: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret, deliveries = delivered
    verify, original = documented_verify(), deliveries[-1]
    verify(secret, original.body, original.headers)
    altered_body = original.body.replace(b'"succeeded"', b'"failed"', 1)
    assert altered_body != original.body
    refusals = {
        "altered body": (altered_body, original.headers),
        "altered id": (original.body, {**original.headers, "webhook-id": deliveries[0].headers["webhook-id"]}),
        "replay under a fresh timestamp": (
            original.body,
            {**original.headers, "webhook-timestamp": str(int(original.headers["webhook-timestamp"]) + 60)},
        ),
        "another delivery's signature": (
            original.body,
            {**original.headers, "webhook-signature": deliveries[0].headers["webhook-signature"]},
        ),
    }
    for what, (body, headers) in refusals.items():
        with pytest.raises(WebhookVerificationError, match="No matching signature"):
            verify(secret, body, headers)
            pytest.fail(what)
    # The very same bytes, replayed past the library's five-minute tolerance: refused for their age.
    monkeypatch.setattr(standard, "datetime", _SixMinutesLater)
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(secret, original.body, original.headers)


class _Alone:
    """The sender's gate held open: the one process that sends (no fleet)."""

    def may_lead(self) -> bool:
        return True


def test_an_embedders_config_with_a_bad_whsec_secret_is_refused_when_the_sender_is_built() -> None:
    config = Config(webhook_url="http://receiver.invalid/hook", webhook_secret="whsec_c2hvcnQ=")
    with pytest.raises(ConfigError, match="webhook_secret: a whsec_ secret encodes a key of 24 to 64 bytes"):
        WebhookSender(config, SqliteRegistry(Path("/nonexistent/never-opened.sqlite3")), lead=_Alone())
