"""A host drained on purpose, in virtual time (docs/fleet.md § Draining a host): one host, as a lone supervisor on
SQLite runs (the registry's rules are the contract suite's on every backend). It starts nothing new, its running job
ends under its watch with its true outcome and first attempt, it hands the lead over, it reports ``drained`` once it
holds nothing, a restart keeps the drain, and an undrain lets the queue move again."""

from __future__ import annotations

from supervisor.testing import Scenario


async def host_view(sc: Scenario) -> dict[str, object]:
    assert sc.supervisor is not None
    view = await sc.supervisor.hosts()
    [host] = view["hosts"]
    return {"drain": host["drain"], "running_jobs": host["running_jobs"], "leader": view["leader"]}


async def test_INV_DRAIN_STOPS_PROMOTION_a_drained_lone_host_finishes_its_job_starts_none_and_resumes_when_undrained(
    supervisor_scenario: Scenario,
) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(run_for=100)}, max_concurrent=2, host_lease_s=3)
    running = await sc.enqueue("work")
    await sc.advance(1)
    assert sc.supervisor is not None
    host_id = sc.supervisor.boot.host_id
    answer = await sc.supervisor.drain_host(host_id, True, "ops")
    assert (answer["changed"], answer["drain"]) == (True, "draining")
    waiting = await sc.enqueue("work")
    await sc.advance(50)
    assert [(await sc.job(j)).status for j in (running, waiting)] == ["running", "queued"]
    # INV-DRAINED-HANDS-OVER: at its next renewal it let go of the lead (nobody else here to take it).
    assert await host_view(sc) == {"drain": "draining", "running_jobs": 1, "leader": None}
    await sc.advance(50)
    done = await sc.job(running)
    assert (done.status, done.attempts) == ("succeeded", 1)
    assert (await sc.job(waiting)).status == "queued"
    assert await host_view(sc) == {"drain": "drained", "running_jobs": 0, "leader": None}
    # Stopped and started again (the new release on this host): it stays drained until the operator says otherwise.
    await sc.crash()
    await sc.restart()
    await sc.advance(10)
    assert (await sc.job(waiting)).status == "queued"
    assert sc.supervisor is not None
    await sc.supervisor.drain_host(host_id, False, "ops")
    await sc.advance(5)
    assert (await sc.job(waiting)).status == "running"
    assert (await host_view(sc))["drain"] is None
    events = [line["event"] for line in sc.log()]
    assert "host_draining" in events and "fleet_leader_handed_over" in events and "host_undrained" in events
    assert "fleet_leader_stepped_down" not in events
