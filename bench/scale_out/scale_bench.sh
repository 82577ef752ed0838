#!/usr/bin/env bash
# Scale-out: cache-router `serve --processes N` against sglang-router (cache_aware) pinned to the
# same N cores, through the shared peer benchmark (peer_bench.sh: instant fake workers + wrk on the
# load cores, results.tsv per run), plus the per-request cost of shared state: one process with and
# without --state-url (a redis-server this script starts on a unix socket).
#
#   bash bench/scale_out/scale_bench.sh                                   # this machine: half the cores each side
#   DUR=2 PROCS="1 2" bash bench/scale_out/scale_bench.sh                 # quick check (2 cores: router 0, load 1)
#   CORES_ROUTER=0-7 CORES_LOAD=8-15 INSTALL=0 PEER_BENCH=... ROUTER_BIN=... REDIS_SERVER=... \
#     WORK=... PY=... bash bench/scale_out/scale_bench.sh                 # offline machine, all pre-installed
#
# Knobs (defaults):
#   PEER_BENCH=/work/shared/bench/peer_bench.sh   ROUTER_BIN=<repo>/.venv/bin/cache-router
#   REDIS_SERVER=$(command -v redis-server)       WORK=$TMPDIR/scalebench (venvs `venv`, `wvenv`, bodies)
#   OUT=$WORK/scale-<time>   PY=python3   DUR=5   NWORK=4   INSTALL=1 (passed to peer_bench)
#   CORES_ROUTER / CORES_LOAD: taskset lists; default first / second half of the cores (2 cores: 0 / 1)
#   PROCS: processes to try; default those of "1 2 4 8" that fit the router cores (at least 1 2)
#   CONCS="1 32 128" (comp2k concurrencies per process count)   SHARE_CONCS="1 32" (sharing cost)
#   TARGETS="direct sglang_ca custom"   ROUTER_ARGS="--log-level warning"   WRK_THREADS (peer_bench copy
#   in .devkit/bench only)   SHARE=1 (0: skip the sharing-cost runs)
# N processes run on the first min(N, router cores) router cores; sglang-router gets the same cores.
# Output: $OUT/p<N>/ and $OUT/share_{off,on}/ (peer_bench's own folders), $OUT/scale_report.md.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # the repository (this file: bench/*/)
PEER_BENCH=${PEER_BENCH:-/work/shared/bench/peer_bench.sh}
ROUTER_BIN=${ROUTER_BIN:-$REPO/.venv/bin/cache-router}
REDIS_SERVER=${REDIS_SERVER:-$(command -v redis-server || true)}
export WORK=${WORK:-${TMPDIR:-/tmp}/scalebench}
OUT=${OUT:-$WORK/scale-$(date +%Y%m%d-%H%M%S)}
export PY=${PY:-python3}
export DUR=${DUR:-5} NWORK=${NWORK:-4} INSTALL=${INSTALL:-1} AFFINITY=${AFFINITY:-0}
CONCS=${CONCS:-"1 32 128"}
SHARE_CONCS=${SHARE_CONCS:-"1 32"}
SHARE=${SHARE:-1}
SCALE_TARGETS=${TARGETS:-"direct sglang_ca custom"}
ROUTER_ARGS=${ROUTER_ARGS:-"--log-level warning"}
ROUTER_PORT=18400 # peer_bench's port for the custom target

