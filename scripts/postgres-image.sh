#!/usr/bin/env bash
# A PostgreSQL image for compose/docker-compose.fleet.yml on an engine with no image registry (ADR 0012).
#
#   scripts/postgres-image.sh up     build podcast-postgres:local when missing or stale (needs the Docker engine:
#                                    scripts/docker-engine.sh up; and Debian's postgresql: scripts/postgres.sh up
#                                    installs it); prints the image name. Idempotent.
#   scripts/postgres-image.sh check  exit 0 when the image is on the engine and current; else say why, exit 1.
#
# Where a registry is reachable the fleet file runs the official `postgres:16` image and this script is not needed.
# Here `docker pull` cannot work, so the image is made as scripts/docker-engine.sh makes the supervisor's: a root
# filesystem of this machine's files brought in with `docker import` — busybox, and Debian's PostgreSQL server
# (its binaries, the shared libraries `ldd` names, its share/ files, the time zone data), with a small entrypoint
# that speaks the part of the official image's interface the fleet file uses:
#
#   POSTGRES_PASSWORD (required on first start), POSTGRES_USER (default postgres), POSTGRES_DB (default: the user's
#   name), PGDATA (default /var/lib/postgresql/data); an empty data directory is initialised on first start (local
#   connections trusted, every other connection by scram-sha-256 password), then the server replaces the
#   entrypoint (exec: PID 1, so that `docker stop` reaches it) and listens on every address. `pg_isready` is on PATH for the healthcheck.
#
# The server runs as the user `postgres` (uid 999, as in the official image); the data directory in the image
# belongs to it, so a named volume mounted there starts out owned by it too.
#
# Environment: ENGINE_WORK (default /tmp/podcast-docker-engine) holds the build's scratch directory;
# POSTGRES_IMAGE (default podcast-postgres:local).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${ENGINE_WORK:-/tmp/podcast-docker-engine}
IMG=${POSTGRES_IMAGE:-podcast-postgres:local}
mkdir -p "$W"

bindir() {  # the newest installed server's binaries (Debian keeps them out of PATH)
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$d" ] && [ -x "$d/postgres" ] && echo "$d"
}

ENTRYPOINT='#!/bin/sh
# The official postgres image'"'"'s first-start steps, the few the fleet file uses (scripts/postgres-image.sh).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "error: the database is not initialised and POSTGRES_PASSWORD is not set" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf "%s\n" "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --no-locale >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '"'"'*'"'"'" >>"$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\"" | postgres --single -D "$PGDATA" -j postgres >/dev/null
  fi
  echo "initialised $PGDATA (user $user, database $db)" >&2
fi
exec postgres -D "$PGDATA" "$@"
'

source_hash() {  # what the image is built from: the server's version and this script
  # The script by its content, never its path: every checkout of one commit builds (and accepts) the same image.
  ("$(bindir)/postgres" -V; sha256sum <"$ROOT/scripts/postgres-image.sh") | sha256sum | cut -c1-16
}

image_hash() {
  docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$IMG" 2>/dev/null |
    sed -n 's/^PODCAST_IMAGE_SOURCE=//p'
}

build_image() {
  local hash=$1 bin lib share version r="$W/pg-rootfs"
  bin=$(bindir)
  lib=$(dirname "$bin")/lib
  version=$(basename "$(dirname "$bin")")
  share=/usr/share/postgresql/$version
  rm -rf "$r"
  mkdir -p "$r"/{usr/bin,usr/lib,usr/lib64,usr/local/bin,etc,tmp,proc,sys,dev,root,var/run/postgresql}
  mkdir -p "$r/var/lib/postgresql/data"
  chmod 1777 "$r/tmp"
  for d in bin lib lib64 sbin; do ln -s "usr/$d" "$r/$d"; done
  ln -s bin "$r/usr/sbin"
  cp /bin/busybox "$r/usr/bin/"
  for a in sh ls cat echo env sleep ps id kill true false mktemp rm printf; do ln -s busybox "$r/usr/bin/$a"; done
  # The server's files at the paths it was built with (Debian: lib/ beside bin/, share/ under /usr/share).
  mkdir -p "$r$bin" "$r$lib"
  for b in postgres initdb pg_ctl pg_isready psql; do cp "$bin/$b" "$r$bin/"; done
  find "$lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp {} "$r$lib/" \;  # JIT (LLVM) left out: off
  tar -C / -cf - "${share#/}" usr/share/zoneinfo | tar -C "$r" -xf -
  for f in "$r$bin"/* "$r$lib"/*.so; do
    ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true
  done | sort -u | while read -r l; do [ -e "$r$l" ] || cp -L --parents "$l" "$r/"; done
  printf '%s' "$ENTRYPOINT" >"$r/usr/local/bin/docker-entrypoint.sh"
  chmod 755 "$r/usr/local/bin/docker-entrypoint.sh"
  printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999::/var/lib/postgresql:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\npostgres:x:999:\n' >"$r/etc/group"
  printf 'hosts: files dns\n' >"$r/etc/nsswitch.conf"
  chown -R 999:999 "$r/var/lib/postgresql" "$r/var/run/postgresql"
  chmod 700 "$r/var/lib/postgresql/data"
  local previous
  previous=$(docker image inspect -f '{{.Id}}' "$IMG" 2>/dev/null || true)
  tar -C "$r" --numeric-owner -cf - . | docker import \
    -c "ENV PATH=/usr/local/bin:$bin:/usr/bin:/bin" -c 'ENV PGDATA=/var/lib/postgresql/data' -c 'ENV TZ=UTC' \
    -c "ENV PODCAST_IMAGE_SOURCE=$hash" -c 'USER postgres' -c 'WORKDIR /var/lib/postgresql' \
    -c 'VOLUME /var/lib/postgresql/data' -c 'EXPOSE 5432' \
    -c 'ENTRYPOINT ["docker-entrypoint.sh"]' - "$IMG" >/dev/null
  rm -rf "$r"
  [ -z "$previous" ] || docker image rm "$previous" >/dev/null 2>&1 || true
}

up() {
  [ -n "$(bindir)" ] || { echo "PostgreSQL is not installed here (scripts/postgres.sh up installs it)" >&2; return 1; }
  timeout 10 docker info >/dev/null 2>&1 || { echo "the Docker engine does not answer (scripts/docker-engine.sh up)" >&2; return 1; }
  local hash
  hash=$(source_hash)
  [ "$(image_hash)" = "$hash" ] || build_image "$hash"
  echo "$IMG"
}

check() {
  [ -n "$(bindir)" ] || { echo "PostgreSQL is not installed here (scripts/postgres.sh up installs it)"; return 1; }
  timeout 10 docker info >/dev/null 2>&1 || { echo "the Docker engine does not answer"; return 1; }
  local have
  have=$(image_hash || true)
  [ -n "$have" ] || { echo "no image $IMG (scripts/postgres-image.sh up builds it)"; return 1; }
  [ "$have" = "$(source_hash)" ] || { echo "image $IMG is stale (scripts/postgres-image.sh up rebuilds it)"; return 1; }
  echo "$IMG"
}

case "${1:-}" in
  up) up ;;
  check) check ;;
  *) echo "usage: $0 up|check" >&2; exit 2 ;;
esac
