"""The settings of where jobs run and how they are reached (the shepherd's run directory, the cancel grace, Docker,
the heartbeat URL), and of where the registry and the fleet live (PostgreSQL, this host's id, lease and cap): declared
here, in the order of the settings table, as the last group of ``_settings.SETTINGS``."""

from __future__ import annotations

from ._setting_readers import (
    BOOLEAN,
    DATABASE_URL,
    DOCKER_IMAGE,
    DOCKER_NETWORK,
    DOCKER_VOLUME,
    HEARTBEAT_URL,
    HOST_ID,
    HOST_MAX_CONCURRENT,
    LISTEN_URL,
    PATH,
    RUN_DIR,
    Choice,
    Num,
    Setting,
)

DATABASE_POOLERS = ("none", "transaction")

EXECUTION_AND_FLEET_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "run_dir",
        "PODCAST_JOB_RUN_DIR",
        RUN_DIR,
        default=(
            "`auto`: `/dev/shm/podcast-supervisor-<uid>/<hash of the data dir>` (made `0700`); none where "
            "`/dev/shm` is not a directory"
        ),
        rule=(
            "not `auto`, `off` or an absolute path → **error**; a directory others can write to (or not this "
            "user's) → each start fails `spawn_failed: cannot use the run directory … (PODCAST_JOB_RUN_DIR)`"
        ),
        help=(
            "subprocess mode: where the shepherd keeps jobs' state records while the supervisor is connected "
            "(tmpfs: no journal on the way from one job's exit to the next one's start). `off`: next to the logs "
            'at once (slower, as before). `check-config` prints where it lands (`run_dir_path`). See "The '
            'shepherd"'
        ),
    ),
    Setting(
        "shepherd_trace_file",
        "PODCAST_JOB_SHEPHERD_TRACE_FILE",
        PATH,
        default="unset (no trace)",
        help=(
            "diagnostics: a file the shepherd appends one JSON line to at each job's start (`ev: started`, pid, "
            "start time, `started_at`, its own identity) and exit (`ev: exited`, exit code or signal, "
            "`ended_at`), on its clock. It grows without bound: for benchmarks and investigations, not for every "
            "day (`make bench` sets it)"
        ),
    ),
    Setting(
        "cancel_grace_s",
        "PODCAST_JOB_CANCEL_GRACE_SECONDS",
        Num(floor=0.0),
        default="`30`",
        help="SIGTERM → SIGKILL grace on cancel",
    ),
    Setting(
        "docker_image",
        "PODCAST_JOB_DOCKER_IMAGE",
        DOCKER_IMAGE,
        default="`podcast-job-supervisor:local`",
        rule="empty or with white space → **error**",
        help=(
            "docker mode: the image every job container runs (it must hold `python3` and this project; "
            "`scripts/docker-engine.sh up` or `compose/Dockerfile` builds one). It must be on the engine: a "
            "missing image fails the job `spawn_failed: image … is not on the Docker engine`; nothing is pulled"
        ),
    ),
    Setting(
        "docker_network",
        "PODCAST_JOB_DOCKER_NETWORK",
        DOCKER_NETWORK,
        default="unset: the engine's default bridge",
        rule="not a network name → **error**",
        help=(
            "docker mode: the network job containers join; the one on which they reach "
            "`PODCAST_JOB_HEARTBEAT_BASE_URL` (compose: `podcast_jobs`; a supervisor on the host: `host`)"
        ),
    ),
    Setting(
        "docker_data_volume",
        "PODCAST_JOB_DOCKER_DATA_VOLUME",
        DOCKER_VOLUME,
        default="unset: the supervisor's data dir, bind-mounted",
        rule="not a volume name nor an absolute path → **error**",
        help=(
            "docker mode: what is mounted in each job container at the supervisor's data dir path (also the job's"
            " working directory). A supervisor on the host needs nothing; one in a container names its volume "
            "(compose: `podcast_corpus`)"
        ),
    ),
    Setting(
        "docker_timeout_s",
        "PODCAST_JOB_DOCKER_TIMEOUT_SECONDS",
        Num(floor=0.5),
        default="`10`",
        help=(
            "docker mode: how long any call to the engine waits for its answer (a `docker stop` adds its grace; a"
            " wait for a container's exit is a slice of its own). An engine that accepts and never answers is "
            "*unknown* after it, never a hang. Too short for your engine's `docker start` and a slow start fails "
            "its job ([operations.md, Docker mode](operations.md#docker-mode))"
        ),
    ),
    Setting(
        "heartbeat_base_url",
        "PODCAST_JOB_HEARTBEAT_BASE_URL",
        HEARTBEAT_URL,
        default="unset: the address the server is bound to (`http://127.0.0.1:PORT` for a wildcard bind)",
        rule=(
            "not an http(s) URL with a host → **error**; unset in docker mode without "
            "`PODCAST_JOB_DOCKER_NETWORK=host` → WARNING"
        ),
        help=(
            "where jobs send heartbeats (`<url>/api/jobs/<id>/heartbeat`), in both modes. From a container, the "
            "loopback address is the container's own: compose sets `http://supervisor:8000`; a supervisor on the "
            "host with `PODCAST_JOB_DOCKER_NETWORK=host` can keep the default"
        ),
    ),
    Setting(
        "database_url",
        "PODCAST_JOB_DATABASE_URL",
        DATABASE_URL,
        default="unset: the SQLite file `<data dir>/.viewer/jobs.sqlite3`",
        rule="not `postgresql://` (or `postgres://`) → **error** naming it",
        help=(
            "the registry in a PostgreSQL database instead (see [The registry on "
            "PostgreSQL](fleet.md#the-registry-on-postgresql)). Never printed with its password (`check-config` shows "
            "`user:***@host`)"
        ),
    ),
    Setting(
        "database_timeout_s",
        "PODCAST_JOB_DATABASE_TIMEOUT_SECONDS",
        Num(floor=0.1),
        default="`10`",
        help=(
            "PostgreSQL: the bound of every registry call, from waiting for a pooled connection to the commit. A "
            "call past it answers as a registry fault (503 on the API, retried by the core), never a hang"
        ),
    ),
    Setting(
        "database_auto_migrate",
        "PODCAST_JOB_DATABASE_AUTO_MIGRATE",
        BOOLEAN,
        default="`true`",
        rule="not true/false → **error**",
        help=(
            "PostgreSQL: apply this release's missing expand migrations at start (contracts wait for `supervisor"
            " migrate`: [fleet.md](fleet.md#upgrading-a-fleet)). `false`: a supervisor refuses a schema that lacks"
            " them, and the operator migrates (see below)"
        ),
    ),
    Setting(
        "database_pooler",
        "PODCAST_JOB_DATABASE_POOLER",
        Choice(DATABASE_POOLERS),
        default="`none`",
        help=(
            "PostgreSQL: `transaction` when the URL names a pooler in transaction mode (pgbouncer's `pool_mode = "
            "transaction`): statements unnamed, settings (the schema from the URL's `search_path` included) set "
            "by each transaction, no LISTEN (the sweeps move the fleet). See [Behind a connection "
            "pooler](fleet.md#several-hosts)"
        ),
    ),
    Setting(
        "database_listen_url",
        "PODCAST_JOB_DATABASE_LISTEN_URL",
        LISTEN_URL,
        default="unset: the wake-ups' session at `PODCAST_JOB_DATABASE_URL` (none behind a transaction pooler)",
        rule="not `postgresql://` → **error**; set without `PODCAST_JOB_DATABASE_URL` → **error**",
        help=(
            "PostgreSQL: where the fleet's wake-ups are LISTENed to, when the registry's URL is a pooler in "
            "transaction mode: PostgreSQL itself (or a pool in session mode). One session per host. Never printed"
            " with its password"
        ),
    ),
    Setting(
        "host_id",
        "PODCAST_JOB_HOST_ID",
        HOST_ID,
        default="the machine's hostname",
        rule="not 1-64 letters, digits, `.`, `_`, `-` → **error** (another host's name would judge the wrong jobs)",
        help=(
            "this supervisor's name in a fleet on one registry ([ADR 0012](adr/0012-fleet.md)): recorded on every"
            " row it promotes (`host_id`); only this host judges, stops or cancels those jobs' processes. A "
            "restarted supervisor must keep its host id to adopt its jobs"
        ),
    ),
    Setting(
        "host_lease_s",
        "PODCAST_JOB_HOST_LEASE_SECONDS",
        Num(floor=3.0),
        default="`15`",
        help=(
            "the host's lease on the registry, renewed every third of it. A host whose lease expired is "
            "**silent**: its running jobs keep their slots (nobody else can see its processes) until it comes "
            "back, the leader reads proof of their end, or an operator forgets it. The leader stops leading 20 % "
            "of a lease after its last renewal unless it renews again, so a partitioned leader has let go before "
            "anyone else may lead"
        ),
    ),
    Setting(
        "host_max_concurrent",
        "PODCAST_JOB_HOST_MAX_CONCURRENT",
        HOST_MAX_CONCURRENT,
        default="unset: only the fleet-wide `PODCAST_JOB_MAX_CONCURRENT`",
        rule='not a whole number ≥ 1 → **error** (never "no cap")',
        help="this host's own cap on its running jobs, counted with the fleet's in the same atomic promotion",
    ),
)
