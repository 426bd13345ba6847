#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on 127.0.0.1 for the PostgreSQL registry and its tests (ADR 0012).
#
#   scripts/postgres.sh up     install Debian's postgresql when missing, start the cluster when it is not answering
#                              (made on first use: initdb into a fresh directory under /tmp), create the database;
#                              prints the DSN and writes it to $PG_WORK/dsn. Idempotent: a second `up` only checks.
#   scripts/postgres.sh down   stop the cluster this script started (pg_ctl stop -m fast) and remove its directory.
#   scripts/postgres.sh stop   stop the server (pg_ctl stop -m fast: its sessions are ended, as a restart by an operator
#                              does) and keep the cluster directory; `start` brings the same cluster back.
#   scripts/postgres.sh start  start the cluster `up` made, when it is not answering (its data as it was); refuses
#                              when `up` made none. The restart test uses stop and start (on a private PG_PORT).
#   scripts/postgres.sh check  exit 0 when the server answers and the database exists (prints the DSN); else say
#                              why, exit 1 (installs and starts nothing: the tests ask this before they use it).
#
# The cluster runs as the `postgres` user when this script runs as root (initdb refuses root), as the calling user
# otherwise. Its directory is made with mktemp under /tmp, never inside a private tree the postgres user cannot
# enter, and listens on 127.0.0.1 only, with `trust` authentication: it is for tests and local runs, never for
# production (docs/operations.md says what a real deployment needs).
#
# Environment: PG_WORK (default /tmp/podcast-job-pg) holds the DSN file and the cluster directory's name; PG_PORT
# (default 54329), PG_DB (default podcast_jobs).
set -euo pipefail
W=${PG_WORK:-/tmp/podcast-job-pg}
PORT=${PG_PORT:-54329}
DB=${PG_DB:-podcast_jobs}
DSN="postgresql://postgres@127.0.0.1:$PORT/$DB"
mkdir -p "$W"

if [ "$(id -u)" = 0 ]; then as_pg=(runuser -u postgres --); else as_pg=(); fi

bindir() {  # the newest installed server's binaries (Debian keeps them out of PATH)
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$d" ] && [ -x "$d/pg_ctl" ] && echo "$d"
}

cluster_dir() { cat "$W/cluster" 2>/dev/null || true; }

answering() { "$(bindir)/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 5 2>/dev/null; }

has_db() {
  [ "$("$(bindir)/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$DB'" 2>/dev/null)" = 1 ]
}

install_packages() {
  [ -n "$(bindir)" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "PostgreSQL is not installed, and only root may install it (apt-get install postgresql)" >&2
    return 1
  fi
  echo "installing postgresql" >&2
  apt-get update -qq >"$W/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >>"$W/apt.log" 2>&1 ||
    { tail -20 "$W/apt.log" >&2; return 1; }
}

start_cluster() {
  answering && return 0
  local bin dir
  bin=$(bindir)
  dir=$(cluster_dir)
  if [ -z "$dir" ] || [ ! -f "$dir/data/PG_VERSION" ]; then
    # A fresh cluster: Debian's package also makes a cluster of its own (port 5432) that is never started here.
    dir=$(mktemp -d /tmp/podcast-job-pg-cluster.XXXXXX)
    [ ${#as_pg[@]} -eq 0 ] || chown postgres:postgres "$dir"
    "${as_pg[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-locale >"$W/initdb.log" 2>&1 ||
      { tail -20 "$W/initdb.log" >&2; return 1; }
    echo "$dir" >"$W/cluster"
  fi
  # A SIGKILLed server leaves postmaster.pid behind; pg_ctl sees that its pid is gone and starts anyway.
  # fsync off: a throwaway cluster for tests; a machine crash loses it whole, which is what throwaway means.
  "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 \
    -o "-p $PORT -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null ||
    { tail -20 "$dir/log" >&2; return 1; }
}

create_db() {
  has_db && return 0
  "$(bindir)/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
}

up() {
  install_packages
  start_cluster
  create_db
  echo "$DSN" >"$W/dsn"
  echo "$DSN"
}

down() {  # only the cluster this script made
  local dir
  dir=$(cluster_dir)
  [ -n "$dir" ] || return 0
  if [ -f "$dir/data/postmaster.pid" ] && [ -n "$(bindir)" ]; then
    "${as_pg[@]}" "$(bindir)/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  case "$dir" in /tmp/podcast-job-pg-cluster.*) rm -rf "$dir" ;; esac
  rm -f "$W/cluster" "$W/dsn"
}

stop() {  # the server only: the cluster directory (its data) stays for `start`
  local dir
  dir=$(cluster_dir)
  [ -n "$dir" ] || { echo "no cluster made by \`$0 up\` under $W" >&2; return 1; }
  [ -f "$dir/data/postmaster.pid" ] || return 0
  "${as_pg[@]}" "$(bindir)/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null ||
    { tail -20 "$dir/log" >&2; return 1; }
}

start() {  # the cluster `up` made, never a fresh one
  local dir
  dir=$(cluster_dir)
  [ -n "$dir" ] && [ -f "$dir/data/PG_VERSION" ] || { echo "no cluster made by \`$0 up\` under $W" >&2; return 1; }
  start_cluster
}

check() {
  [ -n "$(bindir)" ] || { echo "PostgreSQL is not installed"; return 1; }
  answering || { echo "no PostgreSQL server answers on 127.0.0.1:$PORT"; return 1; }
  has_db || { echo "the server on 127.0.0.1:$PORT has no database $DB"; return 1; }
  echo "$DSN"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  stop) stop ;;
  start) start ;;
  check) check ;;
  *) echo "usage: $0 up|down|stop|start|check" >&2; exit 2 ;;
esac
