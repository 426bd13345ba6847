"""One call at a time for many concurrent callers: what arrives during a call goes together in the next.

Used where each call costs far more than each item in it: the registry's writes (``SqliteBackend.write``: one
thread hop, and one group commit, for the changes queued during the previous one: an enqueue, a job's start and
end, the beats written behind).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

I = TypeVar("I")  # noqa: E741 - the item a caller submits
O = TypeVar("O")  # noqa: E741 - what its caller gets back


@dataclass
class _Waiting(Generic[I, O]):
    item: I
    woken: trio.Event = field(default_factory=trio.Event)
    lead: bool = False  # woken to make the next call, not with a result
    result: O | BaseException | None = None


class Coalescer(Generic[I, O]):
    """Coalesce concurrent callers' items into one call of ``call`` per batch.

    No task of its own: the first item that finds no call in flight makes one (its caller *leads*) with every item
    queued so far; the items that arrive meanwhile queue, and when the call is done the leader hands the queue to the
    oldest of them, whose caller makes the next call. So a lone item goes at once (no timer, no added latency), an
    item waits at most for the call in flight, and under load each call holds every item that arrived during the
    previous one.

    ``call`` takes a batch and gives, per item in order, its result or the exception its caller is to raise (an
    exception from ``call`` itself is every item's). ``delivered`` (optional) sees each result in batch order,
    before any caller resumes. Shielded once queued: a queued item is someone's batch, and a leader that stopped
    halfway would strand every item behind it, so ``call`` must be bounded (a registry call is, by SQLite's busy
    timeout).
    """

    def __init__(
        self,
        call: Callable[[Sequence[I]], Awaitable[Sequence[O | BaseException]]],
        delivered: Callable[[O], None] | None = None,
    ) -> None:
        self._call = call
        self._delivered = delivered
        self._queue: list[_Waiting[I, O]] = []
        self._busy = False
        self.calls = 0  # made so far (for tests and the benchmark's curiosity)

    async def submit(self, item: I) -> O:
        """Have ``item`` in this caller's call or a later one; its result once that call is done."""
        me: _Waiting[I, O] = _Waiting(item)
        self._queue.append(me)
        with trio.CancelScope(shield=True):
            if self._busy:
                await me.woken.wait()
            else:
                self._busy = True
                me.lead = True
            if me.lead:
                await self._lead()
        result = me.result
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[return-value]  # set by the leader: never None once woken

    async def _lead(self) -> None:
        batch, self._queue = self._queue, []
        try:
            results: Sequence[O | BaseException] = await self._call([w.item for w in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} items was answered with {len(results)} results")
        except Exception as exc:  # the whole call failed (the registry is unavailable, say): each item says so
            results = [exc] * len(batch)
        finally:
            self.calls += 1
            # Whatever happened, the queue gets a new leader (or the coalescer goes idle): nothing is ever stranded.
            if self._queue:
                nxt = self._queue[0]
                nxt.lead = True
                nxt.woken.set()
            else:
                self._busy = False
        for waiting, result in zip(batch, results, strict=True):
            waiting.result = result
            if self._delivered is not None and not isinstance(result, BaseException):
                self._delivered(result)
            if not waiting.lead:
                waiting.woken.set()
