#!/usr/bin/env bash
# What `make bench` needs besides the project's venv: Debian's task-spooler, redis-server and GNU parallel (apt-get,
# only when a binary is missing; we run as root) and RQ, py-spy and matplotlib (the plot of docs/performance.md) in the
# bench venv (bench/requirements.txt).
# A peer that cannot be installed is not fatal: the benchmark skips it and prints why.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
BENCH_VENV="${BENCH_VENV:-.venv-bench}"

missing=()
command -v tsp >/dev/null 2>&1 || missing+=(task-spooler)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v parallel >/dev/null 2>&1 || missing+=(parallel)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing ${missing[*]} (apt-get)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
            echo "warning: apt-get could not install ${missing[*]}; the benchmark skips those peers" >&2
    else
        echo "warning: cannot install ${missing[*]} (needs root and apt-get); the benchmark skips those peers" >&2
    fi
fi

stamp="$BENCH_VENV/.installed"
if [ ! -f "$stamp" ] || [ bench/requirements.txt -nt "$stamp" ]; then
    [ -x "$BENCH_VENV/bin/python" ] || "$PYTHON" -m venv "$BENCH_VENV"
    if "$BENCH_VENV/bin/pip" install --quiet -r bench/requirements.txt; then
        touch "$stamp"
    else
        echo "warning: could not install RQ/py-spy into $BENCH_VENV; the benchmark skips RQ" >&2
    fi
fi
