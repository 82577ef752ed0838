#!/usr/bin/env bash
# Where the router's time goes under load: py-spy on one router build while wrk drives 2 KB
# completions through it. Router pinned to CORE_ROUTER; 2 fake workers and wrk on CORE_LOAD
# (the shared peer bench's pieces). Prints the top self-time functions.
#
#   bash bench/proxy/proxy_profile.sh                    # this checkout, c=32
#   SRC=/path/to/old/checkout C=128 bash bench/proxy/proxy_profile.sh
#
# Needs py-spy (pip install py-spy; PYSPY=/path/to/py-spy), wrk, and $W/wvenv (uvloop) and
# $W/bodies as bench/proxy/proxy_ab.sh sets them up. Loopback only; stops only what it started.
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # the repository (this file: bench/*/)
SRC=${SRC:-$REPO}
W=${WORK:-${TMPDIR:-/tmp}/peerbench}
SB=${SHARED_BENCH:-$REPO/../shared/bench}
BIN=${ROUTER_BIN:-$REPO/.venv/bin/cache-router}
PYSPY=${PYSPY:-py-spy}
C=${C:-32}
DUR=${DUR:-12}
CORE_ROUTER=${CORE_ROUTER:-0}
CORE_LOAD=${CORE_LOAD:-1}
OUT=${OUT:-$W/profile-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
[ -s "$W/bodies/comp2k.jsonl" ] || python3 "$SB/make_bodies.py" "$W/bodies" > /dev/null
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT INT TERM
for p in 19701 19702; do
  taskset -c "$CORE_LOAD" "$W/wvenv/bin/python" "$SB/fake_worker.py" --port $p > /dev/null 2>&1 &
  PIDS+=($!)
done
PYTHONPATH=$SRC taskset -c "$CORE_ROUTER" "$BIN" serve --port 19710 \
  --worker http://127.0.0.1:19701 http://127.0.0.1:19702 --log-level warning > "$OUT/router.log" 2>&1 &
ROUTER=$!
PIDS+=($ROUTER)
for _ in $(seq 1 100); do
  curl -s -o /dev/null -m 2 -X POST http://127.0.0.1:19710/v1/completions \
    -d '{"model":"fake-model","prompt":"hi","max_tokens":1}' && break
  sleep 0.3
done
BODIES=$W/bodies/comp2k.jsonl taskset -c "$CORE_LOAD" wrk -t1 -c"$C" -d$((DUR + 4))s --timeout 10s \
  -s "$SB/post.lua" http://127.0.0.1:19710 > "$OUT/wrk.txt" 2>&1 &
WRK=$!
sleep 2
"$PYSPY" record -p $ROUTER -r 250 -d "$DUR" --format raw -o "$OUT/profile.txt" > "$OUT/py-spy.log" 2>&1
wait $WRK
grep Requests/sec "$OUT/wrk.txt"
# self time per function (the leaf of each sampled stack), in % of samples
python3 - "$OUT/profile.txt" <<'EOF'
import collections, re, sys

self_time, total = collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    total += int(n)
    leaf = re.sub(r":\d+\)$", ")", stack.split(";")[-1])
    self_time[re.sub(r" \(\S*/(site-packages|python3\.\d+)/", " (", leaf)] += int(n)
for name, n in self_time.most_common(15):
    print(f"{100 * n / total:5.1f}  {name}")
EOF
echo "out: $OUT"
