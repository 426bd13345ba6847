"""Draining a host on purpose (docs/fleet.md § Draining a host), on every backend: the registry state every host
sees. A drained host promotes nothing from the drain's commit on (INV-DRAIN-STOPS-PROMOTION), neither takes nor keeps
the lead (INV-DRAINED-HANDS-OVER), keeps its lease and its running rows; undrained, it promotes again. Each lease
records the release its host runs and the contract level it honours."""

from __future__ import annotations

from dataclasses import replace

import pytest
from registry_helpers import WallClock, new_job, request

from supervisor.domain import RELEASE, HostNotFound, JobStatus
from supervisor.registry import Registry

LEASE_S = 15.0


async def test_INV_DRAIN_STOPS_PROMOTION_a_drained_host_promotes_nothing_while_others_do(registry: Registry) -> None:
    await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=False)
    await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=False)
    running = await registry.enqueue(new_job(0))
    assert (await registry.promote(replace(request(4, "t0"), host_id="a"))).jobs[0].job_id == running.job.job_id
    for n in range(1, 3):
        await registry.enqueue(new_job(n))
    assert await registry.set_drained("a", True, by="ops") is True
    assert await registry.set_drained("a", True, by="ops") is False  # said twice: nothing changes
    assert set(await registry.drained()) == {"a"}
    assert (await registry.promote(replace(request(4, "t1", "t2"), host_id="a"))).jobs == ()
    # Its running row is untouched: it runs to its end under its own host's watch.
    assert (await registry.get(running.job.job_id)).status is JobStatus.RUNNING
    # Another host promotes as before, the drained host's running row counted in the fleet-wide limit.
    taken = await registry.promote(replace(request(2, "t3", "t4"), host_id="b"))
    assert len(taken.jobs) == 1
    assert await registry.set_drained("a", False) is True
    assert await registry.drained() == {}
    assert len((await registry.promote(replace(request(3, "t5"), host_id="a"))).jobs) == 1


async def test_INV_DRAINED_HANDS_OVER_a_drained_leader_lets_go_of_the_lead_at_its_renewal_and_another_takes_it(
    registry: Registry, clock: WallClock
) -> None:
    assert (await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)).leading
    assert not (await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=True)).leading
    await registry.set_drained("a", True)
    clock.advance(1)
    lease = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    assert (lease.drained, lease.leading, lease.host.live) == (True, False, True)  # it keeps its lease
    assert await registry.leader() is None
    assert (await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=True)).leading
    # Undrained, it may promote again but waits for the lead like any other host.
    await registry.set_drained("a", False)
    lease = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    assert (lease.drained, lease.leading) == (False, False)


async def test_a_drain_outlives_the_hosts_restart_and_ends_with_a_forget(registry: Registry, clock: WallClock) -> None:
    await registry.renew_lease("a", "boot-1", lease_s=LEASE_S, lead=False)
    await registry.set_drained("a", True)
    await registry.release_lease("a", "boot-1")  # stopped
    # Its next boot (the new release) starts drained: the operator undrains it once it is up.
    assert (await registry.renew_lease("a", "boot-2", lease_s=LEASE_S, lead=True)).drained
    await registry.release_lease("a", "boot-2")
    await registry.forget_host("a")
    assert await registry.drained() == {}


async def test_a_host_that_never_registered_cannot_be_drained(registry: Registry) -> None:
    with pytest.raises(HostNotFound):
        await registry.set_drained("typo", True)
    with pytest.raises(HostNotFound):
        await registry.set_drained("typo", False)


async def test_each_lease_records_its_release_and_contract_level(registry: Registry) -> None:
    lease = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=False)
    assert (lease.host.release, lease.host.contract_level) == (RELEASE, registry.contract_level)
    [host] = await registry.hosts()
    assert (host.release, host.contract_level) == (RELEASE, registry.contract_level)
