"""The core: the rules of supervision and the tasks that carry them out, one module per branch of the nursery tree.

_bulk         Bulk: the operator's bulk cancel and retry, a dry run's selection acted on once
_boot         Boot: one boot's settings and parts, a value handed to every part; the tasks' error boundary
_ledger       JobLedger: the jobs watched or being started, and the stops for stalls (the one shared mutable state)
_standing     Standing: what the fleet lets this host do now (promote, lead, the limit), written by the fleet task
_rules        pure: judge (reconcile), outcome and ending (a job's end), judge_absence (stalled / silent)
_enqueue      enqueue, batches and retries: validated, stored, announced (never waits for a start)
_drain        the drainer task: promote and start, the one way a job starts
_monitor      one monitor per running job; cancel
_reconcile    reconcile: RUNNING rows against the executor's evidence
_absence      the absence tracker (monotonic ages) and judge
_sweeper      the sweeper task: pause file -> reconcile -> absence -> drain
_wakeups      the wake-up listener task: other hosts' changes (LISTEN/NOTIFY), acted on at once; only hints
_heartbeats   a job's heartbeats: the token admitted before the body is read, the beat taken, written behind
_queue_watch  the queue's own watch: its signals and the stuck rule, judged at every sweep
_fleet        the fleet task: this host's lease, the lead, the fleet's settings, the leader's silent-host rounds
_silent       the leader's judge of a silent host's jobs: ended only by proof this host can read
_hosts        the operator's view of the fleet's hosts, and forget
_pause        the operator's pause file, mirrored into the registry's pause
_prune        retention: finished jobs past it removed with their files, a batch at a time
_succession   the data dir's lock: which previous boot of this host is proved gone
_ports        what one part offers another: the small protocols the parts' constructors take
_logs         a job's log as a read gets it: which bytes, then a chunk at a time
_supervisor   Supervisor: the core's one surface; builds the above, subscribes the bus, starts the tasks in order
_tree         run_job_nursery: the job nursery, the first task of a boot's tree
"""

from ._absence import ABSENT_AFTER_S, CHECK_IN_S, AbsenceJudge, AbsenceTracker
from ._boot import Boot, JobTree, Tally
from ._bulk import Bulk, BulkAnswer
from ._drain import PROMOTE_BATCH, Drainer
from ._heartbeats import (
    FLUSH_INTERVAL_S,
    WRITE_RETRY_S,
    Admission,
    CurrentRows,
    Heartbeats,
    JobTokens,
    merged,
)
from ._ledger import JobLedger, Watched
from ._logs import LOG_CHUNK_BYTES, LogSlice
from ._queue_watch import HOLD_REASONS, NOT_PROMOTED, ROOT_CAUSE_ORDER, KindLoad, QueueRule, QueueWatch, Stuck
from ._reconcile import ReconcileDetail, ReconcileReport
from ._rules import (
    CANCELLED,
    DEADLINE_STOP,
    ENGINE_UNAVAILABLE,
    JITTER,
    NEVER_STARTED,
    NO_RETRY,
    REASON_RECOVERED,
    REASON_SILENT,
    REASON_STALLED,
    STALLED_STOP,
    STOP_DEADLINE,
    STOP_STALL,
    STOPS,
    Decision,
    RetryPolicy,
    Signals,
    Verdict,
    attempt_ended,
    backoff_s,
    ending,
    judge,
    judge_absence,
    outcome,
    past_window,
)
from ._scrape import SCRAPE_BUDGET_S, RegistryReads
from ._standing import Standing
from ._status import Health, QueueState
from ._succession import DataDirLock
from ._supervisor import Supervisor
from ._sweeper import QuietSweeps, Sweeper, run_sweeper
from ._tree import run_job_nursery
from ._wakeups import WakeupListener

__all__ = [
    "ABSENT_AFTER_S",
    "CANCELLED",
    "CHECK_IN_S",
    "DEADLINE_STOP",
    "ENGINE_UNAVAILABLE",
    "FLUSH_INTERVAL_S",
    "HOLD_REASONS",
    "JITTER",
    "LOG_CHUNK_BYTES",
    "NEVER_STARTED",
    "NOT_PROMOTED",
    "NO_RETRY",
    "PROMOTE_BATCH",
    "REASON_RECOVERED",
    "REASON_SILENT",
    "REASON_STALLED",
    "ROOT_CAUSE_ORDER",
    "SCRAPE_BUDGET_S",
    "STALLED_STOP",
    "STOPS",
    "STOP_DEADLINE",
    "STOP_STALL",
    "WRITE_RETRY_S",
    "AbsenceJudge",
    "AbsenceTracker",
    "Admission",
    "Boot",
    "Bulk",
    "BulkAnswer",
    "CurrentRows",
    "DataDirLock",
    "Decision",
    "Drainer",
    "Health",
    "Heartbeats",
    "JobLedger",
    "JobTokens",
    "JobTree",
    "KindLoad",
    "LogSlice",
    "QueueRule",
    "QueueState",
    "QueueWatch",
    "QuietSweeps",
    "ReconcileDetail",
    "ReconcileReport",
    "RegistryReads",
    "RetryPolicy",
    "Signals",
    "Standing",
    "Stuck",
    "Supervisor",
    "Sweeper",
    "Tally",
    "Verdict",
    "WakeupListener",
    "Watched",
    "attempt_ended",
    "backoff_s",
    "ending",
    "judge",
    "judge_absence",
    "merged",
    "outcome",
    "past_window",
    "run_job_nursery",
    "run_sweeper",
]
