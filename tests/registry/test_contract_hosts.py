"""The fleet's part of the contract (ADR 0012): host leases, the one leader, the host recorded on each promoted row.

Every backend: two supervisors on one registry must never both lead, a lead passes only once its holder's lease has
expired, and a row says which host promoted it (only that host judges its process)."""

from __future__ import annotations

import pytest
from registry_helpers import WallClock, new_job, request

from supervisor.domain import Conflict, HostForgotten, JobStatus
from supervisor.registry import (
    Ending,
    Expect,
    IdentityClaim,
    IdentityRecord,
    Outcome,
    PromoteRequest,
    Registry,
)

LEASE_S = 15.0


async def test_a_host_registers_renews_and_is_listed(registry: Registry, clock: WallClock) -> None:
    first = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=False)
    assert (first.host.host_id, first.host.boot_id, first.replaced) == ("a", "boot-a", None)
    assert (first.host.lease_expires_at - clock.now).total_seconds() == LEASE_S
    clock.advance(5)
    renewed = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=False)
    assert renewed.host.started_at == first.host.started_at  # the same boot: renewed, not re-registered
    assert renewed.host.last_seen_at == clock.now
    assert (renewed.host.lease_expires_at - clock.now).total_seconds() == LEASE_S
    await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=False)
    assert [(h.host_id, h.boot_id) for h in await registry.hosts()] == [("a", "boot-a"), ("b", "boot-b")]


async def test_INV_LEASE_ON_REGISTRY_CLOCK_a_read_judges_every_lease_at_the_registrys_clock_as_of_the_read(
    registry: Registry, clock: WallClock
) -> None:
    """``Host.live`` is the registry's verdict at the read, not a comparison with the reader's clock: a lease
    expires for every reader at once, with no write in between."""
    await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    clock.advance(LEASE_S - 1)
    [host] = await registry.hosts()
    leader = await registry.leader()
    assert (host.as_of, host.live) == (clock.now, True)
    assert leader is not None and (leader.as_of, leader.live) == (clock.now, True)
    clock.advance(1)  # expired now, and nothing was written since
    [host] = await registry.hosts()
    leader = await registry.leader()
    assert (host.as_of, host.live) == (clock.now, False)
    assert leader is not None and (leader.host_id, leader.live) == ("a", False)  # still the row, no longer live


async def test_a_new_boot_of_a_host_replaces_its_row_and_says_whose_lease_it_cut(
    registry: Registry, clock: WallClock
) -> None:
    await registry.renew_lease("a", "boot-1", lease_s=LEASE_S, lead=False)
    clock.advance(1)
    lease = await registry.renew_lease("a", "boot-2", lease_s=LEASE_S, lead=False)
    assert lease.host.boot_id == "boot-2" and lease.host.started_at == clock.now
    assert lease.replaced is not None and lease.replaced.boot_id == "boot-1" and lease.replaced.live
    assert [h.boot_id for h in await registry.hosts()] == ["boot-2"]


async def test_INV_ONE_LEADER_the_lead_passes_only_once_the_holders_lease_has_expired(
    registry: Registry, clock: WallClock
) -> None:
    a = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    assert a.leading
    b = await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=True)
    assert not b.leading and b.leader is not None and b.leader.host_id == "a"
    clock.advance(LEASE_S - 1)  # a silent leader, not yet expired: still the leader
    b = await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=True)
    assert not b.leading
    clock.advance(1)  # expired now
    b = await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=True)
    assert b.leading and b.leader is not None and b.leader.started_at == clock.now  # leads since now
    a = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)  # the old leader comes back: follows
    assert not a.leading and a.leader is not None and a.leader.host_id == "b"
    leader = await registry.leader()
    assert leader is not None and (leader.host_id, leader.boot_id) == ("b", "boot-b")


