"""Outbound HTTP: feeds, enclosures, the transcription provider.

ADR-150 D6: every call carries an explicit ``httpx.Timeout`` (connect/read/write/pool) -- the tight
deadline. ``tools/lint_timeouts.py`` enforces that each client construction and request says
``timeout=``. A read timeout does not bound a server that drips one byte per read interval; the
episode budget (a cancel scope, see ``_run``) is what bounds that.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import IO, Any

import httpx
import trio

from . import _fs
from ._config import TransportTimeouts
from ._errors import DownloadError, EnclosureTooLargeError, FeedFetchError, TranscriptionError

log = logging.getLogger(__name__)

_CHUNK_BYTES = 64 * 1024
USER_AGENT = "pipeline-runner/0.1"


def open_client(timeouts: TransportTimeouts, *, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=timeouts.as_httpx(),
        transport=transport,
        follow_redirects=True,
        headers={"User-Agent": USER_AGENT},
    )


# Transport failures that say nothing about the feed and may pass by themselves: the server was unreachable, or the
# connection broke (reset, closed mid-response). Not here: an unsupported scheme, too many redirects, undecodable
# content -- each says something about the feed's address or its bytes, and trying again later changes nothing.
_TRANSPORT_MAY_PASS = (httpx.NetworkError, httpx.RemoteProtocolError)
# What a request can fail with besides a timeout: httpx's own errors, and a host its URL parsing refuses outside them
# (an invalid IDNA label raises idna's IDNAError, a UnicodeError).
_REQUEST_FAILED = (httpx.HTTPError, httpx.InvalidURL, UnicodeError)


def _status_may_pass(status: int) -> bool:
    """A 5xx (the server's own trouble) or 429 (too many requests) may pass; any other status is the feed's answer."""
    return 500 <= status <= 599 or status == 429


def _declared_length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers["content-length"])
    except (KeyError, ValueError):
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class FeedDocument:
    body: bytes
    final_url: str  # relative URLs in the document resolve against this, not the URL asked for


class HttpSources:
    """The network side of one run. Each method raises only its own error from ``_errors``."""

    def __init__(self, client: httpx.AsyncClient, timeouts: TransportTimeouts) -> None:
        self._client = client
        self._timeout = timeouts.as_httpx()

    async def fetch_feed(self, url: str, *, max_bytes: int) -> FeedDocument:
        """The feed's bytes, and the URL they finally came from (after HTTP redirects).

        A failure that may pass by itself (see ``FeedError.transient``) is raised with ``transient=True``.
        """
        try:
            async with self._client.stream("GET", url, timeout=self._timeout) as response:
                if response.status_code != 200:
                    status = response.status_code
                    raise FeedFetchError(url, f"HTTP {status}", transient=_status_may_pass(status))
                declared = _declared_length(response)
                if declared is not None and declared > max_bytes:
                    raise FeedFetchError(url, f"Content-Length {declared} over the {max_bytes}-byte limit")
                body = bytearray()
                async for chunk in response.aiter_bytes(_CHUNK_BYTES):
                    body += chunk
                    if len(body) > max_bytes:
                        raise FeedFetchError(url, f"body over the {max_bytes}-byte limit")
                return FeedDocument(body=bytes(body), final_url=str(response.url))
        except httpx.TimeoutException as exc:
            raise FeedFetchError(url, f"transport timeout ({type(exc).__name__})", transient=True) from exc
        except _REQUEST_FAILED as exc:
            reason = f"transport error ({type(exc).__name__}: {exc})"
            raise FeedFetchError(url, reason, transient=isinstance(exc, _TRANSPORT_MAY_PASS)) from exc

    async def download(self, url: str, dest: Path, *, max_bytes: int) -> int:
        """Stream the enclosure into ``dest``; returns its size. Refuses before reading if it claims too much."""
        try:
            async with self._client.stream("GET", url, timeout=self._timeout) as response:
                if response.status_code != 200:
                    raise DownloadError(f"enclosure HTTP {response.status_code}")
                declared = _declared_length(response)
                if declared is not None and declared > max_bytes:
                    raise EnclosureTooLargeError(f"enclosure Content-Length {declared} over the {max_bytes}-byte limit")
                return await self._stream_to_file(response, dest, max_bytes)
        except httpx.TimeoutException as exc:
            raise DownloadError(f"enclosure transport timeout ({type(exc).__name__})") from exc
        except _REQUEST_FAILED as exc:
            raise DownloadError(f"enclosure transport error ({type(exc).__name__}: {exc})") from exc

    async def _stream_to_file(self, response: httpx.Response, dest: Path, max_bytes: int) -> int:
        fh: IO[bytes] = await _fs.run_blocking(dest.open, "wb")
        size = 0
        try:
            async for chunk in response.aiter_bytes(_CHUNK_BYTES):
                size += len(chunk)
                # Servers lie about Content-Length (or send none): the limit holds on what actually arrives.
                if size > max_bytes:
                    raise EnclosureTooLargeError(f"enclosure body over the {max_bytes}-byte limit")
                await _fs.run_blocking(fh.write, chunk)
        finally:
            with trio.CancelScope(shield=True):
                await _fs.run_blocking(fh.close)
        return size

    async def transcribe(self, url: str, audio: Path, *, metadata: dict[str, Any]) -> dict[str, Any]:
        """POST the audio to the provider; the answer must be a JSON object."""

        async def body() -> AsyncGenerator[bytes, None]:
            fh: IO[bytes] = await _fs.run_blocking(audio.open, "rb")
            try:
                while chunk := await _fs.run_blocking(fh.read, _CHUNK_BYTES):
                    yield chunk
            finally:
                with trio.CancelScope(shield=True):
                    await _fs.run_blocking(fh.close)

        stream = body()
        try:
            response = await self._client.post(
                url,
                content=stream,
                headers={"Content-Type": "application/octet-stream", "X-Episode": json.dumps(metadata)},
                timeout=self._timeout,
            )
        except httpx.TimeoutException as exc:
            raise TranscriptionError(f"transcription transport timeout ({type(exc).__name__})") from exc
        except _REQUEST_FAILED as exc:
            raise TranscriptionError(f"transcription transport error ({type(exc).__name__}: {exc})") from exc
        finally:
            # Close the generator here, in this task, rather than leaving it to the garbage collector.
            with trio.CancelScope(shield=True):
                await stream.aclose()
        if response.status_code != 200:
            raise TranscriptionError(f"transcription HTTP {response.status_code}")
        try:
            result = response.json()
        except ValueError as exc:
            raise TranscriptionError("transcription answer is not JSON") from exc
        if not isinstance(result, dict):
            raise TranscriptionError("transcription answer is not a JSON object")
        return result
