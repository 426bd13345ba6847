-- Why the supervisor itself began to stop a running job (docs/reliability.md § A stop's reason outlives its boot,
-- INV-STOP-REASON-BEFORE-SIGNAL): ``deadline`` (its kind's deadline_seconds passed) or ``stall`` (stall_action =
-- terminate), written before the signal is sent, so whichever boot records the job's end finishes it as that stop
-- planned. NULL when it began none (an older release's rows, and its code, never read it).
ALTER TABLE jobs ADD COLUMN stop_reason TEXT;