async def test_a_boot_that_succeeds_its_hosts_previous_boot_takes_its_lead_at_once(
    registry: Registry, clock: WallClock
) -> None:
    """A crash-restarted host proved its previous boot gone (the data dir's lock): that boot's lead is taken
    at once, not after its lease. Only that boot's: a claim to succeed another boot, or another host's, moves
    nothing, so two machines given one host id never lead together."""
    await registry.renew_lease("h", "boot-1", lease_s=LEASE_S, lead=True)
    clock.advance(1)
    # A second machine with the same host id: its own data dir names its own previous boot (or none).
    other = await registry.renew_lease("h", "boot-9", lease_s=LEASE_S, lead=True, succeeds="boot-8")
    assert not other.leading and other.leader is not None and other.leader.boot_id == "boot-1"
    plain = await registry.renew_lease("h", "boot-2", lease_s=LEASE_S, lead=True)
    assert not plain.leading  # without the proof: the lease must run out first
    restarted = await registry.renew_lease("h", "boot-2", lease_s=LEASE_S, lead=True, succeeds="boot-1")
    assert restarted.leading and restarted.leader is not None and restarted.leader.started_at == clock.now
    # Another host cannot succeed a boot that is not its own: its claim moves nothing.
    await registry.renew_lease("g", "boot-g", lease_s=LEASE_S, lead=True, succeeds="boot-2")
    leader = await registry.leader()
    assert leader is not None and (leader.host_id, leader.boot_id) == ("h", "boot-2")


async def test_a_leader_renews_its_lead_and_gives_it_up_when_it_no_longer_asks(
    registry: Registry, clock: WallClock
) -> None:
    await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    clock.advance(10)
    a = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    assert a.leading and a.leader is not None and a.leader.lease_expires_at == a.host.lease_expires_at
    a = await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=False)
    assert not a.leading and a.leader is None
    b = await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=True)
    assert b.leading


async def test_a_released_lease_ends_now_and_frees_the_lead(registry: Registry, clock: WallClock) -> None:
    await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    await registry.release_lease("a", "boot-a")
    [host] = await registry.hosts()
    assert not host.live
    assert await registry.leader() is None
    assert (await registry.renew_lease("b", "boot-b", lease_s=LEASE_S, lead=True)).leading
    # Releasing with another boot's id (a stale shutdown racing a restart) changes nothing.
    await registry.renew_lease("a", "boot-a2", lease_s=LEASE_S, lead=False)
    await registry.release_lease("a", "boot-a")
    assert [h.live for h in await registry.hosts() if h.host_id == "a"] == [True]


async def test_INV_FORGET_IS_FENCED_a_host_is_forgotten_only_once_its_lease_expired_and_its_boot_never_renews(
    registry: Registry, clock: WallClock
) -> None:
    await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    clock.advance(LEASE_S - 1)
    with pytest.raises(Conflict, match="live lease"):
        await registry.forget_host("a")  # live at the registry's clock: refused, nothing changed
    assert [h.boot_id for h in await registry.hosts()] == ["boot-a"]
    clock.advance(1)  # expired now
    forgotten = await registry.forget_host("a")
    assert forgotten is not None and forgotten.boot_id == "boot-a"
    assert await registry.hosts() == [] and await registry.leader() is None
    # The forgotten boot comes back (a partition healed): refused, a distinct error; nothing registered, no lead.
    with pytest.raises(HostForgotten) as refused:
        await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=True)
    assert (refused.value.host_id, refused.value.boot_id) == ("a", "boot-a")
    assert await registry.hosts() == [] and await registry.leader() is None
    assert await registry.forget_host("a") is None  # nothing left to forget
    # A new boot with that host id registers (and leads) as usual.
    again = await registry.renew_lease("a", "boot-a2", lease_s=LEASE_S, lead=True)
    assert again.leading and again.replaced is None
    await registry.release_lease("a", "boot-a")  # the forgotten boot's clean stop touches nothing of the new one
    assert [(h.boot_id, h.live) for h in await registry.hosts()] == [("boot-a2", True)]


