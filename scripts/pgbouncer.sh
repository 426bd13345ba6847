#!/usr/bin/env bash
# A throwaway pgbouncer in transaction pooling mode on 127.0.0.1, in front of the cluster of scripts/postgres.sh.
#
#   scripts/pgbouncer.sh up     install Debian's pgbouncer when missing, write its config into $PGB_WORK, start it (a
#                               daemon) when it is not answering, and wait (30 s at most) until a query goes through
#                               it; prints the DSN and writes it to $PGB_WORK/dsn. Idempotent: a second `up` only
#                               checks. The cluster must be up first (bash scripts/postgres.sh up); `up` says so.
#   scripts/pgbouncer.sh down   stop the pgbouncer this script started (by its pidfile) and remove its files.
#   scripts/pgbouncer.sh check  exit 0 when a query goes through pgbouncer (prints the DSN); else say why, exit 1
#                               (installs and starts nothing).
#
# "Answering" means `psql -c 'SELECT 1'` through pgbouncer works: a TCP connect, and a server connection from the
# pool. pool_mode is transaction with a small pool (default_pool_size, 4 by default): clients' transactions share
# and swap server connections, so session state (LISTEN, session advisory locks, SET, prepared statements named per
# connection) is not kept between transactions. ignore_startup_parameters lists extra_float_digits only (what asyncpg
# sends by default): the application must cope with the pooler as it is. Any database name maps to the cluster
# (`* = host=... port=...`); authentication is `trust` (the user must still be in auth_file: userlist.txt holds
# "postgres"): it is for tests and local runs, never for production.
#
# pgbouncer refuses to run as root: when this script runs as root, pgbouncer runs as the `postgres` user and the work
# directory belongs to it. It listens on TCP only (unix_socket_dir is empty). A running pgbouncer is left as it is:
# `down` then `up` to change its settings.
#
# Environment: PGB_WORK (default /tmp/podcast-job-pgbouncer) holds the config, userlist, pidfile, log and DSN file;
# PGB_PORT (default 64329), PGB_POOL_SIZE (default 4); PG_PORT (default 54329) and PG_DB (default podcast_jobs) as
# for scripts/postgres.sh.
set -euo pipefail
W=${PGB_WORK:-/tmp/podcast-job-pgbouncer}
PORT=${PGB_PORT:-64329}
POOL_SIZE=${PGB_POOL_SIZE:-4}
PG_PORT=${PG_PORT:-54329}
DB=${PG_DB:-podcast_jobs}
DSN="postgresql://postgres@127.0.0.1:$PORT/$DB"
INI="$W/pgbouncer.ini"
PIDFILE="$W/pgbouncer.pid"
LOG="$W/pgbouncer.log"

if [ "$(id -u)" = 0 ]; then as_pg=(runuser -u postgres --); else as_pg=(); fi

bindir() {  # the newest installed server's binaries (Debian keeps them out of PATH): its psql and pg_isready
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$d" ] && [ -x "$d/psql" ] && echo "$d"
}

pgbouncer_bin() {  # /usr/sbin is not on every user's PATH
  local b
  b=$(command -v pgbouncer 2>/dev/null || true)
  [ -z "$b" ] && [ -x /usr/sbin/pgbouncer ] && b=/usr/sbin/pgbouncer
  [ -n "$b" ] && echo "$b"
}

alive() {  # a running process: kill -0 also succeeds on a zombie, which the container's init may reap late
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

pid() {  # the pid in our pidfile when that process is alive and is a pgbouncer (never a reused pid)
  local p
  p=$(cat "$PIDFILE" 2>/dev/null || true)
  [[ "$p" =~ ^[0-9]+$ ]] && alive "$p" && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = pgbouncer ] && echo "$p"
}

