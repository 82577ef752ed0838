#!/bin/bash
# Capacity at a latency SLO, offline, per policy, on the issue's cells and on cells no policy
# was tuned on (issue 41). Each cell is one `cache-router capacity` run into out/capacity/CELL;
# the per-policy capacities of every cell are gathered into bench/results/capacity_cells.json.
#
#   bash bench/pickers/capacity_cells.sh [CELL ...]     # default: every cell (~25 min, 1 core)
#   POLICIES=ttft bash bench/pickers/capacity_cells.sh CELL   # rerun some policies of a cell:
#     their entries replace the same policies' in out/capacity/CELL, the others stay
#   OUT=FILE, EXTRA="--gpu-profile flat": the summary's path, more flags for every run
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SHARED=${SHARED:-../shared/traces}
OUT=${OUT:-bench/results/capacity_cells.json}
EXTRA=${EXTRA:-}
POLICIES=${POLICIES:-ttft,lmetric,unified,sticky,llmd,llmd_precise,dynamo,smg,aibrix,sglang_cache_aware,round_robin}
declare -A CELLS=(
  # the issue's cells
  [conversation8]="--trace $SHARED/conversation_trace.jsonl --workers 8 --slo ttft_p90=2"
  [synthetic8]="--trace $SHARED/synthetic_trace.jsonl --workers 8 --slo ttft_p90=2"
  [agentic4]="--trace traces/data/weka_agentic_sample.jsonl --workers 4 --slo ttft_p90=5"
  [agentic4_15s]="--trace traces/data/weka_agentic_sample.jsonl --workers 4 --slo ttft_p90=15"
  # not tuned on: other fleet sizes, another percentile, the whole Weka set
  [conversation4]="--trace $SHARED/conversation_trace.jsonl --workers 4 --slo ttft_p90=2"
  [conversation16]="--trace $SHARED/conversation_trace.jsonl --workers 16 --slo ttft_p90=2"
  [conversation8_p99]="--trace $SHARED/conversation_trace.jsonl --workers 8 --slo ttft_p99=10"
  [synthetic4]="--trace $SHARED/synthetic_trace.jsonl --workers 4 --slo ttft_p90=2"
  [weka8]="--trace $SHARED/weka_kv_cache_tester --workers 8 --slo ttft_p90=15"
  # held out too (first run 2026-11-27, after the picker was chosen): other sizes, another percentile
  [conversation12]="--trace $SHARED/conversation_trace.jsonl --workers 12 --slo ttft_p90=2"
  [synthetic16]="--trace $SHARED/synthetic_trace.jsonl --workers 16 --slo ttft_p90=2"
  [synthetic8_p99]="--trace $SHARED/synthetic_trace.jsonl --workers 8 --slo ttft_p99=10"
)
ORDER=(conversation8 synthetic8 agentic4 agentic4_15s conversation4 conversation16 conversation8_p99 synthetic4 weka8
  conversation12 synthetic16 synthetic8_p99)
[ $# -gt 0 ] && ORDER=("$@")
for cell in "${ORDER[@]}"; do
  echo "== $cell $(date +%T)"
  # shellcheck disable=SC2086
  $PY -m router.cli capacity --policies "$POLICIES" --kv-capacity-tokens 1000000 --jobs 1 \
    --no-plots --out "out/capacity/$cell.part" ${CELLS[$cell]} $EXTRA 2>/dev/null | grep -v '^\s*\['
  $PY - "out/capacity/$cell" <<'PYEOF'
import json, shutil, sys
from pathlib import Path
cell = Path(sys.argv[1])
part, full = cell.with_name(cell.name + ".part"), cell / "capacity.json"
new = json.loads((part / "capacity.json").read_text())
if full.exists():  # keep the policies not rerun (same trace, fleet and SLOs)
    old = json.loads(full.read_text())
    same = all(old[k] == new[k] for k in ("slos", "fleet"))
    if same:
        new["policies"] = {**old["policies"], **new["policies"]}
shutil.rmtree(cell, ignore_errors=True)
part.rename(cell)
(cell / "capacity.json").write_text(json.dumps(new, indent=1) + "\n")
PYEOF
done
# every cell run so far (this time or before) into one summary
$PY - "$OUT" "${!CELLS[@]}" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
doc = {}
for cell in sys.argv[2:]:
    path = Path(f"out/capacity/{cell}/capacity.json")
    if not path.exists():
        continue
    d = json.loads(path.read_text())
    doc[cell] = {
        "trace": d["trace"]["name"], "workers": d["fleet"]["workers"], "slos": d["slos"],
        "gpu_profile": d["fleet"].get("gpu_profile", "flat"),
        "cost_profile": d["fleet"].get("cost_profile", "flat"),
        "slos_below_bound": d.get("slos_below_bound", []),
        "bounds": {k: v for k, v in d["bounds"].items() if k.startswith(("ttft", "hit", "load"))},
        "capacity": {n: e["capacity"] for n, e in d["policies"].items()},
        "first_fail": {n: e["first_fail"] for n, e in d["policies"].items()},
        "hit_rate_at_capacity": {n: e["hit_rate_at_capacity"] for n, e in d["policies"].items()},
    }
out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
print(f"wrote {out}")
PYEOF
