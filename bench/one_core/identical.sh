#!/usr/bin/env bash
# The simulator's outputs, byte for byte, at a given commit and in the working tree (issue 51:
# the simulator drives the router's own core; its decisions must not change).
#
#   bash bench/one_core/identical.sh [BASE] [OUT]
#
# BASE: the commit to compare against (default: the merge base with main); OUT: where both
# sides' outputs go (default: out/one_core). Each configuration runs `cache-router simulate`
# (or, for the last ones, `cache-router capacity`: the capacity at an SLO, bisected over many
# simulations) in a `git worktree` of BASE and in this working tree (PYTHONPATH set to each),
# then every output file (results.json, results.md, the --requests-out JSONL; capacity.json,
# capacity.md) is compared byte for byte after removing the wall-clock fields, and only those:
#   *.json: "wall_seconds" (top level and per policy), "pick_us_p50", "pick_us_p99";
#   *.md:   the "pick p99 µs" column.
# (the requests-out JSONL has no wall-clock field.) Exit status 0 when every file is identical.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
base=${1:-$(git -C "$here" merge-base HEAD main)}
out=$(realpath -m "${2:-$here/out/one_core}")
python=${PYTHON:-python3}
rm -rf "$out"
mkdir -p "$out"
tree="$out/base-tree"
git -C "$here" worktree add --detach "$tree" "$base" >/dev/null 2>&1
trap 'git -C "$here" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT

conv=traces/data/conversation_sample.jsonl
agentic=traces/data/weka_agentic_sample.jsonl
# name | arguments of `simulate` (a trace path is relative to each checkout); a name that
# starts with "capacity-": arguments of `capacity`
configs=(
  "conv-policies|--trace $conv --max-requests 800 --workers 4 --policies ttft,lmetric,load_only,sticky,unified,capped,round_robin,llmd_precise,oracle"
  "agentic-policies|--trace $agentic --workers 4 --pacing session --policies ttft,lmetric,sticky,unified,capped,round_robin,llmd,dynamo"
  "agentic-flow|--trace $agentic --workers 2 --speedup 4 --flow-control --flow-target-ttft-s 1.0 --flow-queue-ttl-s 20 --tenants 4:1 --interactive-share 0.3 --policies ttft,lmetric,round_robin --no-hit-gap"
  "conv-flow-shed|--trace $conv --max-requests 600 --workers 2 --speedup 3 --flow-control --flow-target-ttft-s 0.5 --flow-queue-max 20 --interactive-share 0.5 --policies ttft,sticky --no-hit-gap"
  "conv-disagg|--trace $conv --max-requests 600 --prefill-workers 2 --decode-workers 2 --policies ttft,lmetric,round_robin"
  "agentic-cpu-tier|--trace $agentic --workers 4 --kv-capacity-tokens 131072 --cpu-kv-capacity-tokens 1048576 --policies ttft,lmetric,tiered"
  "agentic-cpu-exact|--trace $agentic --workers 4 --kv-capacity-tokens 131072 --cpu-kv-capacity-tokens 1048576 --router-tiers exact --policies ttft"
  "conv-radix-correct|--trace $conv --max-requests 800 --workers 4 --shadow radix --shadow-capacity-tokens 131072 --policies ttft,lmetric,unified,sglang_cache_aware"
  "agentic-h100|--trace $agentic --workers 4 --gpu-profile h100-llama8b --cost-profile h100-llama8b --policies ttft,llmd_precise,lmetric"
  "conv-kv-events|--trace $conv --max-requests 600 --workers 4 --kv-events --kv-event-loss 0.1 --policies llmd_precise,ttft"
  "capacity-agentic4_15s|--trace $agentic --workers 4 --slo ttft_p90=15 --kv-capacity-tokens 1000000 --jobs 1 --policies ttft,lmetric,unified,sticky,llmd,llmd_precise,dynamo,round_robin"
  "capacity-conv4|--trace $conv --workers 4 --slo ttft_p90=2 --kv-capacity-tokens 1000000 --jobs 1 --no-hit-gap --policies ttft,lmetric,sglang_cache_aware"
)

run_side() {  # side checkout name args...
  local side=$1 checkout=$2 name=$3
  shift 3
  local dir="$out/$side/$name"
  mkdir -p "$dir"
  local command=(simulate "$@" --out "$dir" --no-plots --requests-out "$dir/requests.jsonl")
  [[ $name != capacity-* ]] || command=(capacity "$@" --out "$dir" --no-plots)
  (cd "$checkout" && PYTHONPATH="$checkout" "$python" -c 'import sys; from router.cli import main; sys.exit(main())' \
    "${command[@]}" >"$dir.log" 2>&1) ||
    { echo "FAILED: $side $name (see $dir.log)"; tail -5 "$dir.log"; return 1; }
}

normalize() {  # file -> stdout, wall-clock fields removed
  "$python" - "$1" <<'PY'
import json, re, sys
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
if path.endswith(".json"):
    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items()
                    if k not in ("wall_seconds", "pick_us_p50", "pick_us_p99")}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o
    sys.stdout.write(json.dumps(strip(json.loads(text)), indent=1))
elif path.endswith(".md"):  # drop the "pick p99 µs" column of each table that has one
    col = None
    for line in text.splitlines():
        cells = line.split("|")
        if not line.startswith("|"):
            col = None
        elif col is None and any(c.strip() == "pick p99 µs" for c in cells):
            col = [c.strip() for c in cells].index("pick p99 µs")
        if col is not None and len(cells) > col:
            del cells[col]
        print("|".join(cells))
else:
    sys.stdout.write(text)
PY
}

same=0
differ=0
for entry in "${configs[@]}"; do
  name=${entry%%|*}
  read -r -a args <<<"${entry#*|}"
  run_side base "$tree" "$name" "${args[@]}"
  run_side head "$here" "$name" "${args[@]}"
  for f in "$out/base/$name"/*; do
    g="$out/head/$name/$(basename "$f")"
    if [ -f "$g" ] && cmp -s <(normalize "$f") <(normalize "$g"); then
      same=$((same + 1))
    else
      differ=$((differ + 1))
      echo "DIFFERS: $name/$(basename "$f")"
      diff <(normalize "$f") <(normalize "$g") | head -10 || true
    fi
  done
  extra=$(comm -13 <(ls "$out/base/$name") <(ls "$out/head/$name"))
  [ -z "$extra" ] || { differ=$((differ + 1)); echo "ONLY IN HEAD: $name: $extra"; }
  echo "$name: done"
done
echo "${#configs[@]} configurations, base $(git -C "$here" rev-parse --short "$base"): $same files identical, $differ differ"
[ "$differ" -eq 0 ]
