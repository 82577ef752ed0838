"""Flow control's prediction against the workers' TTFT after dispatch, offline (issue 52).

    python bench/flow/dispatch_error.py [simulate's arguments, --flow-control among them]

Runs ``cache-router simulate`` with the given arguments in this process, recording for
every dispatched request the prediction flow control admitted it on (the best worker's
:func:`router.core.flow_queue.predicted_ttft` at its dispatch) and the TTFT it then had from
its dispatch (not from its send: the queue's own wait is exact in both). Prints, per policy,
the ratio observed / predicted (median, p90), the median absolute error as a fraction of the
observed TTFT, and the TTFT p90 after dispatch. Wraps the simulator's calls; changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

import router.core.flow as simulator
from router.cache.worker_state import WorkerState
from router.cli import main as cli_main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    predicted: dict[int, tuple[float, float]] = {}  # id(features) -> (now, prediction)
    dispatched: list[tuple[object, float, float]] = []  # (booking, now, prediction)
    predict, book = simulator.predicted_ttft, WorkerState.book

    def recording_predict(features, views, default_rate, now=None, *args, **kwargs):
        prediction = predict(features, views, default_rate, now, *args, **kwargs)
        predicted[id(features)] = (now, prediction.ttft_s)
        return prediction

    def recording_book(self, request, *args, now=None, **kwargs):
        booking = book(self, request, *args, now=now, **kwargs)
        seen = predicted.pop(id(request), None)
        if seen is not None and seen[0] == now:
            dispatched.append((booking, now, seen[1]))
        return booking

    simulator.predicted_ttft = recording_predict
    WorkerState.book = recording_book
    try:
        code = cli_main(["simulate", *argv])
    finally:
        simulator.predicted_ttft, WorkerState.book = predict, book
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
    return code


if __name__ == "__main__":
    raise SystemExit(main())
