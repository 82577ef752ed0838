#!/usr/bin/env bash
# Stop the workers that setup.sh started, by their saved PIDs (nothing else).
# Each worker was started with setsid, so its saved pid is also the id of a process group that
# holds only that worker's API server, EngineCore and Worker processes.
#   bench/real_workers/stop.sh            # every worker saved in $RW_RUN
#   bench/real_workers/stop.sh 28101      # just these ports
set -uo pipefail
RW_DIR=${RW_DIR:-${TMPDIR:-/tmp}/realworker}
RUN=${RW_RUN:-$RW_DIR/run}
shopt -s nullglob

files=()
if [ $# -gt 0 ]; then
    for p in "$@"; do files+=("$RUN/worker-$p.pid"); done
else
    files=("$RUN"/worker-*.pid)
fi

group_alive() { pgrep -g "$1" >/dev/null 2>&1; }

for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "no pid file $f" >&2; continue; }
    pid=$(cat "$f")
    if [[ ! "$pid" =~ ^[0-9]+$ ]]; then rm -f "$f"; continue; fi
    # signal the group only while the saved pid still leads it (pid reuse guard)
    if kill -0 "$pid" 2>/dev/null && [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ]; then
        kill -TERM -- "-$pid" 2>/dev/null
    elif kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
    fi
    for _ in $(seq 1 30); do
        group_alive "$pid" || kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if group_alive "$pid" || kill -0 "$pid" 2>/dev/null; then
        echo "worker group $pid still alive after 15 s: SIGKILL" >&2
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    echo "stopped worker pid $pid (${f##*/})" >&2
    rm -f "$f"
done
