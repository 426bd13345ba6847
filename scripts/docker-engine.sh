#!/usr/bin/env bash
# A local Docker engine for docker exec mode and its tests, with no image registry.
#
#   scripts/docker-engine.sh up     install Debian's docker.io (+ docker-compose) when missing, start dockerd when it is
#                                   not answering, build podcast-job-supervisor:local when missing or stale; prints
#                                   the image name. Idempotent: a second `up` does nothing but check.
#   scripts/docker-engine.sh down   stop the dockerd this script started (SIGTERM, by its pid). Job containers keep
#                                   running: the daemon runs with live-restore (below), and the next `up` finds them.
#   scripts/docker-engine.sh check  exit 0 when the engine answers and the image is current; else say why, exit 1
#                                   (installs and starts nothing: the tests ask this before they use the engine).
#
# No registry is reachable on these machines, so the image is not built FROM anything: it is a root filesystem made of
# this machine's files (busybox, Debian's python3.11 with its libraries and stdlib), the project's dependencies
# (pip, pinned by constraints.txt) and the project's two packages, brought in with `docker import`.
#
# Why live-restore: dockerd stops every container when it gets SIGTERM, unless live-restore is on. A job container
# must outlive a daemon restart (an upgrade, a crash, the tests' "dockerd stopped while a job runs"): stopping it
# would end the job, and a restart policy would run it a second time. The daemon's settings live in a daemon.json
# written here (passed with --config-file), never in /etc/docker.
#
# Environment: ENGINE_WORK (default /tmp/podcast-docker-engine) holds dockerd's log and pid, the daemon.json and the
# build cache; ENGINE_IMAGE (default podcast-job-supervisor:local).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${ENGINE_WORK:-/tmp/podcast-docker-engine}
IMG=${ENGINE_IMAGE:-podcast-job-supervisor:local}
PY_VERSION=3.11
# The interpreter the image gets (Debian's); its dependencies are installed by it too, so compiled wheels match.
HOST_PY=/usr/bin/python$PY_VERSION
mkdir -p "$W"

alive() { [ -e "/proc/$1" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]; }
answering() { timeout 10 docker info >/dev/null 2>&1; }