async def test_a_promoted_row_records_the_promoting_host_and_forgets_it_when_it_goes_back_to_the_queue(
    registry: Registry,
) -> None:
    (await registry.enqueue(new_job()))
    [job] = (await registry.promote(PromoteRequest(1, "boot-test", [request().token_hashes[0]], host_id="h1"))).jobs
    assert job.host_id == "h1" and (await registry.get(job.job_id)).host_id == "h1"
    assert job.public()["host_id"] == "h1"
    back = await registry.requeue(job.job_id, expect=Expect(None), reason="never_started")
    assert back.changed and back.job.status is JobStatus.QUEUED and back.job.host_id is None


async def test_a_host_cap_limits_that_hosts_running_rows_within_the_fleet_limit(registry: Registry) -> None:
    for n in range(6):
        await registry.enqueue(new_job(n))

    def promote(host: str, cap: int | None, *tokens: str) -> PromoteRequest:
        return PromoteRequest(5, "boot-test", [request(1, t).token_hashes[0] for t in tokens], host_id=host,
                              host_max_concurrent=cap)

    # Host a may run 2 of the fleet's 5, whatever it asks for.
    first = await registry.promote(promote("a", 2, "t1", "t2", "t3"))
    assert [j.host_id for j in first.jobs] == ["a", "a"]
    assert (await registry.promote(promote("a", 2, "t4"))).jobs == ()
    # Host b, without a cap of its own, takes what the fleet has left: 3 more, then none (5 in all).
    second = await registry.promote(promote("b", None, "t5", "t6", "t7", "t8"))
    assert [j.host_id for j in second.jobs] == ["b", "b", "b"]
    assert (await registry.counts())["running"] == 5
    assert (await registry.promote(promote("c", 3, "t9"))).jobs == ()


async def test_a_fleet_setting_is_the_first_recorded_unless_replaced(registry: Registry, clock: WallClock) -> None:
    first = await registry.record_setting("max_concurrent", "4", "a", replace=False)
    assert (first.value, first.host_id, first.recorded_at) == ("4", "a", clock.now)
    clock.advance(1)
    other = await registry.record_setting("max_concurrent", "6", "b", replace=False)
    assert (other.value, other.host_id, other.recorded_at) == ("4", "a", first.recorded_at)  # the first one wins
    replaced = await registry.record_setting("max_concurrent", "6", "b", replace=True)  # b started alone
    assert (replaced.value, replaced.host_id, replaced.recorded_at) == ("6", "b", clock.now)


async def test_INV_SILENT_HOST_ENDS_BY_PROOF_an_end_for_a_silent_host_is_refused_once_its_lease_is_live(
    registry: Registry, clock: WallClock
) -> None:
    """``Expect.host_silent``: the end lands only while the row's host holds no live lease, checked in the write's
    own step, so that a host that came back judges its own rows."""
    identity = IdentityRecord("container", {"container_id": "c" * 64})
    ended = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)
    await registry.renew_lease("a", "boot-a", lease_s=LEASE_S, lead=False)
    rows = []
    for n in range(2):
        await registry.enqueue(new_job(n))
        [job] = (await registry.promote(PromoteRequest(5, "boot-a", [request(1, f"t{n}").token_hashes[0]],
                                                      host_id="a"))).jobs
        [job] = await registry.record_identities([IdentityClaim(job.job_id, identity)])
        rows.append(job)
    live = await registry.finalize(rows[0].job_id, ended, expect=Expect(identity, host_silent=True))
    assert not live.changed and live.job.status is JobStatus.RUNNING  # a's lease is live: a's to judge
    clock.advance(LEASE_S)  # expired
    silent = await registry.finalize(rows[0].job_id, ended, expect=Expect(identity, host_silent=True))
    assert silent.changed and silent.job.status is JobStatus.SUCCEEDED
    await registry.renew_lease("a", "boot-a2", lease_s=LEASE_S, lead=False)  # a comes back (a new boot)
    back = await registry.finalize(rows[1].job_id, ended, expect=Expect(identity, host_silent=True))
    assert not back.changed and back.job.status is JobStatus.RUNNING
