"""Every log event the supervisor writes, declared once (``LOG_EVENTS``): its name, its level(s), its fields, what it
means and what an operator does about it. The reference page ``docs/log-events.md`` is generated from it
(``log_events_table``, written by ``tools/doc_tables.py``), and ``tests/test_log_events.py`` holds it to the code:
an event the code emits and this table lacks fails, and so does one this table keeps and nothing emits.

To add an event: one ``E(...)`` line below, in alphabetical order, then ``.venv/bin/python tools/doc_tables.py``.

``level``: the level it is written at; ``a/b`` when it has two (the text says when each). ``fields``: its own
fields, beyond those every line has (``event``, ``level``, ``timestamp``; ``exception`` with a traceback) and those
any line written while a request is served has (``request_id``, ``by``); ``+process`` stands for the process the
row records (``pid``, ``pid_start_time``, ``kernel_boot_id``; or ``container_id`` in docker mode).
"""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class LogEvent:
    name: str
    level: str  # "warning", or "debug/error": each level it is written at, least first
    fields: str  # space-separated; "+process": the process identity fields
    means: str
    action: str

    @property
    def levels(self) -> frozenset[str]:
        return frozenset(self.level.split("/"))

    @property
    def field_names(self) -> frozenset[str]:
        return frozenset(f for f in self.fields.split() if not f.startswith("+"))


E = LogEvent

# Repeated texts.
_STEP = ("a step of a background task met a condition (the registry, the engine, a disk) and will be tried again at "
         "its next turn; DEBUG while the registry cannot write (`registry_writes_failing` says that once), else ERROR "
         "with the traceback")  # fmt: skip
_STEP_DO = ("DEBUG: nothing. ERROR: read `exception`; if it repeats every turn, fix the cause it names (permissions, "
            "disk, database) — the supervisor goes on meanwhile; `podcast_background_conditions_total` counts "
            "them")  # fmt: skip
_NOTHING = "Nothing."