install_packages() {
  local want=()
  command -v dockerd >/dev/null || want+=(docker.io)
  [ -x /bin/busybox ] || want+=(busybox-static)
  command -v docker-compose >/dev/null || want+=(docker-compose)
  # The image is made of Debian's python3.11, and its dependencies are installed with it (venv + pip).
  [ -x "$HOST_PY" ] || want+=("python$PY_VERSION")
  "$HOST_PY" -c 'import ensurepip' 2>/dev/null || want+=("python$PY_VERSION-venv")
  [ ${#want[@]} -eq 0 ] && return 0
  echo "installing ${want[*]}" >&2
  apt-get update -qq >"$W/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >>"$W/apt.log" 2>&1 ||
    { tail -20 "$W/apt.log" >&2; return 1; }
}

start_daemon() {
  answering && return 0
  # A SIGKILLed dockerd leaves its pid file behind and the next start fails with "pid file found".
  local p
  p=$(cat /var/run/docker.pid 2>/dev/null || true)
  if [ -n "$p" ] && ! alive "$p"; then rm -f /var/run/docker.pid; fi
  printf '{\n  "live-restore": true\n}\n' >"$W/daemon.json"
  # No systemd here: run dockerd directly (it starts its own containerd), in its own session.
  setsid nohup dockerd --config-file "$W/daemon.json" -H unix:///var/run/docker.sock \
    >>"$W/dockerd.log" 2>&1 </dev/null &
  echo $! >"$W/dockerd.pid"
  for _ in $(seq 1 120); do answering && return 0; sleep 0.25; done
  tail -40 "$W/dockerd.log" >&2
  return 1
}

source_hash() {  # what the image was built from: the packages, the pins, the dependency list, this script
  (cd "$ROOT" && find supervisor pipeline_runner -type f \( -name '*.py' -o -name py.typed \) | LC_ALL=C sort |
    xargs sha256sum && sha256sum pyproject.toml constraints.txt scripts/docker-engine.sh) | sha256sum | cut -c1-16
}

image_hash() {
  docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$IMG" 2>/dev/null |
    sed -n 's/^PODCAST_IMAGE_SOURCE=//p'
}

dependencies() {  # the runtime dependencies named in pyproject.toml, one per line
  "$HOST_PY" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    print("\n".join(tomllib.load(fh)["project"]["dependencies"]))
PY
}

build_deps() {  # pip --target, cached by the pins: a code change rebuilds the image in seconds
  local key dir
  key=$( (sha256sum <"$ROOT/constraints.txt"; dependencies; "$HOST_PY" -VV) | sha256sum | cut -c1-16)  # by content, not path
  dir="$W/deps-$key"
  if [ ! -d "$dir" ]; then
    [ -x "$W/pip-venv/bin/pip" ] || "$HOST_PY" -m venv "$W/pip-venv"
    rm -rf "$dir.tmp"
    mapfile -t deps < <(dependencies)
    "$W/pip-venv/bin/pip" install --quiet --disable-pip-version-check --no-compile --target "$dir.tmp" \
      -c "$ROOT/constraints.txt" "${deps[@]}" >&2
    rm -rf "$dir.tmp/bin"
    mv "$dir.tmp" "$dir"
    find "$W" -maxdepth 1 -name 'deps-*' ! -name "deps-$key" -exec rm -rf {} +  # older pins
  fi
  echo "$dir"
}

build_image() {
  local hash=$1 r="$W/rootfs" deps site
  deps=$(build_deps)
  rm -rf "$r"
  mkdir -p "$r"/{usr/bin,usr/lib,usr/lib64,usr/local/bin,etc,tmp,proc,sys,dev,root,data}
  chmod 1777 "$r/tmp"
  for d in bin lib lib64 sbin; do ln -s "usr/$d" "$r/$d"; done
  ln -s bin "$r/usr/sbin"
  cp /bin/busybox "$r/usr/bin/"
  for a in sh ls cat echo env sleep ps id kill true false wget; do ln -s busybox "$r/usr/bin/$a"; done
  cp "$HOST_PY" "$r/usr/bin/"
  ln -s "python$PY_VERSION" "$r/usr/bin/python3"
  ln -s python3 "$r/usr/bin/python"
  for f in "$HOST_PY" "/usr/lib/python$PY_VERSION"/lib-dynload/*.so "$deps"/*/*.so "$deps"/*/*/*.so; do
    [ -e "$f" ] && { ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true; }
  done | sort -u | while read -r l; do cp -L --parents "$l" "$r/"; done
  tar -C / --exclude="usr/lib/python$PY_VERSION/test" --exclude=__pycache__ -cf - "usr/lib/python$PY_VERSION" |
    tar -C "$r" -xf -
  site="$r/usr/local/lib/python$PY_VERSION/dist-packages"
  mkdir -p "$site"
  cp -a "$deps/." "$site/"
  (cd "$ROOT" && tar --exclude=__pycache__ -cf - supervisor pipeline_runner) | tar -C "$site" -xf -
  # The console scripts of pyproject.toml's [project.scripts], as pip would write them.
  for cmd in supervisor:supervisor.cli pipeline-runner:pipeline_runner._cli; do
    printf '#!/usr/bin/python3\nimport sys\nfrom %s import main\nsys.exit(main())\n' "${cmd#*:}" \
      >"$r/usr/local/bin/${cmd%%:*}"
    chmod 755 "$r/usr/local/bin/${cmd%%:*}"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  printf 'hosts: files dns\n' >"$r/etc/nsswitch.conf"
  local previous
  previous=$(docker image inspect -f '{{.Id}}' "$IMG" 2>/dev/null || true)
  tar -C "$r" -cf - . | docker import \
    -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' -c 'ENV PYTHONDONTWRITEBYTECODE=1' \
    -c "ENV PODCAST_IMAGE_SOURCE=$hash" -c 'ENV PODCAST_JOB_DATA_DIR=/data' -c 'ENV PODCAST_JOB_BIND=0.0.0.0:8000' \
    -c 'WORKDIR /data' \
    -c 'CMD ["supervisor", "serve"]' - "$IMG" >/dev/null
  rm -rf "$r"
  # The image it replaces is left untagged: remove it unless a container still uses it.
  [ -z "$previous" ] || docker image rm "$previous" >/dev/null 2>&1 || true
}

up() {
  install_packages
  start_daemon
  local hash
  hash=$(source_hash)
  [ "$(image_hash)" = "$hash" ] || build_image "$hash"
  echo "$IMG"
}

down() {  # only the dockerd this script started, by its pid
  [ -f "$W/dockerd.pid" ] || return 0
  local p
  p=$(cat "$W/dockerd.pid")
  if alive "$p"; then
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 1 120); do alive "$p" || break; sleep 0.25; done
  fi
  rm -f "$W/dockerd.pid"
}

check() {
  command -v docker >/dev/null || { echo "no docker command"; return 1; }
  answering || { echo "the Docker engine does not answer"; return 1; }
  local want have
  want=$(source_hash)
  have=$(image_hash || true)
  [ -n "$have" ] || { echo "no image $IMG"; return 1; }
  [ "$have" = "$want" ] || { echo "image $IMG is stale (built from other sources)"; return 1; }
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  check) check ;;
  *) echo "usage: $0 up|down|check" >&2; exit 2 ;;
esac
