"""Helpers for the core tests (a uniquely named module: several test packages have a conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Collection
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import pytest
import trio
from serve_process import beater_kind  # type: ignore[import-not-found]

from supervisor import Job, JobStatus, RequestError, SqliteRegistry, Supervisor
from supervisor.api import parse_progress
from supervisor.core import Heartbeats
from supervisor.domain import IdentityRecord, hash_token, to_iso, utc_now
from supervisor.execution.subprocess import ProcessIdentity, identify, marker_path
from supervisor.registry import IdentityClaim, NewJob, PromoteRequest, Promotion

T = TypeVar("T")

KINDS = """
[kinds.sleep]
argv = ["{python}", "-c", "import sys, threading; threading.Event().wait(float(sys.argv[1]))", "{seconds}"]
params = { seconds = "float" }

[kinds.exit]
argv = ["{python}", "-c", "import sys; print('bye'); sys.exit(int(sys.argv[1]))", "{code}"]
params = { code = "int" }

[kinds.show_env]
argv = ["{python}", "-c", "import os; print(sorted(os.environ))"]

[kinds.daemonizer]
argv = ["{python}", "-c", '''
import os, sys, threading
if os.fork() == 0:
    threading.Event().wait(8)  # a daemon that keeps the job's stdout open after the job exits
    os._exit(0)
print("parent done", flush=True)
''']

[kinds.gated]
argv = ["{python}", "-c", '''
import os, sys, threading
while not os.path.exists(sys.argv[1]):
    threading.Event().wait(0.01)
print("gate open", flush=True)
sys.exit(int(sys.argv[2]))
''', "{gate}", "{code}"]
params = { gate = "str", code = "int" }
then = "done"


[kinds.budget]
argv = ["{python}", "-c", "import sys; sys.exit(10)"]
exit_reasons = { 10 = "budget_exhausted" }

[kinds.nothing_to_do]
argv = ["{python}", "-c", "import sys; sys.exit(3)"]
failure_reasons = { 3 = "all_feeds_failed" }

# Resubmitted after a crash (ADR 0009): a SIGKILL from outside, or Docker's 137 for it; a short backoff.
[kinds.retried_sleep]
argv = ["{python}", "-c", "import sys, threading; threading.Event().wait(float(sys.argv[1]))", "{seconds}"]
params = { seconds = "float" }
max_attempts = 2
retry_backoff_seconds = 0.2
retry_backoff_max_seconds = 0.2
retry_on_exit_codes = [137]

# Resubmitted, with a backoff long enough to be cancelled while it waits.
[kinds.patient_sleep]
argv = ["{python}", "-c", "import sys, threading; threading.Event().wait(float(sys.argv[1]))", "{seconds}"]
params = { seconds = "float" }
max_attempts = 3
retry_backoff_seconds = 3600
retry_on_exit_codes = [137]

# An exit code that means "try again" (EX_TEMPFAIL), and one that does not.
[kinds.retried_exit]
argv = ["{python}", "-c", "import sys; print('bye'); sys.exit(int(sys.argv[1]))", "{code}"]
params = { code = "int" }
max_attempts = 3
retry_backoff_seconds = 0.1
retry_backoff_max_seconds = 0.2
retry_on_exit_codes = [75]

[kinds.chatty]
argv = ["{python}", "-c", "import sys; sys.stdout.write('x' * int(sys.argv[1]))", "{n}"]
params = { n = "int" }

[kinds.first]
argv = ["{python}", "-c", "import sys; sys.exit(int(sys.argv[1]))", "{code}"]
params = { code = "int" }
then = "done"

[kinds.done]
argv = ["{python}", "-c", "pass"]
coalesce = true

[kinds.term_ignorer]
argv = ["{python}", "-c", '''
import signal, threading
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
threading.Event().wait(60)
''']
""" + beater_kind("steady_beater", every_s=0.1, timeout_s=2)

TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.STALE}


def kinds_file_with(tmp_path: Path, extra: str) -> Path:
    """A kinds file of the test's own: the shared ``KINDS`` and the ``extra`` kinds a test declares."""
    path = tmp_path / "kinds-with.toml"
    path.write_text(KINDS + extra)
    return path


def serve_env(tmp_path: Path, kinds: str = KINDS, *, data_dir: Path | None = None, **settings: str) -> dict[str, str]:
    """The environment of a real ``supervisor serve`` in a test: none of the caller's own ``PODCAST_*`` settings, the
    test's kinds (written to ``tmp_path``), its data dir (default ``tmp_path / "data"``), loopback on a free port and
    a sweep every second; ``settings`` add or override ``PODCAST_*`` variables."""
    kinds_file = tmp_path / "kinds.toml"
    kinds_file.write_text(kinds)
    out = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    out.update(
        PODCAST_JOB_DATA_DIR=str(data_dir if data_dir is not None else tmp_path / "data"),
        PODCAST_JOB_BIND="127.0.0.1:0",
        PODCAST_JOB_KINDS_FILE=str(kinds_file),
        PODCAST_JOB_SWEEP_SECONDS="1",
    )
    out.update(settings)
    return out


async def poll(check: Callable[[], Awaitable[T | None]], *, timeout_s: float = 20.0) -> T:
    """Poll state owned by another process (a real job, another supervisor): there is no event to wait on,
    so poll briefly, always under a ``fail_after`` bound."""
    with trio.fail_after(timeout_s):
        while (value := await check()) is None:  # noqa: ASYNC110 - no event exists across processes
            await trio.sleep(0.01)
        return value


