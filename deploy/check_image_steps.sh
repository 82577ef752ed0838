#!/usr/bin/env bash
# `make image-steps`: prove the Dockerfile's install steps without a Docker engine.
#
# Replays the Dockerfile's build stage in a temporary directory: its COPY lines (the build
# context, as .dockerignore leaves it) and its RUN lines (deploy/install.sh, with /opt/venv and
# /src mapped into the temporary directory). Then, from that fresh venv, as the final image
# would: `cache-router --help`, `serve --help`, `sim-worker --help`, no pip left behind, and the
# HEALTHCHECK script against a real `cache-router serve` on 127.0.0.1 (503 → alive, --ready
# fails; with a simulated worker → ready; router stopped → unhealthy).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DOCKERFILE=$ROOT/Dockerfile
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
log() { echo "[image-steps] $*"; }
t0=$SECONDS

# ---- the build stage: its COPY and RUN lines, in order -------------------------------------
SRC=$TMP/src VENV=$TMP/venv
mkdir -p "$SRC"
in_build=0
while IFS= read -r line; do
    case $line in
        FROM*" AS build"*|FROM*" as build"*) in_build=1; continue ;;
        FROM*) in_build=0; continue ;;
    esac
    [ $in_build = 1 ] || continue
    read -r -a words <<<"$line"
    case ${words[0]:-} in
        COPY)
            dest=${words[-1]}
            for item in "${words[@]:1:${#words[@]}-2}"; do
                target=$SRC/$dest
                # "COPY dir/ dir/" copies the directory's contents into dest
                mkdir -p "$(dirname "$target")"
                if [ -d "$ROOT/$item" ]; then
                    mkdir -p "$target" && cp -R "$ROOT/$item/." "$target"
                else
                    case $dest in */) mkdir -p "$target" ;; esac
                    cp "$ROOT/$item" "$target"
                fi
                log "COPY $item -> $dest"
            done
            ;;
        RUN)
            cmd=${line#RUN }
            cmd=${cmd//\/opt\/venv/$VENV}
            cmd=${cmd// \/src/ $SRC}
            log "RUN $cmd"
            (cd "$SRC" && sh -c "$cmd")
            ;;
    esac
done <"$DOCKERFILE"
find "$SRC" -name __pycache__ -prune -exec rm -rf {} +
[ -x "$VENV/bin/cache-router" ] || { log "no cache-router in $VENV"; exit 1; }
log "installed in $((SECONDS - t0)) s"

# ---- what the final image runs ----------------------------------------------------------------
export PATH=$VENV/bin:$PATH
cd "$TMP"  # not the checkout: the installed package must not need it
[ ! -e "$VENV/bin/pip" ] || { log "pip is still in the venv"; exit 1; }
cache-router --version
cache-router --help >/dev/null
cache-router serve --help | grep -q -- "--config"
cache-router sim-worker --help >/dev/null
log "console script and sub-commands answer"

free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() {  # url seconds
    local deadline=$((SECONDS + $2))
    while [ $SECONDS -lt $deadline ]; do
        python - "$1" <<'PY' && return 0
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1], timeout=1)
except urllib.error.HTTPError:
    pass  # any HTTP answer: the server is up
except OSError:
    sys.exit(1)
PY
        sleep 0.2
    done
    log "$1 did not answer within $2 s"; return 1
}
HEALTHCHECK="python $ROOT/deploy/docker/healthcheck.py"
CONFIG=$ROOT/deploy/docker/config.yaml
RPORT=$(free_port) WPORT=$(free_port)

# A router with no worker: alive (503), not ready.
CACHE_ROUTER_HOST=127.0.0.1 CACHE_ROUTER_PORT=$RPORT CACHE_ROUTER_LOG_LEVEL=warning \
    cache-router serve --config "$CONFIG" &
RPID=$!; PIDS+=("$RPID")
wait_http "http://127.0.0.1:$RPORT/health" 30
CACHE_ROUTER_PORT=$RPORT $HEALTHCHECK
! CACHE_ROUTER_PORT=$RPORT $HEALTHCHECK --ready 2>/dev/null || { log "--ready passed with no worker"; exit 1; }
# The port from a YAML file (no CACHE_ROUTER_PORT): the healthcheck reads it too.
printf 'port: %s\n' "$RPORT" >"$TMP/port.yaml"
CACHE_ROUTER_HEALTHCHECK_CONFIG=$TMP/port.yaml $HEALTHCHECK
kill "$RPID"; wait "$RPID" 2>/dev/null || true

# A simulated worker behind it: ready.
cache-router sim-worker --host 127.0.0.1 --port "$WPORT" --time-scale 50 --log-level warning &
PIDS+=("$!")
wait_http "http://127.0.0.1:$WPORT/health" 30
CACHE_ROUTER_HOST=127.0.0.1 CACHE_ROUTER_PORT=$RPORT CACHE_ROUTER_LOG_LEVEL=warning \
    CACHE_ROUTER_WORKERS="http://127.0.0.1:$WPORT" cache-router serve --config "$CONFIG" &
RPID=$!; PIDS+=("$RPID")
wait_http "http://127.0.0.1:$RPORT/health" 30
deadline=$((SECONDS + 20))
until CACHE_ROUTER_PORT=$RPORT $HEALTHCHECK --ready >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { log "router not ready with a healthy worker"; exit 1; }
    sleep 0.2
done
log "healthcheck: alive without workers, ready with one"
kill "$RPID"; wait "$RPID" 2>/dev/null || true
! CACHE_ROUTER_PORT=$RPORT $HEALTHCHECK 2>/dev/null || { log "healthy with the router stopped"; exit 1; }
log "ok in $((SECONDS - t0)) s"