query() {  # SELECT 1 through pgbouncer; prints psql's error (on one line) on failure
  local out
  out=$(PGCONNECT_TIMEOUT=5 timeout 15 "$(bindir)/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres -d "$DB" \
    -tAc 'SELECT 1' 2>&1) && [ "$out" = 1 ] && return 0
  out=${out//$'\n'/ }
  echo "${out//$'\t'/}"
  return 1
}

answering() { query >/dev/null 2>&1; }

backend_answering() { "$(bindir)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 5 2>/dev/null; }

log_tail() { tail -20 "$LOG" >&2 2>/dev/null || true; }

install_packages() {
  [ -n "$(pgbouncer_bin)" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "pgbouncer is not installed, and only root may install it (apt-get install pgbouncer)" >&2
    return 1
  fi
  echo "installing pgbouncer" >&2
  mkdir -p "$W"
  apt-get update -qq >"$W/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >>"$W/apt.log" 2>&1 ||
    { tail -20 "$W/apt.log" >&2; return 1; }
}

write_config() {
  mkdir -p "$W"
  echo '"postgres" ""' >"$W/userlist.txt"
  cat >"$INI" <<EOF
; written by scripts/pgbouncer.sh: a throwaway pooler for tests and local runs
[databases]
* = host=127.0.0.1 port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $W/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = $POOL_SIZE
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
server_reset_query =
pidfile = $PIDFILE
logfile = $LOG
EOF
  [ ${#as_pg[@]} -eq 0 ] || chown -R postgres:postgres "$W"
}

start_pgbouncer() {
  answering && return 0
  [ -n "$(bindir)" ] || { echo "PostgreSQL's psql is not installed (bash scripts/postgres.sh up installs it)" >&2; return 1; }
  backend_answering ||
    { echo "no PostgreSQL server answers on 127.0.0.1:$PG_PORT (bash scripts/postgres.sh up starts it)" >&2; return 1; }
  local p deadline err=""
  p=$(pid || true)
  if [ -z "$p" ]; then
    rm -f "$PIDFILE"  # a killed pgbouncer's pidfile: gone, or its pid reused by another process
    write_config
    # -d: daemon. A bad config fails here; a taken port does not (1.18 forks before it binds): its log says
    # "nowhere to listen on" and the wait below sees the process gone.
    "${as_pg[@]}" "$(pgbouncer_bin)" -d "$INI" >"$W/start.log" 2>&1 ||
      { cat "$W/start.log" >&2; log_tail; return 1; }
  fi
  # Either just started or (after `up` raced another `up`, or a slow start) already running but not yet answering.
  deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    err=$(query) && return 0
    [ -n "$(pid || true)" ] || { echo "pgbouncer exited" >&2; log_tail; return 1; }
    sleep 0.5
  done
  echo "pgbouncer on 127.0.0.1:$PORT did not answer within 30 s: $err" >&2
  log_tail
  return 1
}

up() {
  install_packages
  start_pgbouncer
  echo "$DSN" >"$W/dsn"
  echo "$DSN"
}

down() {  # only the pgbouncer this script started, and only the files it wrote
  local p
  p=$(pid || true)
  if [ -n "$p" ]; then
    kill -TERM "$p" 2>/dev/null || true  # SIGTERM: immediate shutdown (SIGINT would wait for clients to finish)
    for _ in $(seq 1 100); do  # 10 s at most
      alive "$p" || break
      sleep 0.1
    done
    if alive "$p"; then
      echo "pgbouncer (pid $p) did not stop within 10 s; killed" >&2
      kill -KILL "$p" 2>/dev/null || true
    fi
  fi
  [ -d "$W" ] || return 0
  rm -f "$INI" "$W/userlist.txt" "$PIDFILE" "$LOG" "$W/start.log" "$W/apt.log" "$W/dsn"
  rmdir "$W" 2>/dev/null || true
}

check() {
  local p err
  [ -n "$(pgbouncer_bin)" ] || { echo "pgbouncer is not installed"; return 1; }
  [ -n "$(bindir)" ] || { echo "PostgreSQL's psql is not installed"; return 1; }
  if ! err=$(query); then
    p=$(pid || true)
    if [ -z "$p" ]; then
      echo "no pgbouncer started by \`$0 up\` runs (no live pid in $PIDFILE); 127.0.0.1:$PORT: $err"
    elif ! backend_answering; then
      echo "pgbouncer (pid $p) runs, but no PostgreSQL server answers behind it on 127.0.0.1:$PG_PORT"
    else
      echo "pgbouncer (pid $p) runs, but a query through 127.0.0.1:$PORT fails: $err"
    fi
    return 1
  fi
  echo "$DSN"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  check) check ;;
  *) echo "usage: $0 up|down|check" >&2; exit 2 ;;
esac
