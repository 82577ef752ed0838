#!/usr/bin/env bash
# The proxy side by side with sglang-router, through the shared peer benchmark:
# two instant fake workers and wrk on one core, each router alone on another, same run.
#
#   bash bench/proxy/proxy_peer.sh                       # direct, sglang_ca, cache-router (~6 min)
#   DUR=2 MATRIX="comp2k:1 comp2k:32" bash bench/proxy/proxy_peer.sh
#   ROUTER_BIN=/opt/other/bin/cache-router bash bench/proxy/proxy_peer.sh      # any router build
#   CUSTOM_CMD='/path/router --port {PORT} --workers {WORKERS}' bash bench/proxy/proxy_peer.sh
#
# Offline (no package index): give it what the shared script would otherwise install.
#   SGLANG_VENV=/opt/sglang-venv   a venv whose python has sglang-router (`-m sglang_router...`)
#   WORKER_VENV=/opt/uvloop-venv   a venv with uvloop for the fake workers (else plain asyncio,
#                                  slower workers: the numbers would not compare)
#   PY=python3                     a stdlib Python 3.10+ for the helper scripts (default python3.11)
#   WRK=/opt/bin/wrk               wrk, if not on PATH
# With SGLANG_VENV set, nothing is installed (INSTALL=0): the venvs are linked into $WORK.
# Knobs of the shared script pass through: WORK, OUT, DUR, MATRIX, TARGETS, CORE_ROUTER,
# CORE_LOAD, AFFINITY, BASE_PORT, NWORK, DELAY_MS. Results: $OUT (default
# $WORK/results-<time>)/report.md; copy the tables into docs/bench-history.md ("proxy (peer_bench)") and bench/RESULTS.md.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # the repository (this file: bench/*/)
PEER_BENCH=${PEER_BENCH:-$REPO/../shared/bench/peer_bench.sh}
[ -f "$PEER_BENCH" ] || PEER_BENCH=/work/shared/bench/peer_bench.sh
ROUTER_BIN=${ROUTER_BIN:-$REPO/.venv/bin/cache-router}
export WORK=${WORK:-${TMPDIR:-/tmp}/peerbench}
export TARGETS=${TARGETS:-"direct sglang_ca custom"}
export CUSTOM_CMD=${CUSTOM_CMD:-"$ROUTER_BIN serve --port {PORT} --worker {WORKERS} --log-level warning"}
mkdir -p "$WORK"
link_venv() { # given-venv name-under-WORK
  [ -x "$1/bin/python" ] || { echo "no python in $1/bin" >&2; exit 1; }
  if [ -e "$WORK/$2" ] && [ ! -L "$WORK/$2" ]; then
    echo "$WORK/$2 exists and is not a link: leaving it (it is what the bench will use)" >&2
  else
    ln -sfn "$(cd "$1" && pwd)" "$WORK/$2"
  fi
}
if [ -n "${SGLANG_VENV:-}" ]; then
  link_venv "$SGLANG_VENV" venv
  export INSTALL=${INSTALL:-0}
fi
[ -n "${WORKER_VENV:-}" ] && link_venv "$WORKER_VENV" wvenv
if [ -n "${WRK:-}" ]; then
  export PATH="$(cd "$(dirname "$WRK")" && pwd):$PATH"
fi
command -v wrk >/dev/null || { echo "wrk not found (apt-get install -y wrk, or WRK=/path/to/wrk)" >&2; exit 1; }
command -v "${PY:-python3.11}" >/dev/null || { echo "no ${PY:-python3.11}: set PY=python3" >&2; exit 1; }
case " $TARGETS " in *" custom "*)
  [ -n "${ROUTER_URL:-}" ] || [ -x "${CUSTOM_CMD%% *}" ] || command -v "${CUSTOM_CMD%% *}" >/dev/null ||
    { echo "router command not found: ${CUSTOM_CMD%% *} (set ROUTER_BIN or CUSTOM_CMD)" >&2; exit 1; };;
esac
exec bash "$PEER_BENCH"