[ -f "$PEER_BENCH" ] || { echo "PEER_BENCH=$PEER_BENCH not found" >&2; exit 1; }
[ -x "$ROUTER_BIN" ] || { echo "ROUTER_BIN=$ROUTER_BIN not executable" >&2; exit 1; }
[ -n "$REDIS_SERVER" ] && [ -x "$REDIS_SERVER" ] || { echo "redis-server not found: set REDIS_SERVER" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk not on PATH" >&2; exit 1; }
mkdir -p "$WORK" "$OUT"

NCPU=$(nproc)
[ "$NCPU" -ge 2 ] || { echo "needs at least 2 cores (router | load)" >&2; exit 1; }
HALF=$((NCPU / 2))
CORES_ROUTER=${CORES_ROUTER:-0-$((HALF - 1))}
CORES_LOAD=${CORES_LOAD:-$HALF-$((NCPU - 1))}
expand() { # taskset list -> one cpu id per line
  local part a b
  for part in ${1//,/ }; do
    a=${part%-*}; b=${part#*-}
    seq "$a" "$b"
  done
}
mapfile -t RCPUS < <(expand "$CORES_ROUTER")
NR=${#RCPUS[@]}
if [ -z "${PROCS:-}" ]; then
  PROCS=""
  for p in 1 2 4 8; do
    if [ "$p" -le "$NR" ] || [ "$p" -le 2 ]; then PROCS="$PROCS $p"; fi
  done
fi
cores_for() { # processes -> taskset list of the first min(N, NR) router cores
  local n=$1; [ "$n" -gt "$NR" ] && n=$NR
  local IFS=,; echo "${RCPUS[*]:0:$n}"
}
matrix() { local m="" c; for c in $1; do m="$m comp2k:$c"; done; echo "${m# }"; }

# the supervisor finds redis-server on PATH (private one for --processes N > 1)
mkdir -p "$WORK/scale-bin"
ln -sf "$(cd "$(dirname "$REDIS_SERVER")" && pwd)/$(basename "$REDIS_SERVER")" "$WORK/scale-bin/redis-server"
export PATH="$WORK/scale-bin:$PATH"

PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT INT TERM

port_busy() { # port -> 0 when something listens on it (IPv4 or IPv6)
  local hex; hex=$(printf ':%04X ' "$1")
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v h="$hex" '$4 == "0A" && index($2 " ", h)' | grep -q .
}
wait_port_free() { # port -> waits up to 30 s (a --processes child that outlived its supervisor
  local i                  # would keep taking connections on the shared port)
  for i in $(seq 1 300); do port_busy "$1" || return 0; sleep 0.1; done
  echo "port $1 still in use after 30 s" | tee -a "$OUT/problems.txt" >&2
  return 1
}

peer() { # name cores matrix targets custom_cmd
  local name=$1 cores=$2 mx=$3 targets=$4 cmd=$5
  wait_port_free $ROUTER_PORT || return 1
  echo "=== $name: router cores $cores, load cores $CORES_LOAD, $mx, $targets"
  echo "$name: $cmd" >> "$OUT/commands.txt"
  OUT="$OUT/$name" CORE_ROUTER="$cores" CORE_LOAD="$CORES_LOAD" MATRIX="$mx" TARGETS="$targets" \
    CUSTOM_CMD="$cmd" bash "$PEER_BENCH" > "$OUT/$name.log" 2>&1
  local rc=$?
  awk -F'\t' '$2 ~ /^comp/' "$OUT/$name.log"
  [ $rc = 0 ] || echo "$name: peer_bench exited $rc (see $OUT/$name.log)" | tee -a "$OUT/problems.txt"
  [ -s "$OUT/$name/problems.txt" ] && sed "s/^/$name: /" "$OUT/$name/problems.txt" | tee -a "$OUT/problems.txt"
  wait_port_free $ROUTER_PORT
  return 0
}

{
  echo "date: $(date -Is)  host: $NCPU cores  router cores: $CORES_ROUTER  load cores: $CORES_LOAD"
  echo "PROCS=${PROCS# } CONCS=$CONCS SHARE_CONCS=$SHARE_CONCS DUR=$DUR NWORK=$NWORK WRK_THREADS=${WRK_THREADS:-1}"
  echo "PEER_BENCH=$PEER_BENCH ROUTER_BIN=$ROUTER_BIN REDIS_SERVER=$REDIS_SERVER WORK=$WORK"
  echo "redis-server: $("$REDIS_SERVER" --version 2>&1 | head -1)"
  echo "sglang-router $("$WORK/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang-router"))' 2>/dev/null || echo '(venv not made yet)')"
} | tee "$OUT/scale_env.txt"

for n in $PROCS; do
  peer "p$n" "$(cores_for "$n")" "$(matrix "$CONCS")" "$SCALE_TARGETS" \
    "$ROUTER_BIN serve --port {PORT} --worker {WORKERS} --processes $n $ROUTER_ARGS"
done

if [ "$SHARE" = 1 ]; then
  # one process, alone on the first router core; the shared redis-server on the other router cores
  RDIR=$(mktemp -d "${TMPDIR:-/tmp}/scale-redis.XXXXXX")
  RSOCK="$RDIR/redis.sock"
  rcores=$(cores_for "$NR"); [ "$NR" -gt 1 ] && rcores=$(IFS=,; echo "${RCPUS[*]:1}")
  taskset -c "$rcores" "$REDIS_SERVER" --port 0 --unixsocket "$RSOCK" --unixsocketperm 700 \
    --save '' --appendonly no --daemonize no --dir "$RDIR" > "$OUT/redis-server.log" 2>&1 &
  REDIS_PID=$!; PIDS+=("$REDIS_PID")
  for _ in $(seq 1 100); do [ -S "$RSOCK" ] && break; sleep 0.1; done
  if [ -S "$RSOCK" ]; then
    echo "redis-server pid $REDIS_PID on $RSOCK (cores $rcores)" | tee -a "$OUT/scale_env.txt"
    one=$(cores_for 1)
    peer share_off "$one" "$(matrix "$SHARE_CONCS")" "direct custom" \
      "$ROUTER_BIN serve --port {PORT} --worker {WORKERS} $ROUTER_ARGS"
    peer share_on "$one" "$(matrix "$SHARE_CONCS")" "direct custom" \
      "$ROUTER_BIN serve --port {PORT} --worker {WORKERS} --state-url unix://$RSOCK $ROUTER_ARGS"
  else
    echo "redis-server did not start (see $OUT/redis-server.log)" | tee -a "$OUT/problems.txt"
  fi
  kill "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null
  rm -rf "$RDIR"
fi

"$PY" - "$OUT" $PROCS > "$OUT/scale_report.md" <<'EOF'
import math
import os
import re
import sys

out, procs = sys.argv[1], [int(p) for p in sys.argv[2:]]


def load(name):
    rows = {}
    try:
        f = open(os.path.join(out, name, "results.tsv"))
    except OSError:
        return rows
    for line in f:
        p = line.rstrip("\n").split("\t")
        if p[0] == "target" or len(p) < 9:
            continue
        rows[(p[0], int(p[2]))] = {"rps": float(p[3]), "p50": float(p[4]), "p99": float(p[5]),
                                   "bad": int(p[7]) + int(p[8])}
    return rows


def rps(r):
    if r is None:
        return "-"
    return f"{r['rps']:.0f}" + (f" ({r['bad']} err)" if r["bad"] else "")


def added(r, d):
    if r is None or d is None or math.isnan(r["p50"]) or math.isnan(d["p50"]):
        return "-"
    return f"{r['p50'] - d['p50']:+.3f}"


def p99(r):
    return "-" if r is None or math.isnan(r["p99"]) else f"{r['p99']:.2f}"


def ratio(a, b):
    return "-" if a is None or b is None or not b["rps"] else f"{a['rps'] / b['rps']:.2f}"


def cores_of(name):
    try:
        txt = open(os.path.join(out, name, "commands.txt")).read()
        m = re.search(r"taskset -c (\S+) ", txt.split("custom launch:", 1)[1])
        return m.group(1)
    except (OSError, IndexError, AttributeError):
        return "?"


def sglang_version():
    for name in [f"p{p}" for p in procs]:  # peer_bench's env.txt (pip list in the venv)
        try:
            for line in open(os.path.join(out, name, "env.txt")):
                if line.lower().startswith("sglang-router"):
                    return " ".join(line.split())
        except OSError:
            pass
    return ""


env = open(os.path.join(out, "scale_env.txt")).read().strip().splitlines()
print("## cache-router --processes N vs sglang-router (cache_aware) on the same cores\n")
for line in env:
    print(f"    {line}")
print(f"    {sglang_version() or '(sglang-router version: see above)'}; comp2k = 2 KB non-streaming "
      "completions\n")
print("cr = cache-router, sg = sglang-router; req/s from wrk; added p50 = router p50 - direct p50 "
      "(same run, ms); p99 in ms; direct = wrk straight to one fake worker (load-side ceiling).\n")
print("| processes | router cores | conc | cr req/s | sg req/s | cr/sg | direct req/s "
      "| cr added p50 | sg added p50 | cr p99 | sg p99 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for p in procs:
    rows = load(f"p{p}")
    concs = sorted({c for _, c in rows})
    for c in concs:
        cr, sg, d = rows.get(("custom", c)), rows.get(("sglang_ca", c)), rows.get(("direct", c))
        print(f"| {p} | {cores_of(f'p{p}')} | {c} | {rps(cr)} | {rps(sg)} | {ratio(cr, sg)} | {rps(d)} "
              f"| {added(cr, d)} | {added(sg, d)} | {p99(cr)} | {p99(sg)} |")

off, on = load("share_off"), load("share_on")
if off or on:
    print("\n### Cost of shared state: one process, without / with --state-url (redis on a unix socket)\n")
    print("| conc | req/s without | req/s with | with/without | added p50 without | added p50 with "
          "| difference (ms) | p99 without | p99 with |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in sorted({c for _, c in list(off) + list(on)}):
        a, b = off.get(("custom", c)), on.get(("custom", c))
        da, db = off.get(("direct", c)), on.get(("direct", c))
        diff = "-"
        if a and b and da and db:
            diff = f"{(b['p50'] - db['p50']) - (a['p50'] - da['p50']):+.3f}"
        print(f"| {c} | {rps(a)} | {rps(b)} | {ratio(b, a)} | {added(a, da)} | {added(b, db)} "
              f"| {diff} | {p99(a)} | {p99(b)} |")

probs = os.path.join(out, "problems.txt")
if os.path.exists(probs) and os.path.getsize(probs):
    print("\n### Problems\n")
    for line in open(probs):
        print(f"    {line.rstrip()}")
EOF
echo
cat "$OUT/scale_report.md"
echo
echo "report: $OUT/scale_report.md"
