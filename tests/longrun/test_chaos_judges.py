"""The fleet chaos run's own judges (chaos.py beside it, ADR 0012) can fail: two leaders close together, a lead taken
before the previous holder's lease ran out, and a host's end of a process another host ran are each reported; a
handover the design allows, and a start that never happened, are not.

The run itself (tests/longrun/test_chaos_smoke.py) passes when the supervisor is right, so these show that its
INV-ONE-LEADER and INV-OWNER-JUDGES checks would see the bug if there were one, and report none where there is none.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

from supervisor.registry import Host

CHAOS = Path(__file__).resolve().parent / "chaos.py"
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
    """The chaos run's verdict counts rows against acknowledged jobs, and one extra row (a retried request
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


def _log(path: Path, *lines: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _end(job_id: str, to: str, pid: int | None, reason: str) -> dict[str, object]:
    """A host's log line of an attempt's end."""
    return {"event": "job_transition", "job_id": job_id, "from": "running", "to": to, "pid": pid, "reason": reason}


def test_INV_OWNER_JUDGES_an_end_names_its_process_and_only_the_host_that_ran_it_ends_it(tmp_path: Path) -> None:
    """The judge of who ended what matches each end line to a process by the pid it names, never by time: h1 ran the
    job's first attempt; h2 promoted the second and died before starting it, and its next boot put the row back in
    the queue (a line that names no process, logged after h1's run). That is no violation; matched by time, as the
    judge once did, it was one (most likely the false report that failed make test on 2026-12-04, 03:45). An end of
    h1's process logged by h2 is one, and so is a resubmission's line that names no process."""
    runs = {"j": [chaos.Run(1.0, 100, "h1", end=2.0)], "k": [chaos.Run(1.0, 200, "h1", end=2.0)]}
    h1 = _log(tmp_path / "h1-boot1.log", _end("j", "queued", 100, "resubmitted: killed_by_SIGKILL"))
    h2 = _log(tmp_path / "h2-boot2.log", _end("j", "queued", None, "never_started"))
    ends = chaos.judge_ends([h1, h2], runs)
    assert (ends.seen, ends.violations, len(ends.no_process), ends.unmatched) == (2, [], 1, [])
    wrong = _log(tmp_path / "h2-boot3.log", _end("k", "failed", 200, "killed_by_SIGKILL"))
    [violation] = chaos.judge_ends([h1, h2, wrong], runs).violations
    assert violation == "k: its process on h1 ended by h2 (h2-boot3.log)"
    nameless = _log(tmp_path / "h1-boot4.log", _end("k", "queued", None, "resubmitted: killed_by_SIGKILL"))
    [violation] = chaos.judge_ends([nameless], runs).violations
    assert violation.startswith("k: an end of its process names none (h1-boot4.log")
    # The leader's end of a silent host's process, proven and said: no violation.
    said = {"event": "silent_host_job_ended", "job_id": "k", "host_id": "h1"}
    leader = _log(tmp_path / "h2-boot5.log", _end("k", "failed", 200, "killed_by_SIGKILL"), said)
    proven = chaos.judge_ends([leader], runs)
    assert (proven.by_proof, proven.violations) == (1, [])