LOG_EVENTS: tuple[LogEvent, ...] = (
    E("absence_judgement_failed", "debug/error", "error",
      f"The sweep's judgement of stalled and silent jobs: {_STEP}.", _STEP_DO),
    E("adoption_event_not_recorded", "error", "job_id",
      "A prior boot's live job is watched by this boot, but its `job.adopted` event could not be written (no webhook "
      "for it); the adoption itself goes on.", "Read `exception`; the job is watched all the same."),
    E("api_request", "info", "method path status by request_id job_id",
      "A state-changing API request and its answer (refused ones included); `by` is the token's name, never the "
      "token.", "The audit trail: who did what. Nothing to fix."),
    E("api_request_refused", "warning", "method path status code why by token_digest request_id job_id",
      "A request refused for its credentials: no token, an unknown or revoked one (401), a token whose scope is too "
      "small or a request from a web page (403). `by` names a known token; `token_digest` is the first 12 hex "
      "characters of the SHA-256 of the token sent (the tokens file stores full digests), never the token.",
      "A client with a stale token after a rotation or revocation: find it by `token_digest`/`by` and give it a "
      "valid token; many from one client you do not know: look at who can reach the port."),
    E("api_token_reload_failed", "error", "error kept",
      "At SIGHUP the operator token's file could not be read; the token in force is kept.",
      "Fix the file named in `error`, then `kill -HUP` again."),
    E("api_token_reload_ignored", "info", "why",
      "A SIGHUP asked to re-read the operator token, but it comes from the environment, not a file.",
      "Nothing; use `PODCAST_JOB_API_TOKEN_FILE` to rotate it without a restart."),
    E("api_token_reloaded", "info", "path", "At SIGHUP the operator token was read again from its file.", _NOTHING),
    E("api_tokens_file_removed", "warning", "path kept",
      "At SIGHUP the named tokens' file was gone: every named token is revoked; the API still needs a token.",
      "If not meant, restore the file (`supervisor token add` makes a new one) and `kill -HUP`."),
    E("api_tokens_reload_failed", "error", "path error kept",
      "At SIGHUP the named tokens' file could not be read or parsed; the tokens in force are kept.",
      "Fix the file (the `error` names the problem), then `kill -HUP` again."),
    E("api_tokens_reloaded", "info", "path tokens required",
      "At SIGHUP the named tokens' file was read again (`tokens`: how many).", _NOTHING),
    E("bulk_action", "info", "action by selection count +outcomes",
      "A bulk action was carried out on a selection: who, what, on how many, and how each ended (a count per "
      "outcome).", "The audit trail of bulk actions."),
    E("bulk_selected", "info", "action by selection count",
      "The dry run of a bulk action: the jobs it would touch were selected (not yet acted on).", _NOTHING),
    E("bulk_selections_expired", "info", "rows", "Bulk selections past their time were dropped by the sweeper.",
      _NOTHING),
    E("cancel_left_process_alone", "error", "job_id +process liveness detail why",
      "A cancelled job's process could not be verified (not found alive by its identity), so it was not signalled: "
      "it may still run.", "Act on it: find the process by the identity fields; stop it by hand if it runs."),
    E("cancel_pending_engine_unreachable", "warning", "job_id why",
      "Docker mode: a prior boot's job was cancelled while the engine does not answer; the row keeps its slot with "
      "the cancel requested.", "Nothing, unless the engine stays down: the first sweep that reaches it stops the job."),
    E("cancel_pending_start_unconfirmed", "warning", "job_id detail",
      "A prior boot's job was cancelled while its start may still be under way; the cancel stays requested.",
      "Nothing: a sweep stops it once its start record appears, or ends it `cancelled_before_start` after 30 s."),
    E("config_fallback", "warning", "detail",
      "A setting was malformed or below its floor and fell back (to its default or floor), or a `PODCAST_JOB_*` "
      "variable is no setting; `detail` names it.", "Fix the variable or TOML key it names (`check-config`)."),
    E("container_left_behind", "warning/error", "job_id container_id error why",
      "Docker mode: a container whose start failed could not be removed. ERROR: its start may yet happen (the row "
      "keeps its slot until the evidence says); WARNING: it was created and never started.",
      "ERROR: remove it by hand (`docker rm -f`, the `container_id`) once the engine answers. WARNING: nothing, the "
      "job's next start removes it."),
    E("container_never_started_removed", "warning", "job_id container_id",
      "Docker mode: a container created for a job but never started was removed.", _NOTHING),
    E("container_not_removed", "warning", "job_id container_id error",
      "Docker mode: a finished job's container was left on the engine (the engine refused its removal).",
      "Nothing: the next boot removes it (`leftover_released`); or `docker rm` it."),
    E("data_dir_in_use", "warning", "path why",
      "Another supervisor on this machine holds this data directory's lock: this boot claims no succession.",
      "Two supervisors on one data directory is a mistake unless one is stopping: check `ps`/systemd."),
    E("data_dir_not_locked", "debug", "path error",
      "The data directory's lock file could not be opened (the registry's opening says why).", _NOTHING),
    E("deadline_check_failed", "debug/error", "error", f"The sweep's check of kinds' deadlines: {_STEP}.", _STEP_DO),
    E("deadline_job_not_terminated", "warning", "job_id why",
      "A job past its kind's `deadline_seconds` was not stopped: no verified live process.",
      "Nothing if it ended; else find its process (`supervisor show`) and stop it."),
    E("deadline_job_terminating", "warning", "job_id grace_s",
      "A job past its kind's `deadline_seconds` is being stopped (SIGTERM, SIGKILL after the grace).",
      "Check why it ran so long (its log); raise the deadline if it was legitimate."),
    E("docker_engine_reachable", "info", "failed_calls down_s",
      "Docker mode: the engine answers again after an episode (`down_s`, `failed_calls`).", _NOTHING),
    E("docker_engine_unavailable", "warning", "call error liveness starts",
      "Docker mode: once per episode, the engine refused, timed out or answered a server error; running jobs keep "
      "their slots, nothing is started.", "Check the Docker daemon (`systemctl status docker`, its socket)."),
    E("docker_leftovers_unlisted", "warning", "error",
      "Docker mode: the finished containers could not be listed; their release waits for the next sweep.",
      "Nothing, unless it repeats: then the engine is unwell."),
    E("drain_failed", "debug/error", "error", f"A drain round (promotion and start): {_STEP}.", _STEP_DO),
    E("drain_held", "info/warning", "why exec_mode",
      "Promotion is held: the executor cannot start jobs now (INFO, docker engine trouble) or this host's lease is "
      "not fresh (WARNING).", "Follow the cause it names: the engine, or the registry/database."),
    E("drain_resumed", "info", "why exec_mode", "Promotion goes on again after `drain_held`.", _NOTHING),
    E("enqueue_replayed", "info", "job_id idempotency_key",
      "An enqueue repeated with an idempotency key already answered: nothing written, the first answer returned.",
      _NOTHING),
    E("event_stream_client_dropped", "warning", "why jobs request_id by",
      "A reader of `GET /api/events` was dropped: its queue was full (it does not read). `request_id`/`by`: its "
      "request.", "The client reconnects with `Last-Event-ID`; if it repeats, the client is too slow."),
    E("event_subscriber_failed", "error", "job_event job_id",
      "A subscriber of the event bus (metrics, stream, webhook wake-up…) raised on an event; the others heard it.",
      "A bug: report it with `exception`."),
    E("fleet_leader", "info", "host_id boot_id lease_s", "This host leads the fleet from now on.", _NOTHING),
    E("fleet_leader_handed_over", "info", "host_id why",
      "This drained host let the lead go at its lease renewal, so another host leads.", _NOTHING),
    E("fleet_leader_stepped_down", "warning", "host_id why",
      "This host stopped leading: its lease could not be renewed in time.",
      "Check this host's path to the database; another host leads after the lease expires."),
    E("fleet_setting_disagrees", "error", "setting here fleet recorded_by recorded_at used fix",
      "This host's `max_concurrent` or kinds differ from those the fleet recorded; the fleet's are used.",
      "Do what `fix` says: give every host the same setting, restart them."),
    E("fleet_setting_not_settled", "debug/error", "error setting",
      f"The fleet's shared setting could not be read or recorded: {_STEP}.", _STEP_DO),
    E("follow_up_enqueued", "info", "job_id follow_up coalesced",
      "A succeeded job's kind names a `then` kind: its follow-up job was enqueued (`follow_up`: its id).", _NOTHING),
    E("follow_up_not_enqueued", "error", "job_id then error",
      "A succeeded job's `then` follow-up could not be enqueued: its params do not validate for that kind.",
      "Fix the kinds file (the follow-up's params); enqueue it by hand if needed."),
    E("heartbeats_write_failed", "warning", "error pending at",
      "The heartbeats taken could not be written (once per episode; `at: shutdown` at the end); they are kept and "
      "merged with newer ones.", "Follow `registry_writes_failing`."),
    E("heartbeats_write_recovered", "info", "", "The heartbeats are written again.", _NOTHING),
    E("host_back", "info", "host_id", "A host named silent renewed its lease again (the leader says it).", _NOTHING),
    E("host_drain_requested", "warning", "host_id by",
      "An operator (`by`) drained a host through this supervisor's API; the host itself says `host_draining`.",
      "Wait for it (`supervisor hosts wait-drained HOST`); `supervisor hosts undrain HOST` ends the drain."),
    E("host_draining", "warning", "host_id running_jobs why",
      "An operator drained this host: nothing new starts here, its running jobs run to their end under its watch, the "
      "lead goes to another host. Said once per drain.",
      "Wait for it (`supervisor hosts wait-drained HOST`), then stop or upgrade it; `supervisor hosts undrain HOST` "
      "ends the drain."),
    E("host_forget_failed", "debug/error", "error why",
      f"An operator's forget of a host, whose caller went away: {_STEP}.", "Ask again (`supervisor hosts forget`)."),
    E("host_forgotten", "warning", "host_id boot_id jobs_ended",
      "An operator forgot a host: its running jobs were ended (`orphan_host_forgotten`).",
      "Resubmit what must run again; make sure that host is really gone."),
    E("host_forgotten_by_operator", "error", "host_id boot_id error done fix",
      "This host learns that an operator forgot it: it never promotes or leads again in this boot.",
      "Do what `fix` says: stop it, check its jobs, restart it."),
    E("host_id_taken_over", "warning", "host_id previous_boot_id why",
      "This boot took the lease of a host id whose previous boot was still live: a restart after a crash, or a "
      "second machine given the same host id.", "If two machines share a host id, give each its own."),
    E("host_lease_not_released", "debug/error", "error host_id",
      f"At shutdown the host's lease could not be released: {_STEP}.", "Nothing: it expires on its own."),
    E("host_lease_not_renewed", "debug/error", "error host_id leading_until_s why",
      "One renewal of the host's lease failed (DEBUG when it timed out or the registry cannot write; "
      "`host_lease_stale` says the episode).", _STEP_DO),
    E("host_lease_renewed", "info", "host_id promotion", "The lease is renewed again after `host_lease_stale`.",
      _NOTHING),
    E("host_lease_stale", "warning", "host_id why",
      "The host's lease could not be renewed in time: no job is promoted here until it is.",
      "Check the database and this host's path to it."),
    E("host_restarted", "info", "host_id boot_id previous_boot_id leading why",
      "This boot took over its dead predecessor's lease (and lead) at once.", _NOTHING),
    E("host_silent", "error", "host_id lease_expired_at running_jobs kept forget",
      "The leader names a host whose lease expired: its running jobs keep their slots.",
      "Bring the host back, or, if it is gone for good, forget it (`forget` says how)."),
    E("host_undrain_requested", "warning", "host_id by",
      "An operator (`by`) undrained a host through this supervisor's API; the host itself says `host_undrained`.",
      _NOTHING),
    E("host_undrained", "info", "host_id promotion", "An operator undrained this host: it promotes again.",
      _NOTHING),
    E("http_answer_cut", "warning", "why bytes client",
      "An answer was cut and its connection closed: too many unsent bytes, or a write that moved nothing for 10 s.",
      "A client that does not read: nothing here; see `docs/api.md` § Bounds."),
    E("http_connection_abandoned", "error", "error client",
      "A connection was ended because our side could not go on with it (a message out of place).",
      "A bug if it repeats: report it."),
    E("http_connection_failed", "error", "error client effect",
      "A connection's handling raised; that connection was closed, the others go on.",
      "Report it with `exception` if it repeats."),
    E("http_connections_bounded_by_open_files", "warning", "open_files max_connections fix",
      "The open-files limit bounds the HTTP connections below the default 512.", "Do what `fix` says (`LimitNOFILE`)."),
    E("http_protocol_error", "info", "request_id status client",
      "A request the HTTP stack refused before any route (malformed, too large a head).", _NOTHING),
    E("http_server_restarted", "error", "error restart_in_s restarts effect",
      "The HTTP server ended by itself and is started again on the same socket; jobs stay watched.",
      "Report it with `exception`; if it repeats, the API is unavailable meanwhile."),
    E("idempotency_keys_expired", "info", "rows", "Expired idempotency keys were dropped by the sweeper.", _NOTHING),
    E("job_adopted", "info", "job_id kind reason boot_id +process stalled silent completed_units last_progress_at "
      "last_heartbeat_at prior_boot",
      "This boot watches a live job a prior boot started.", _NOTHING),
    E("job_cancel_signal", "info/warning", "job_id signal pid",
      "A cancelled job's process group is signalled: SIGTERM (INFO), SIGKILL after the grace (WARNING).",
      "SIGKILL: the job ignored SIGTERM for the whole grace; check its handling."),
    E("job_cancel_stop", "info", "job_id container_id grace_s", "Docker mode: a `docker stop` with its grace.",
      _NOTHING),
    E("job_coalesced", "info", "job_id kind",
      "An enqueue of a `coalesce = true` kind returned the identical job already queued.", _NOTHING),
    E("job_identity_not_recorded", "debug/error", "error job_ids",
      f"Started jobs' process identities could not be written: {_STEP}; the next sweep records them.", _STEP_DO),
    E("job_liveness_unknown", "debug", "job_id container_id error liveness",
      "Docker mode: one job's wait on its container failed; asked again (the engine's episode is said once).",
      _NOTHING),
    E("job_marked_stale_while_running", "warning", "job_id +process hint",
      "An operator's reconcile marked a job stale whose process still runs.",
      "Stop that process before a retry (a retry now would run the work twice)."),
    E("job_not_requeued", "debug/error", "error job_id",
      f"A job whose start never happened could not be put back in the queue: {_STEP}; the next boot requeues it.",
      _STEP_DO),
    E("job_not_signalled", "error", "job_id pid why",
      "A job's process was not signalled: no verified identity to signal by.",
      "Find the process by its pid and start time; stop it by hand if it still runs."),
    E("job_output_not_copied", "warning", "job_id log error",
      "Docker mode: a container's output could not be copied into the job's log (this host's disk or path).",
      "Fix the disk or path named in `log`; the job's end is recorded without its output."),
    E("job_output_unavailable", "debug", "job_id container_id error liveness",
      "Docker mode: copying a finished container's output failed; asked again.", _NOTHING),
    E("job_recovered", "info", "job_id kind reason boot_id +process stalled silent completed_units last_progress_at "
      "last_heartbeat_at", "A stalled or silent job progresses or beats again: its flag is cleared.", _NOTHING),
    E("job_retried", "info", "job_id retry_of kind",
      "A failed or stale job was retried as a new job (`job_id`, linked by `retry_of`).", _NOTHING),
    E("job_silent", "warning", "job_id kind reason boot_id +process stalled silent completed_units last_progress_at "
      "last_heartbeat_at", "A live job's heartbeats stopped (`PODCAST_JOB_HEARTBEAT_SILENCE_SECONDS`).",
      "Look at the job (`supervisor show`, its log): is it wedged? Cancel it if so."),
    E("job_spawned", "info", "job_id kind boot_id +process", "A promoted job's process or container was started.",
      _NOTHING),
    E("job_stalled", "warning", "job_id kind reason boot_id +process stalled silent completed_units "
      "last_progress_at last_heartbeat_at",
      "A job reports no progress for `PODCAST_JOB_PROGRESS_STALE_SECONDS` (it may still beat).",
      "Look at its log and progress; cancel it, or let `PODCAST_JOB_STALL_ACTION=terminate` stop it."),
    E("job_start_failed", "debug/error", "error job_ids", f"A batch of promoted jobs' start: {_STEP}.", _STEP_DO),
    E("job_start_unknown", "warning", "job_id why kept",
      "A job's start got no clear answer (docker: the engine timed out): it may have started; its row keeps its "
      "slot until the evidence says.", "Nothing: the sweep resolves it; check the engine if it repeats."),
    E("job_stop_failed", "error", "job_id",
      "Stopping a cancelled job failed; its monitor waits on, the cancel stays requested.",
      "Read `exception`; stop the process by hand if it runs on."),
    E("job_stop_unanswered", "debug", "job_id container_id error liveness",
      "Docker mode: a `docker stop` got no answer; asked again.", _NOTHING),
    E("job_transition", "info", "job_id kind from to reason boot_id exit_code +process",
      "A job's status changed (enqueue, promotion, every end). A line that ends an attempt names the process that "
      "ran it; none: no known process (`never_started`).", "Read `to`/`reason`: a failure's reason says why."),
    E("job_unwatchable", "warning", "job_id why",
      "A job's process cannot be watched (no identity recorded); the row stays running and the sweep judges it.",
      "Nothing, unless it stays: then check the process by hand."),
    E("job_watched_by_identity", "warning", "job_id pid why",
      "Subprocess mode: the shepherd was lost; this job is watched by its process identity from now on.",
      "Nothing; see `shepherd_lost`."),
    E("jobs_pruned", "info", "jobs files_removed oldest_ended_at newest_ended_at",
      "Ended jobs past the retention were deleted with their files.", _NOTHING),
    E("leftover_released", "info", "job_id attempt +process",
      "A container a dead boot recorded as ended and did not remove was removed by this one.", _NOTHING),
    E("leftovers_not_released", "debug/error", "error", f"The release of dead boots' leftovers: {_STEP}.", _STEP_DO),
    E("log_lines_dropped", "warning", "dropped",
      "Log lines could not be written (a full disk, a closed pipe) and were dropped; `dropped` counts them.",
      "Free the disk the log is written to."),
    E("metrics_read_failed", "debug/error", "error",
      f"The background registry read behind `/metrics` (a scrape shows the last read and its age, "
      f"`podcast_metrics_registry_age_seconds`, meanwhile): {_STEP}.", _STEP_DO),
    E("monitor_failed", "error", "job_id",
      "A job's monitor failed; the row stays running and the sweeper's rules finalize it.",
      "Read `exception`; report it if it is no disk or database fault."),
    E("open_files_limit_not_raised", "warning", "soft hard error",
      "`serve` could not raise its open-files limit to the hard one.", "Raise `LimitNOFILE` (systemd) or `ulimit -n`."),
    E("operator_reconcile_failed", "debug/error", "error why",
      f"An operator's reconcile, whose caller went away: {_STEP}.", "Ask again (`supervisor reconcile`)."),
    E("pause_file_not_mirrored", "debug/error", "error path",
      f"The pause flag file could not be mirrored into the registry: {_STEP}.", _STEP_DO),
    E("prune_failed", "debug/error", "error", f"The history pruning: {_STEP}.", _STEP_DO),
    E("pruned_job_file_not_removed", "warning", "path error",
      "A pruned job's file could not be removed.", "Remove it by hand; check the directory's permissions."),
    E("queue_moving", "info", "reason since host_id", "A queue that was stuck moves again.", _NOTHING),
    E("queue_paused", "warning", "by flag",
      "Promotion is paused: by an operator (`POST /api/queue/pause`) or by the pause flag file (`flag`).",
      "Resume when meant (`supervisor resume`, or remove the flag file)."),
    E("queue_resume_failed", "debug/error", "error why",
      f"An operator's resume, whose caller went away: {_STEP}.", "Ask again (`supervisor resume`)."),
    E("queue_resumed", "info", "by flag", "Promotion goes on again.", _NOTHING),
    E("queue_stuck", "error", "reason since host_id oldest_job_id oldest_age_s free_slots meaning",
      "A job has waited past the threshold while this host promotes nothing; `reason`/`meaning` say why.",
      "Follow `meaning` (`docs/operations.md` § The queue's watch)."),
    E("queue_watch_failed", "debug/error", "error", f"The queue's watch: {_STEP}.", _STEP_DO),
    E("reconcile_failed", "debug/error", "error", f"The sweep's reconcile: {_STEP}.", _STEP_DO),
    E("reconcile_kept_slot", "debug/warning", "job_id reason liveness +process detail prior_boot started_at",
      "A running job keeps its slot though it could not be judged (past the wall-clock window, or liveness "
      "unknown); DEBUG when the docker engine does not answer (said once by `docker_engine_unavailable`).",
      "Check the process by the identity fields; cancel the job if it is gone for good."),
    E("registry_writes_failing", "error", "registry error retried",
      "Once per episode: the registry cannot write (a full disk, a lock, the database down). Writes answer 503, "
      "ends of jobs wait to be recorded.", "Fix the cause in `error` (disk space, the lock's holder, the database)."),
    E("registry_writes_recovered", "info", "registry failed_writes down_s",
      "The registry writes again after `registry_writes_failing`.", _NOTHING),
    E("request_failed", "debug/error", "request_id method path error",
      "A request failed: DEBUG when the registry cannot write (a 503), else ERROR (a 500 naming `request_id`).",
      "ERROR: report it with `exception`; the client got the request id."),
    E("retry_refused_process_alive", "warning", "job_id liveness",
      "A retry of a stale job was refused: its process is still running (or may be).",
      "Stop that process first (or wait for it to end), then retry."),
    E("schedule_missed", "warning", "schedule every_s newest_job_id newest_created_at meaning",
      "A schedule has had no run for two periods (the leader says it once per newest job).",
      "Check the timer that enqueues it (cron, systemd timer)."),
    E("schedule_skipped", "info", "schedule job_id status",
      "An `--if-idle` tick of a schedule was skipped: a job of the schedule (`job_id`) is still queued or running.",
      "Nothing, unless every tick is skipped: then that job runs longer than the period (`supervisor show`)."),
    E("schedule_watch_failed", "debug/error", "error", f"The schedules' watch: {_STEP}.", _STEP_DO),
    E("sd_notify_failed", "warning", "state error",
      "A message to systemd (`READY=1`, `WATCHDOG=1`) could not be sent.",
      "Check `NOTIFY_SOCKET`; systemd may restart the unit if pings are lost."),
    E("shepherd_lost", "error", "pid jobs",
      "Subprocess mode: this boot's shepherd died; its running jobs (`jobs`: how many) are watched by identity.",
      "Find why it died (OOM killer: `journalctl -k`); the next start brings a new one."),
    E("shepherd_started", "info", "pid", "Subprocess mode: this boot's shepherd process started.", _NOTHING),
    E("shepherd_unresponsive", "error", "pid why jobs",
      "Subprocess mode: a request could not be sent to the shepherd whole; it is given up.",
      "As `shepherd_lost`."),
    E("shutdown_requested", "info", "signal held", "A stop was asked (SIGTERM/SIGINT).", _NOTHING),
    E("silent_host_job_ended", "info", "host_id job_id outcome exit_code evidence",
      "The leader recorded the end of a silent host's job from proof (its exit record or the engine).", _NOTHING),
    E("silent_hosts_not_watched", "debug/error", "error", f"The leader's round over silent hosts: {_STEP}.", _STEP_DO),
    E("silent_hosts_round_cut_short", "warning", "within_s",
      "The leader's round over silent hosts took longer than a renewal period and was cut.",
      "Nothing once; if it repeats the database is slow."),
    E("spawn_crashed", "error", "job_id error",
      "A job's start raised something other than a spawn failure (a defect); the row is ended `spawn_failed`.",
      "A bug or a bad kind (an argv the OS refuses): read `error`."),
    E("stalled_job_not_terminated", "warning", "job_id liveness why",
      "With `PODCAST_JOB_STALL_ACTION=terminate`, a stalled job was flagged but not stopped: no verified live "
      "process.", "Check the job's process by hand."),
    E("stalled_job_terminating", "warning", "job_id grace_s",
      "With `PODCAST_JOB_STALL_ACTION=terminate`, a stalled job is being stopped.",
      "Look at why it stalled (its log)."),
    E("supervisor_started", "info", "url heartbeat_base_url boot_id exec_mode data_dir max_concurrent registry "
      "database_pooler database_listen host_id leader", "The boot serves: its settings in force.", _NOTHING),
    E("supervisor_stopped", "info", "boot_id before",
      "The boot's last line (`before: serving`: stopped before it served).", _NOTHING),
    E("supervisor_was_absent", "warning", "absent_s effect",
      "This process did not run for `absent_s` (frozen, suspended); jobs' clocks do not count it.",
      "Find what froze it (SIGSTOP, a VM pause, swap)."),
    E("sweep_failed", "debug/error", "error", f"A whole sweep: {_STEP}.", _STEP_DO),
    E("wakeup_catch_up_failed", "debug/error", "error",
      f"The catch-up after the wake-up session came back: {_STEP}.", _STEP_DO),
    E("wakeup_not_acted_on", "debug/error", "error kinds",
      f"A wake-up from the database could not be acted on: {_STEP}; the sweep covers it.", _STEP_DO),
    E("wakeups_back", "info", "down_s", "PostgreSQL: the wake-up (LISTEN) session is open again.", _NOTHING),
    E("wakeups_lost", "warning", "error meanwhile",
      "PostgreSQL: the wake-up (LISTEN) session was lost; the sweep does its work meanwhile.",
      "Check the database; behind pgbouncer in transaction mode set `PODCAST_JOB_DATABASE_POOLER`."),
    E("wall_clock_agrees", "info", "step_s", "The system clock is back in line after `wall_clock_stepped`.", _NOTHING),
    E("wall_clock_stepped", "warning", "step_s effect",
      "The system clock stepped; no rule is moved by it.", "Check NTP/the RTC."),
    E("watchdog_resumed", "info", "", "The systemd watchdog is pinged again.", _NOTHING),
    E("watchdog_withheld", "error", "why",
      "No sweep completed in twice the sweep interval: the watchdog pings stop and systemd restarts the "
      "supervisor.", "Nothing to do at once; read the lines before it for what wedged the sweeper."),
    E("webhook_delivery_failed", "warning", "event_id job_id job_event attempt error retry_in_s",
      "One delivery attempt to the webhook receiver failed; retried after `retry_in_s`.",
      "Check the receiver (the `error`); events wait in the outbox."),
    E("webhook_events_dropped", "warning", "by_age by_count why max_events max_age_s",
      "Outbox events past its bounds were dropped: notifications were lost.",
      "Fix the receiver; raise the bounds if the outage was expected."),
    E("webhook_outbox_left_to_leader", "info", "why",
      "This host no longer sends webhooks (another host leads): an unreachable outbox is no longer its to watch.",
      _NOTHING),
    E("webhook_outbox_reachable", "info", "", "The webhook outbox can be read again.", _NOTHING),
    E("webhook_outbox_unreachable", "warning", "error retry_every_s",
      "Once per episode: the webhook sender cannot read the outbox (the registry).",
      "Follow `registry_writes_failing`."),
)  # fmt: skip


def log_events_table() -> str:
    """The table of ``docs/log-events.md``, one row per declared event (``tools/doc_tables.py`` writes it there)."""
    rows = ["| event | level | fields | what it means | what to do |", "|---|---|---|---|---|"]
    for event in LOG_EVENTS:
        fields = ", ".join(f"`{f}`" if not f.startswith("+") else f"*{f[1:]}*" for f in event.fields.split())
        level = "/".join(level.upper() for level in event.level.split("/"))
        rows.append(f"| <a id=\"{event.name}\"></a>`{event.name}` | {level} | {fields} | {event.means} | "
                    f"{event.action} |")  # fmt: skip
    return "\n".join(rows)
