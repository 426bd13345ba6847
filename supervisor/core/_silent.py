"""A silent host's jobs, judged by the leader on ground truth it can reach (ADR 0012 §5, INV-SILENT-HOST-ENDS-BY-PROOF).

A job whose host's lease expired is not this host's to judge by liveness: its process is on another machine, and
nothing this host sees of a pid, or of a container it cannot find, says anything about it (INV-OWNER-JUDGES,
INV-UNKNOWN-KEEPS-SLOT). But some evidence is positive and names the row's own recorded identity: the container
with the row's container id on this host's engine (finding that id proves the engine is shared), exited with its
exit code; the exit record its host's shepherd wrote next to the job's log, naming its pid + start time + kernel
boot id, readable here (the same machine, or a shared volume). That is how the job ended, whoever reads it: the
leader records it, through the same ``Monitors.finish`` as its owner would (the kind's outcome, resubmission, a
follow-up). Anything else leaves the row RUNNING with its slot.

The end is guarded twice in its own registry step: by the identity read (``expect``), and by the host's lease
(``Expect.host_silent``): a host that came back and renewed judges its rows itself, and the one of the two that
records first is the only end (the other's finalize finds the row ended, or another attempt, and changes nothing).

Nothing of the other host's job is stopped, signalled, adopted or released here: a container the leader ended this
way belongs to the silent host's boot; that host's next boot releases it (INV-RELEASE-AFTER-END: it releases
leftovers whose attempt the registry records as ended), as it would had it recorded the end itself.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..domain import Job
from ..observe import get_logger
from ._boot import Boot
from ._monitor import Monitors
from ._ports import DrainBell

log = get_logger()


class SilentHostJobs:
    def __init__(self, boot: Boot, monitors: Monitors, drain_bell: DrainBell) -> None:
        self.boot = boot
        self.monitors = monitors
        self._drain_bell = drain_bell

    async def end_by_proof(self, rows: list[Job], leading: Callable[[], bool]) -> list[str]:
        """``rows``: RUNNING rows of hosts whose lease has expired (the leader's read of this round). Each one whose
        end this host can prove is finalized with its true outcome, while ``leading()`` holds (INV-ONE-LEADER); the
        ids of those ended, in order."""
        boot = self.boot
        # Never this host's own rows (its monitors judge them), never a row with no recorded process.
        rows = [job for job in rows if not boot.owns(job) and job.spawned and job.identity is not None]
        if not rows:
            return []
        # Blocking probes (an engine's inspect, a file on a shared volume): a worker thread, before any write.
        # abandon_on_cancel: the caller's bound ends the wait; a read stuck on a hung volume is left to finish alone.
        proofs = await trio.to_thread.run_sync(boot.executor.proof_of_end, rows, abandon_on_cancel=True)
        ended: list[str] = []
        for job, proof in zip(rows, proofs, strict=True):
            if proof is None:
                continue  # INV-UNKNOWN-KEEPS-SLOT: no proof is no evidence; the row keeps its slot
            if not leading():
                break  # INV-ONE-LEADER: the lead was lost while the proof was read; the next leader reads again
            if proof.handle is not None:
                await boot.executor.collect(proof.handle)  # its output into the row's log, as its owner would
            # INV-SILENT-HOST-ENDS-BY-PROOF: only the identity the proof names, only while its host is silent.
            if not await self.monitors.finish(job, proof.exit_status, cancel_asked=False, expect=job, host_silent=True):
                continue
            final = await boot.registry.get(job.job_id)
            if final.status.is_terminal:
                outcome = f"{final.status}/{final.error_reason}" if final.error_reason else str(final.status)
            else:
                last = final.history[-1]
                outcome = f"{last.status}/{last.reason} (resubmitted)"
            log.info(
                "silent_host_job_ended",
                host_id=job.host_id,
                job_id=job.job_id,
                outcome=outcome,
                exit_code=proof.exit_status.returncode,
                evidence=proof.evidence,
            )
            ended.append(job.job_id)
        if ended:
            self._drain_bell.ring()
        return ended
