"""``Doorbell``: the wake-up the drainer, the webhook sender, the fleet's timekeeper and the heartbeat writer wait on
(ADR 0019). A hypothesis state machine rings it from other tasks, cancels the waiter's waits and lets virtual time
pass while the waiter is busy between waits; a ``MockClock`` that only the rules move keeps every step deterministic.

Invariants: no ring is lost (a ring is always followed by a return of ``wait`` once the waiter waits again); rings
made before the waiter runs again are taken as one; a cancelled wait takes nothing.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from trio_portal import Portal

from supervisor.domain import Doorbell


class DoorbellMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = trio.testing.MockClock()
        self.portal = Portal(clock=self.clock).__enter__()
        self.bell = Doorbell()
        self.rings = 0  # rings made
        self.unanswered = 0  # rings made since the waiter's last wake-up began its work
        self.wakeups = 0
        self.busy_s = 0.0  # how long the waiter works after each wake-up (the drainer's round, a delivery)
        self.waiter: trio.CancelScope | None = None
        self.wait_scope: trio.CancelScope | None = None
        self.portal.run(self._start_waiter)

    def teardown(self) -> None:
        self.portal.close()

    async def _start_waiter(self) -> None:
        async def waiter(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            while True:
                with trio.CancelScope() as self.wait_scope:
                    await self.bell.wait()
                    self.wakeups += 1
                    self.unanswered = 0  # its work reads the state as it is now: every ring so far is answered
                    await trio.sleep(self.busy_s)
                self.wait_scope = None

        assert self.portal.nursery is not None
        await self.portal.nursery.start(waiter)

    def _run(self, fn: Any, *args: Any) -> Any:
        async def in_virtual_time() -> Any:
            self.clock.autojump_threshold = 0
            try:
                result = await fn(*args)
                await trio.testing.wait_all_tasks_blocked()
                return result
            finally:
                self.clock.autojump_threshold = float("inf")

        return self.portal.run(in_virtual_time)

    @rule(times=st.integers(1, 3))
    def ring(self, times: int) -> None:
        async def ring() -> None:
            for _ in range(times):
                self.bell.ring()
                self.rings += 1
                self.unanswered += 1

        self._run(ring)

    @rule(seconds=st.sampled_from((0.0, 0.01, 1.0)))
    def waiter_busy_for(self, seconds: float) -> None:
        self.busy_s = seconds

    @rule(seconds=st.sampled_from((0.0, 0.005, 0.5, 2.0)))
    def advance(self, seconds: float) -> None:
        self._run(trio.sleep, seconds)

    @rule()
    def cancel_the_wait(self) -> None:
        """The waiter's wait (or its work) is cancelled: a wait cancelled takes no ring."""

        async def cancel() -> None:
            if self.wait_scope is not None:
                self.wait_scope.cancel()

        self._run(cancel)

    @rule()
    def settle(self) -> None:
        """Time passes past any work: every ring made is answered by a wake-up."""
        self.advance(3.0)
        assert self.unanswered == 0 and not self.bell.rung, (self.rings, self.wakeups)

    @invariant()
    def never_more_wakeups_than_rings(self) -> None:
        assert self.wakeups <= self.rings


TestDoorbell = DoorbellMachine.TestCase
TestDoorbell.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


async def test_a_ring_before_the_wait_is_kept_and_many_are_one(autojump_clock: trio.testing.MockClock) -> None:
    bell = Doorbell()
    bell.ring()
    bell.ring()
    with trio.fail_after(1):
        await bell.wait()  # at once: the ring was kept
    assert trio.current_time() == 0 and not bell.rung
    with trio.move_on_after(5) as waited:
        await bell.wait()  # both rings were taken by the first wait
    assert waited.cancelled_caught


async def test_a_cancelled_wait_takes_nothing(autojump_clock: trio.testing.MockClock) -> None:
    bell = Doorbell()
    with trio.move_on_after(1):
        await bell.wait()
    bell.ring()
    with trio.CancelScope() as scope:
        scope.cancel()
        await bell.wait()  # cancelled at its checkpoint: the ring stays
    assert bell.rung
    await bell.wait()
    assert not bell.rung and trio.current_time() == 1