async def wait_status(sup: Supervisor, job_id: str, statuses: Collection[JobStatus], *, timeout_s: float = 20.0) -> Job:
    async def check() -> Job | None:
        job = await sup.get(job_id)
        return job if job.status in statuses else None

    return await poll(check, timeout_s=timeout_s)


async def wait_running(sup: Supervisor, job_id: str, *, timeout_s: float = 20.0) -> Job:
    """Until the drainer has promoted and started the job, its identity recorded (a pid or a container id): an
    enqueue answers before the start."""

    async def check() -> Job | None:
        job = await sup.get(job_id)
        return job if job.status is JobStatus.RUNNING and job.spawned else None

    return await poll(check, timeout_s=timeout_s)


async def wait_terminal(sup: Supervisor, job_id: str, *, timeout_s: float = 20.0) -> Job:
    """Poll the registry for a terminal state, bounded (the job is a real process)."""
    return await wait_status(sup, job_id, TERMINAL, timeout_s=timeout_s)


async def insert_running(
    sup: Supervisor,
    *,
    boot_id: str,
    identity: ProcessIdentity | None = None,
    pid: int | None = None,
    spawned: bool = True,
) -> Job:
    """A RUNNING row as another boot would have left it (through the registry, as that boot did). ``pid`` alone: a
    record with a bare pid, as a boot that could not read /proc would have written (no identity)."""
    registry = sup.registry
    queued = await registry.enqueue(NewJob("sleep", {"seconds": 60.0}, ["true"]))
    promotion = await registry.promote(PromoteRequest(1000, boot_id, [hash_token("t")], sup.log_dir))
    [job] = promotion.jobs
    assert job.job_id == queued.job.job_id
    if spawned:
        if identity is not None:
            record = identity.to_record()
        else:
            record = IdentityRecord("process", {"pid": pid, "pid_start_time": None, "kernel_boot_id": None})
        [job] = await registry.record_identities([IdentityClaim(job.job_id, record)])
    return job


def write_shepherd_marker(sup: Supervisor, boot_id: str, identity: ProcessIdentity, *, connected: bool) -> None:
    """The marker boot ``boot_id``'s shepherd would keep (``shepherd.py``): ``identity`` as its process."""
    path = marker_path(sup.log_dir, boot_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = {"pid": identity.pid, "start_time": identity.start_time, "kernel_boot_id": identity.kernel_boot_id}
    path.write_text(json.dumps({**fields, "control": "connected" if connected else "closed"}))


def age_started(sup: Supervisor, job_id: str, seconds: float) -> None:
    """Make a row look promoted ``seconds`` ago (its ``started_at``), as a test of age-dependent rules needs: written
    straight into the SQLite file (no registry operation rewrites history)."""
    registry = sup.registry
    assert isinstance(registry, SqliteRegistry)
    started = to_iso(utc_now() - timedelta(seconds=seconds))
    with registry.file.tx() as conn:
        conn.execute("UPDATE jobs SET started_at = ? WHERE job_id = ?", (started, job_id))


async def wait_idle(sup: Supervisor, *, timeout_s: float = 20.0) -> None:
    """Until no monitor is left: each removes itself only after finalizing and enqueueing any follow-up."""

    async def idle() -> bool | None:
        return (not len(sup.boot.ledger)) or None

    await poll(idle, timeout_s=timeout_s)


async def dead_identity() -> ProcessIdentity:
    """The identity of a real process that has exited and been reaped: dead by any evidence."""

    def run() -> ProcessIdentity:
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        identity = identify(proc.pid)
        proc.wait()
        assert identity is not None
        return identity

    return await trio.to_thread.run_sync(run)


def count_promote_rounds(sup: Supervisor, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, each promote round the drainer runs appends how many rows it promoted to the list returned."""
    rounds: list[int] = []
    promote = sup.registry.promote

    async def counted(request: PromoteRequest) -> Promotion:
        got = await promote(request)
        rounds.append(len(got.jobs))
        return got

    monkeypatch.setattr(sup.registry, "promote", counted)
    return rounds


def pid_of(job: Job) -> int | None:
    """The pid a process identity record holds (subprocess mode), None when the row records none."""
    value = job.identity.fields.get("pid") if job.identity is not None else None
    return value if isinstance(value, int) else None


def container_of(job: Job) -> str | None:
    """The container id a container identity record holds (docker mode), None when the row records none."""
    value = job.identity.fields.get("container_id") if job.identity is not None else None
    return value if isinstance(value, str) else None


async def enqueue_raw(sup: Supervisor, kind: str, params: dict[str, object], argv: list[str]) -> Job:
    """A row enqueued through the registry as another process would (no validation, no drainer wake-up)."""
    result = await sup.registry.enqueue(NewJob(kind, params, argv))
    return result.job


async def take_beat(
    heartbeats: Heartbeats, job_id: str, token: str, read_body: Callable[[], Awaitable[object]]
) -> None:
    """A heartbeat as the API's route takes one: the token admitted first, then the body read and parsed at the edge
    (``parse_progress``), then the beat taken, or the body's error refused (a 401 instead for a token that no longer
    works)."""
    admission = await heartbeats.admit(job_id, token)
    try:
        progress = parse_progress(await read_body())
    except RequestError as exc:
        await heartbeats.refuse(admission, exc)
    heartbeats.take(admission, progress)
