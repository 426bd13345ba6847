"""The event seam: one synchronous bus; a failing subscriber never stops the others nor the change."""

from __future__ import annotations

from collections.abc import Callable

from core_helpers import wait_idle, wait_terminal  # type: ignore[import-not-found]
from structlog.testing import capture_logs

from supervisor import JobStatus, Supervisor
from supervisor.domain import IdentityRecord, hash_token
from supervisor.observe import EventName, JobEvent
from supervisor.registry import IdentityClaim, PromoteRequest


async def test_every_transition_reaches_every_subscriber_even_past_a_failing_one(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    seen: list[JobEvent] = []

    def broken(event: JobEvent) -> None:
        raise RuntimeError("a subscriber with a bug")

    sup.events.subscribe(broken)
    sup.events.subscribe(seen.append)
    with capture_logs() as logs:
        job = (await sup.enqueue("exit", {"code": 3})).job
        final = await wait_terminal(sup, job.job_id)
        await wait_idle(sup)
    assert final.status is JobStatus.FAILED  # the change happened whatever a subscriber did
    assert [(e.event, e.previous_status, str(e.job.status), e.reason) for e in seen] == [
        (EventName.TRANSITION, None, "queued", "enqueued"),
        (EventName.TRANSITION, "queued", "running", "promoted"),
        (EventName.TRANSITION, "running", "failed", "exit_code_3"),
    ]
    assert all(e.boot_id == sup.boot_id for e in seen)
    assert sum(1 for e in logs if e["event"] == "event_subscriber_failed") == 3
    # The log is a subscriber too (before the broken one): one line per transition, as before the bus.
    assert [e["to"] for e in logs if e["event"] == "job_transition"] == ["queued", "running", "failed"]


async def test_a_job_never_inherits_the_webhook_secret_nor_the_service_managers_socket(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(
        base_env={
            "PATH": "/usr/bin",
            "PODCAST_JOB_WEBHOOK_SECRET": "hmac-key",
            "NOTIFY_SOCKET": "/run/systemd/notify",
            "WATCHDOG_USEC": "60000000",
            "WATCHDOG_PID": "1",
        }
    )
    job = (await sup.enqueue("show_env", {})).job
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED
    names = (await sup.read_log(job.job_id)).decode()
    assert "PODCAST_JOB_TOKEN" in names
    for private in ("PODCAST_JOB_WEBHOOK_SECRET", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert private not in names


async def test_an_adoption_is_logged_once_naming_the_process_found_not_a_subscriber_failure(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """The adoption event carries the handle's fields (`pid` or `container_id`), which the row may also hold: the
    log line takes the event's, instead of failing on a keyword given twice."""
    sup = make_supervisor(attach=False)
    job = (await sup.enqueue("exit", {"code": 0})).job
    await sup.registry.promote(PromoteRequest(1, "old", [hash_token("t")]))
    record = IdentityRecord("process", {"pid": 41, "pid_start_time": 7, "kernel_boot_id": "k"})
    [job] = await sup.registry.record_identities([IdentityClaim(job.job_id, record)])
    with capture_logs() as logs:
        sup.events.emit(JobEvent(EventName.ADOPTED, job, "running", "adopted", "new", {"prior_boot": "old", "pid": 42}))
    assert not [e for e in logs if e["event"] == "event_subscriber_failed"]
    [line] = [e for e in logs if e["event"] == "job_adopted"]
    assert (line["pid"], line["prior_boot"]) == (42, "old")
