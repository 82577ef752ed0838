#!/usr/bin/env bash
# Router builds side by side, interleaved cell by cell (round 1: A, B, ..., round 2: ...), with
# the router's CPU time per request (utime + stime of /proc/<pid>/stat over the cell): on a
# shared machine the CPU per request moves much less than req/s. The fake workers and wrk
# of the shared peer bench on CORE_LOAD, every router pinned to CORE_ROUTER (one at a time
# under load).
#
#   VARIANTS="base:/path/to/old/checkout new:$PWD sg:sglang" ROUNDS=3 DUR=4 \
#   MATRIX="comp2k:1 comp2k:32 comp2k:128" bash bench/proxy/proxy_ab.sh
#
# A variant is name:source (a checkout put first on PYTHONPATH, run with this venv's
# cache-router) or name:sglang (sglang-router cache_aware from $W/venv). Needs wrk, bodies
# from make_bodies.py in $W/bodies, uvloop in $W/wvenv (see bench/proxy/proxy_peer.sh).
# EXTRA: router flags for every cache-router variant; EXTRA_<name>: for that variant only
# (e.g. VARIANTS="ttft:$PWD rr:$PWD" EXTRA_rr="--policy round_robin").
# Results: $OUT/res.tsv (one line per run and cell).
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # the repository (this file: bench/*/)
W=${WORK:-${TMPDIR:-/tmp}/peerbench}
SB=${SHARED_BENCH:-$REPO/../shared/bench}
BIN=${ROUTER_BIN:-$REPO/.venv/bin/cache-router}
CORE_ROUTER=${CORE_ROUTER:-0}
CORE_LOAD=${CORE_LOAD:-1}
DUR=${DUR:-4}
ROUNDS=${ROUNDS:-3}
MATRIX=${MATRIX:-"comp2k:1 comp2k:32 comp2k:128"}
VARIANTS=${VARIANTS:?set VARIANTS="name:source ..."}
EXTRA=${EXTRA:-}
OUT=${OUT:-$W/ab-$(date +%Y%m%d-%H%M%S)}
[ -s "$W/bodies/comp2k.jsonl" ] || python3 "$SB/make_bodies.py" "$W/bodies" > /dev/null
mkdir -p "$OUT"
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT INT TERM
for p in 19001 19002; do
  taskset -c $CORE_LOAD $W/wvenv/bin/python $SB/fake_worker.py --port $p > "$OUT/w$p.log" 2>&1 &
  PIDS+=($!)
done
sleep 1
port=19100
declare -A RP RPID
for v in $VARIANTS; do
  name=${v%%:*} src=${v#*:}
  port=$((port + 1))
  if [ "$src" = sglang ]; then
    taskset -c $CORE_ROUTER $W/venv/bin/python -m sglang_router.launch_router --host 127.0.0.1 --port $port \
      --prometheus-host 127.0.0.1 --prometheus-port $((port + 50)) --log-level warn \
      --worker-urls http://127.0.0.1:19001 http://127.0.0.1:19002 --policy cache_aware > "$OUT/r_$name.log" 2>&1 &
  else
    own="EXTRA_$name"
    PYTHONPATH=$src taskset -c $CORE_ROUTER $BIN serve --port $port \
      --worker http://127.0.0.1:19001 http://127.0.0.1:19002 --log-level warning $EXTRA ${!own:-} > "$OUT/r_$name.log" 2>&1 &
  fi
  RPID[$name]=$!; RP[$name]=$port; PIDS+=($!)
done
for v in $VARIANTS; do
  name=${v%%:*}
  for _ in $(seq 1 200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 -X POST "http://127.0.0.1:${RP[$name]}/v1/completions" \
      -H 'Content-Type: application/json' -d '{"model":"fake-model","prompt":"hi","max_tokens":1}')
    [ "$code" = 200 ] && break; sleep 0.3
  done
  BODIES=$W/bodies/comp2k.jsonl taskset -c $CORE_LOAD wrk -t1 -c8 -d1s -s $SB/post.lua "http://127.0.0.1:${RP[$name]}" > /dev/null 2>&1
done
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
printf "round\tvariant\twl\tc\trps\tp50\tp99\treqs\tnon2xx\tsockerr\tcpu_us_per_req\n" | tee "$OUT/res.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for m in $MATRIX; do
    wl=${m%%:*} c=${m##*:} path=/v1/completions
    case $wl in chat*) path=/v1/chat/completions;; esac
    for v in $VARIANTS; do
      name=${v%%:*}
      t0=$(ticks ${RPID[$name]})
      BODIES=$W/bodies/$wl.jsonl REQ_PATH=$path taskset -c $CORE_LOAD wrk -t1 -c$c -d${DUR}s --timeout 10s --latency \
        -s $SB/post.lua "http://127.0.0.1:${RP[$name]}" > "$OUT/wrk_${r}_${name}_${wl}_$c.txt" 2>&1
      t1=$(ticks ${RPID[$name]})
      line=$(python3 $SB/wrk_parse.py "$OUT/wrk_${r}_${name}_${wl}_$c.txt")
      reqs=$(echo "$line" | cut -f4)
      cpu=$(awk -v d=$((t1 - t0)) -v n=$reqs 'BEGIN{ if (n>0) printf "%.1f", d*10000/n; else print "nan"}')
      printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$r" "$name" "$wl" "$c" "$line" "$cpu" | tee -a "$OUT/res.tsv"
    done
  done
done
echo "out: $OUT"
