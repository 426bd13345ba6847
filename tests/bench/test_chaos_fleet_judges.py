"""The fleet chaos run's own judges (bench/chaos.py, issue 27) can fail: two leaders close together, and a lead taken
before the previous holder's lease ran out, are each reported; a handover the design allows is not.

The run itself (tests/core/test_core_chaos_smoke.py) passes when the supervisor is right, so these show that its
INV-ONE-LEADER checks would see the bug if there were one.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

from supervisor.registry import Host

CHAOS = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
T0 = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)


def load_chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_chaos", CHAOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_chaos", module)
    spec.loader.exec_module(module)
    return module


chaos = load_chaos()


def test_INV_ONE_LEADER_two_boots_saying_they_lead_within_the_margin_are_two_leaders() -> None:
    claims = [
        chaos.Claim("h1", "boot-a", sent=10.0, answered=10.05),
        chaos.Claim("h1", "boot-a", sent=10.1, answered=10.15),  # the same boot again: one leader
        chaos.Claim("h2", "boot-b", sent=10.2, answered=10.3),  # 0.3 s after h1 said so: the margin is 0.6 s
    ]
    found = chaos.overlapping_claims(claims, 0.6)
    assert len(found) == 2 and all("h1" in f and "h2" in f for f in found)  # each of h1's answers with h2's
    # A new boot of the same host is another leader too.
    assert chaos.overlapping_claims([claims[0], chaos.Claim("h1", "boot-c", 10.2, 10.3)], 0.6)


def test_INV_ONE_LEADER_a_handover_after_the_margin_is_not_two_leaders() -> None:
    claims = [chaos.Claim("h1", "boot-a", 10.0, 10.05), chaos.Claim("h2", "boot-b", 10.7, 10.75)]
    assert chaos.overlapping_claims(claims, 0.6) == []


def host(host_id: str, boot_id: str, since_s: float, expires_s: float) -> Host:
    since, expires = T0 + timedelta(seconds=since_s), T0 + timedelta(seconds=expires_s)
    return Host(host_id, boot_id, since, since, expires, as_of=since)


def test_INV_ONE_LEADER_a_lead_taken_before_the_holders_lease_ran_out_is_reported() -> None:
    early = [host("h1", "boot-a", 0, 3), host("h2", "boot-b", 2.5, 5.5)]
    [found] = chaos.leader_handovers(early)
    assert found.startswith("h2 (boot boot-b)")
    in_time = [host("h1", "boot-a", 0, 3), host("h2", "boot-b", 3.2, 6.2), host("h1", "boot-c", 6.5, 9.5)]
    assert chaos.leader_handovers(in_time) == []


def test_INV_KEY_ONCE_one_row_more_than_the_acknowledged_jobs_fails_the_run(tmp_path: Path) -> None:
    """Issue 35: the chaos run's verdict counts rows against acknowledged jobs, and one extra row (a retried request
    that made a second job) fails it, even when that job ran once and ended well."""
    import random

    from supervisor.domain import Job, JobStatus

    def row(job_id: str) -> Job:
        return Job(
            job_id=job_id, seq=0, kind=chaos.KIND, params={}, argv=[], status=JobStatus.SUCCEEDED, error_reason=None,
            exit_code=0, created_at=T0, started_at=T0, ended_at=T0, attempts=1, cancel_requested=False, boot_id=None,
            identity=None, token_hash=None, completed_units=0, total_units=None, stage=None, last_heartbeat_at=None,
            last_progress_at=None, log_path=None, max_attempts=chaos.MAX_ATTEMPTS,
        )  # fmt: skip

    journal = chaos.Journal(tmp_path / "journal")
    for job_id in ("a", "b"):
        journal.runs[job_id] = [chaos.Run(1.0, 100, end=2.0)]
    plan = chaos.Plan("subprocess", 2, 3, 0, 25, 1.0)
    observer = chaos.Observer("subprocess", journal, lambda: None, random.Random(0), 1.0)
    enqueuer = chaos.Enqueuer(["http://x"], [0.1], 0.1, random.Random(0))

    def verdict(acked: list[str]) -> dict[str, str]:
        report = chaos.judge(plan, [row("a"), row("b")], acked, journal, observer, enqueuer, [], [])
        return {check["name"]: check["verdict"] for check in report["checks"]}

    name = "as many rows as acknowledged jobs: no retried request made a second row"
    assert verdict(["a", "b"])[name] == "PASS"
    extra = verdict(["a"])
    assert extra[name] == "FAIL"
    assert all(v == "PASS" for k, v in extra.items() if k != name)


def test_a_lead_taken_at_once_by_a_boot_that_succeeds_its_hosts_dead_boot_is_no_second_leader() -> None:
    """ADR 0012 §9: a restarted host, its dead boot proved gone by the data dir's lock, leads at once; the judge
    accepts exactly that succession (named by the new boot's host_restarted line), and nothing else early."""
    early = [host("h1", "boot-a", 0, 3), host("h1", "boot-b", 1.0, 4.0)]
    assert chaos.leader_handovers(early, frozenset({("boot-a", "boot-b")})) == []
    assert chaos.leader_handovers(early)  # without the proof it is reported
    other_host = [host("h1", "boot-a", 0, 3), host("h2", "boot-b", 1.0, 4.0)]
    assert chaos.leader_handovers(other_host, frozenset({("boot-a", "boot-b")}))  # only the same host's boot
    claims = [chaos.Claim("h1", "boot-a", 10.0, 10.05), chaos.Claim("h1", "boot-b", 10.2, 10.3)]
    assert chaos.overlapping_claims(claims, 0.6, frozenset({("boot-a", "boot-b")})) == []
    assert chaos.overlapping_claims(claims, 0.6)
