"""Shadow fidelity in the simulator: trace x workers x rate x mode.

    nice .venv/bin/python bench/fidelity/fidelity.py \
        --out bench/results/fidelity.json > bench/results/fidelity.md
    nice .venv/bin/python bench/fidelity/fidelity.py --pacing session \
        --out bench/results/fidelity-session.json > bench/results/fidelity-session.md

Modes: ``blocks`` / ``radix`` (approximate: the router's own shadows) and ``kv events``
(precise: the worker models' KV events, ``--kv-delay-ms`` late, into the router's KVIndex).
Shadow error = mean |estimate at booking - true cached tokens| / prompt tokens. Pickers: the
default (ttft) and unified; hit rate and TTFT p90 are the worker models' true figures.
``--pacing session``: a session's next turn waits for its previous answer (traces/trace/pacing.py).
``--shadow-capacity-tokens``: the router's shadows believe this KV capacity instead of the
workers' own; ``--correct-shadow`` (auto: on exactly then, as the proxy) runs the proxy's
report-driven capacity correction (router/cache/feedback.py).
"""

from __future__ import annotations

import argparse
import json
import sys

from traces.commands.options import CORRECTIONS, make_sim_picker
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.trace.formats import load_trace
from traces.trace.pacing import PACINGS

MODES = {
    "blocks": {"shadow": "blocks"},
    "radix": {"shadow": "radix"},
    "kv events": {"kv_events": True},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--traces", default="weka=../shared/traces/weka_kv_cache_tester")
    p.add_argument("--workers", default="8,4")
    p.add_argument("--speedups", default="1,4")
    p.add_argument("--policies", default="ttft,unified")
    p.add_argument("--pacing", choices=PACINGS, default="open")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--kv-delay-ms", type=float, default=50.0)
    p.add_argument("--shadow-capacity-tokens", type=int, default=None, help="router's belief")
    p.add_argument("--correct-shadow", choices=CORRECTIONS, default="auto")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    settings = dict(
        correct_shadow=args.correct_shadow, shadow_capacity_tokens=args.shadow_capacity_tokens
    )
    print("| trace | workers | rate | mode | policy | shadow error | hit rate | TTFT p90 s |")
    print("|---|---:|---:|---|---|---:|---:|---:|")
    for spec in args.traces.split(","):
        name, path = spec.split("=", 1)
        trace = load_trace(path)
        for workers in map(int, args.workers.split(",")):
            for speedup in map(float, args.speedups.split(",")):
                for mode in args.modes.split(","):
                    options = MODES[mode]
                    for policy in args.policies.split(","):
                        config = SimConfig(
                            workers=workers,
                            speedup=speedup,
                            pacing=args.pacing,
                            kv_event_delay_s=args.kv_delay_ms / 1000,
                            correct_shadow=CORRECTIONS[args.correct_shadow],
                            shadow_capacity_tokens=args.shadow_capacity_tokens,
                            **options,
                        )
                        s = simulate(trace, make_sim_picker(policy), config).summary()
                        row = dict(trace=name, workers=workers, speedup=speedup, mode=mode,
                                   policy=policy, pacing=args.pacing, **settings, **s)  # fmt: skip
                        rows.append(row)
                        print(
                            f"| {name} | {workers} | {speedup:g}x | {mode} | {policy} | "
                            f"{s['shadow_abs_error']:.2%} | {s['hit_rate']:.1%} | "
                            f"{s['ttft_p90']:.2f} |",
                            flush=True,
                        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
