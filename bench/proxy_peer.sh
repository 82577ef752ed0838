#!/usr/bin/env bash
# The proxy side by side with sglang-router, through the shared peer benchmark:
# two instant fake workers and wrk on core 1, each router alone on core 0, same run.
#
#   bash bench/proxy_peer.sh                       # direct, sglang_ca, cache-router (~6 min)
#   DUR=2 MATRIX="comp2k:1 comp2k:32" bash bench/proxy_peer.sh
#
# Needs wrk (apt-get install -y wrk); the shared script creates the venvs it needs for the
# peers under $WORK. Results: $WORK/results-<time>/report.md (copy the tables into
# bench/RESULTS.md, section "proxy (peer_bench)").
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEER_BENCH=${PEER_BENCH:-/work/shared/bench/peer_bench.sh}
ROUTER_BIN=${ROUTER_BIN:-$HERE/../.venv/bin/cache-router}
export TARGETS=${TARGETS:-"direct sglang_ca custom"}
export CUSTOM_CMD=${CUSTOM_CMD:-"$ROUTER_BIN serve --port {PORT} --worker {WORKERS} --log-level warning"}
exec bash "$PEER_BENCH"
