"""Flow control's prediction against the workers' TTFT after dispatch, offline (issue 52).

    python bench/flow/dispatch_error.py [simulate's arguments, --flow-control among them]

Runs ``cache-router simulate`` with the given arguments in this process, recording for
every dispatched request the prediction flow control admitted it on (the best worker's
:func:`router.core.flow_queue.predicted_ttft` at its dispatch) and the TTFT it then had from
its dispatch (not from its send: the queue's own wait is exact in both). Prints, per policy,
the ratio observed / predicted (median, p90), the median absolute error as a fraction of the
observed TTFT, and the TTFT p90 after dispatch; then per priority (and the light tenant,
``tenant-1``) the served requests' TTFT p90 split into the wait in the router's queue and the
TTFT after dispatch (each one's own p90). Wraps the simulator's calls; changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

import router.core.flow as flow
import traces.sim.simulator as sim
from router.cli import main as cli_main
from router.fleet.placement import Placement


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    predicted: dict[int, tuple[float, float]] = {}  # id(features) -> (now, prediction)
    dispatched: list[tuple[object, float, float]] = []  # (booking, now, prediction)
    predict, book = flow.predicted_ttft, Placement.book

    def recording_predict(features, views, default_rate, now=None, *args, **kwargs):
        prediction = predict(features, views, default_rate, now, *args, **kwargs)
        predicted[id(features)] = (now, prediction.ttft_s)
        return prediction

    def recording_book(state, request, *args, now=None, **kwargs):
        booking = book(state, request, *args, now=now, **kwargs)
        seen = predicted.pop(id(request), None)
        if seen is not None and seen[0] == now:
            dispatched.append((booking, now, seen[1]))
        return booking

    runs: list[tuple[object, dict[int, float]]] = []  # (simulation, index -> dispatch time)
    place, run = sim.Simulation._place, sim.Simulation.run

    def recording_place(self, i, features, adapter, now):
        runs[-1][1][i] = now
        return place(self, i, features, adapter, now)

    def recording_run(self):
        runs.append((self, {}))
        return run(self)

    flow.predicted_ttft = recording_predict
    Placement.book = staticmethod(recording_book)
    sim.Simulation._place, sim.Simulation.run = recording_place, recording_run
    try:
        code = cli_main(["simulate", *argv])
    finally:
        flow.predicted_ttft, Placement.book = predict, staticmethod(book)
        sim.Simulation._place, sim.Simulation.run = place, run
    pairs = [
        (b.first_token_at - now, p)
        for b, now, p in dispatched
        if b.first_token_at is not None and p > 0
    ]
    if not pairs:
        print("no dispatch with a prediction (is --flow-control on?)")
        return code
    observed = np.array([o for o, _ in pairs])
    prediction = np.array([p for _, p in pairs])
    ratio = observed / prediction
    error = np.abs(prediction - observed) / observed
    print(
        f"after dispatch ({len(pairs)} requests): observed / predicted median "
        f"{np.median(ratio):.2f}x p90 {np.percentile(ratio, 90):.2f}x; median |error| "
        f"{np.median(error):.1%} of the observed; TTFT p90 {np.percentile(observed, 90):.2f} s"
    )
    for simulation, dispatched_at in runs:
        print_split(simulation, dispatched_at)
    return code


def print_split(simulation: sim.Simulation, dispatched_at: dict[int, float]) -> None:
    """Per priority and for ``tenant-1``: served TTFT p90, the router's wait, after dispatch."""
    trace = simulation.trace
    first, sent = simulation.out["first_token"], simulation.sent_at
    groups = [(f"priority {p}", [r.priority == p for r in trace]) for p in
              sorted({r.priority for r in trace})]  # fmt: skip
    groups.append(("tenant-1", [r.tenant == "tenant-1" for r in trace]))
    for name, mask in groups:
        served = [i for i, m in enumerate(mask) if m and i in dispatched_at]
        served = np.array([i for i in served if not np.isnan(first[i])], dtype=int)
        if not len(served):
            continue
        at = np.array([dispatched_at[i] for i in served])
        total, wait, after = first[served] - sent[served], at - sent[served], first[served] - at
        print(
            f"{simulation.name} {name}: {len(served)} of {sum(mask)} served, TTFT p90 "
            f"{np.percentile(total, 90):.2f} s; router wait p90 {np.percentile(wait, 90):.2f} s "
            f"({np.mean(wait > 0):.0%} waited), after dispatch p90 "
            f"{np.percentile(after, 90):.2f} s"
        )


if __name__ == "__main__":
    raise SystemExit(main())
