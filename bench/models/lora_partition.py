"""What partitioning LoRA adapters over workers buys (swaps) and costs (TTFT), offline.

    python bench/models/lora_partition.py [--traces ...] [--adapters 8 16] [--lora-load-ms 50 500] \
        [--gpu-profile h100-llama8b|flat|FILE]

Issue 28's LoRA bar asks the default picker for at most half of round-robin's adapter
swaps. Swaps fall only where each worker keeps to a few adapters, so this bench measures
the placements that do that: ``partition`` gives adapter ``lora-k`` the home worker ``k mod
W`` (a partition perfect by adapter count; with 8 adapters on 4 workers of 2 slots every
worker's adapters fit its slots) and sends each new session there; ``partition<=M`` does so
while the home's predicted cost is within ``M`` (relative) of the best worker's, else leaves
the session to ttft. Either way a session's later turns are ttft's (its affinity margin:
they leave a worker whose cost is beyond it). Same simulator, traces and loads as
bench/models/lora_affinity.py, and each at two adapter load costs: the sim worker's 50 ms (host
memory to a GPU slot) and 500 ms (a load from disk, vLLM's case when adapters outnumber
``--max-cpu-loras``), the picker told the same cost. Workers and the router's cost model are
priced with ``--gpu-profile`` (the worker model's default; ``flat``: the flat model). Writes
bench/results/lora_partition.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from lora_affinity import TRACES, with_adapters  # noqa: E402

from policies.base import Pick, Picker, RequestFeatures, WorkerView  # noqa: E402
from policies.hits import UNHEALTHY, estimate_hits  # noqa: E402
from policies.registry import make_picker  # noqa: E402
from policies.ttft import TTFTPicker  # noqa: E402
from traces.sim.simulator import SimConfig, simulate  # noqa: E402
from traces.sim.worker_model import (  # noqa: E402
    WorkerModelConfig,
    add_profile_option,
    profile_arg,
)
from traces.trace.formats import load_trace  # noqa: E402


class PartitionPicker(TTFTPicker):
    """ttft, but a new session of adapter ``lora-k`` goes to worker ``k mod W`` (within
    ``margin`` of the best cost; ``None``: always)."""

    name = "partition"

    def __init__(self, margin: float | None = None, **params: float) -> None:
        super().__init__(**params)
        self.margin = margin

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        adapter, session = request.adapter, request.session_id
        if adapter is None or session is None or self.sessions.get(session) is not None:
            return super().pick(request, workers)
        hits, best_hit = estimate_hits(request, workers)
        home = int(adapter.rsplit("-", 1)[1]) % len(workers)
        if hits[home] != UNHEALTHY:
            costs = self.costs(request, workers, hits)
            limit = min(costs) * (1.0 + self.margin) if self.margin is not None else None
            if limit is None or costs[home] <= limit + self.params.affinity_slack_s:
                self.sessions.bind(session, home)
                return Pick(home, "partition", hits[home], best_hit)
        return super().pick(request, workers)


def pickers(margins: Sequence[float], load_s: float) -> dict[str, Callable[[], Picker]]:
    """Fresh-picker factories by name, every ttft told that an adapter load takes
    ``load_s``."""
    out = {
        "round_robin": lambda: make_picker("round_robin"),
        "ttft": lambda: TTFTPicker(lora_load_s=load_s),
        "partition": lambda: PartitionPicker(lora_load_s=load_s),
    }
    for m in margins:
        out[f"partition<={m:g}"] = lambda m=m: PartitionPicker(m, lora_load_s=load_s)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", nargs="+", default=list(TRACES), choices=TRACES)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--max-loras", type=int, default=2)
    p.add_argument("--adapters", type=int, nargs="+", default=[8, 16])
    p.add_argument("--speedups", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    p.add_argument("--margins", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--lora-load-ms", type=float, nargs="+", default=[50.0, 500.0])
    p.add_argument("--requests", type=int, default=None, help="first N requests of each trace")
    add_profile_option(p)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lora_partition.json")
    args = p.parse_args(argv)
    profile = args.gpu_profile
    rows = []
    for name in args.traces:
        path = TRACES[name]
        if not path.exists():
            print(f"skipping {name}: {path} not found", file=sys.stderr)
            continue
        base = load_trace(str(path))[: args.requests]
        for load_ms in args.lora_load_ms:
            load_s = load_ms / 1000
            worker = WorkerModelConfig(
                max_loras=args.max_loras, lora_load_s=load_s, profile=profile
            )
            for adapters in args.adapters:
                trace = with_adapters(base, adapters)
                for speedup in args.speedups:
                    config = SimConfig(
                        workers=args.workers, worker=worker, speedup=speedup, cost_profile=profile
                    )
                    cell = {
                        policy: simulate(trace, make(), config, policy).summary()
                        for policy, make in pickers(args.margins, load_s).items()
                    }
                    rr, tt = cell["round_robin"], cell["ttft"]
                    for policy, s in cell.items():
                        rows.append(
                            {
                                "trace": name,
                                "lora_load_ms": load_ms,
                                "adapters": adapters,
                                "speedup": speedup,
                                "policy": policy,
                                "lora_swaps": s["lora_swaps"],
                                "swaps_over_rr": round(s["lora_swaps"] / rr["lora_swaps"], 3),
                                "hit_rate": round(s["hit_rate"], 4),
                                "hit_over_rr": s["hit_rate"] >= rr["hit_rate"],
                                "ttft_p50": round(s["ttft_p50"], 3),
                                "ttft_p90": round(s["ttft_p90"], 3),
                                "p90_over_ttft": round(s["ttft_p90"] / tt["ttft_p90"], 3),
                            }
                        )
                        r = rows[-1]
                        print(
                            f"{name} {load_ms:g}ms {adapters} {speedup:g} {policy}: swaps "
                            f"{r['swaps_over_rr']:.2f}x rr, hit {r['hit_rate']:.3f}, p90 "
                            f"{r['ttft_p90']:.1f} s ({r['p90_over_ttft']:.2f}x ttft)",
                            flush=True,
                        )
    config = {k: v for k, v in vars(args).items() if k not in ("out", "gpu_profile_named")}
    config["gpu_profile"] = profile_arg(profile)
    args.out.write_text(json.dumps({"config": config, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
