"""Enqueues through a lossy network the way a careful client does (ADR 0016): each request has its own
Idempotency-Key, and a request whose answer did not come back is sent again with that key -- by the CLI's own retry
(``supervisor.cli.with_retries``) -- to the next of ``urls`` each time (a client that switches host on each retry).
What it returns is what was acknowledged: the job ids of the answers that came back. A module of ``tests/``,
importable from every test directory."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from supervisor.cli import Client, with_retries

ATTEMPTS = 40  # at a loss of 30 % per request, 40 in a row is a chance of 1e-21: never, in practice


@dataclass
class Acknowledged:
    job_ids: list[str] = field(default_factory=list)  # every job id an answer named, in the order answered
    texts: dict[str, str] = field(default_factory=dict)  # job id -> the text its request sent
    retries: int = 0  # requests sent again after no answer (or a 503)


def enqueue_through_loss(
    urls: list[str], *, kind: str, singles: int, batches: int, batch_size: int, tag: str = "t"
) -> Acknowledged:
    """``singles`` jobs one request each, then ``batches`` of ``batch_size``; each job's param ``text`` is unique."""
    clients = [_one_request_per_connection(url) for url in urls]
    turn = itertools.cycle(clients)
    acknowledged = Acknowledged()

    def counted(*_: Any) -> None:
        acknowledged.retries += 1

    try:
        for n in range(singles):
            text = f"{tag}-single-{n}"
            answer = _send(lambda: next(turn).enqueue(kind, {"text": text}, idempotency_key=f"{tag}-s{n}"), counted)  # noqa: B023
            acknowledged.job_ids.append(answer["job_id"])
            acknowledged.texts[answer["job_id"]] = text
        for b in range(batches):
            texts = [f"{tag}-batch-{b}-{n}" for n in range(batch_size)]
            jobs = [{"kind": kind, "params": {"text": text}} for text in texts]
            answer = _send(lambda: next(turn).enqueue_batch(jobs, idempotency_key=f"{tag}-b{b}"), counted)  # noqa: B023
            for text, job in zip(texts, answer["jobs"], strict=True):
                acknowledged.job_ids.append(job["job_id"])
                acknowledged.texts[job["job_id"]] = text
    finally:
        for client in clients:
            client.close()
    return acknowledged


def _send(request: Callable[[], dict[str, Any]], counted: Callable[..., None]) -> dict[str, Any]:
    """``request`` (called at once, in this loop turn) and its retries, sent again without waiting."""
    return with_retries(request, on_retry=counted, sleep=lambda _: None, attempts=ATTEMPTS)


def _one_request_per_connection(url: str) -> Client:
    """The CLI's client, on a connection of its own per request: the proxy loses whole requests or whole answers."""
    return Client(url, transport=httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0)))
