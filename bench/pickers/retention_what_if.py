"""Cache-only what-if: how much of the workers' LRU loss a router could take back by choosing
what the workers keep, not only where requests go.

    python bench/pickers/retention_what_if.py --trace ../shared/traces/synthetic_trace.jsonl \
        --workers 8 --kv-capacity-tokens 1000000 [--label-after 100 200 300]

A router cannot change a worker's eviction rule, but it can re-touch a prefix (a one-token
request on it moves its blocks to the young end of vLLM's free queue and of SGLang's radix
LRU), so a router that knew which sessions come back could keep those and let the others go.
This bench asks what that is worth before anything is built: per worker, an LRU of
``--kv-capacity-tokens`` (512-token blocks, the shadow's unit), requests in arrival order,
no timing (each request's blocks enter after its hit is counted). Routing, the same for every
row: the worker holding the longest prefix of at least two blocks (a session's home), else
the one with the least prefill so far. Retention, per row:

- ``lru``: none, the workers' own rule;
- ``turn >= 2``: a session's blocks are kept (evicted only after every unkept block) from
  its second turn on, within 80% of each cache;
- ``learned``: kept while the return rate learned online for the request's (turn 1 / 2 /
  3+, log2 prompt tokens) class is at least ``--threshold``; a request is labelled "came
  back" when its session's next turn arrives, "did not" after ``--label-after`` trace
  seconds without one;
- ``foresight``: kept exactly when the session sends another turn (not knowable; the most
  any retention rule can take back).

Beside them, one LRU of the fleet's pooled capacity and Belady's pooled ceiling
(traces/sim/hit_gap.py, traces/sim/bounds.py). Hits are prompt tokens, as ``simulate``'s
hit gap counts them.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from traces.sim.bounds import belady_hits
from traces.sim.hit_gap import pooled_lru_hits
from traces.trace.formats import load_trace
from traces.trace.record import BLOCK_TOKENS, TraceRequest

KEPT_SHARE = 0.8  # at most this share of a cache is kept; the rest stays plain LRU

# decides, as each request is routed, whether its blocks are kept
Retention = Callable[[TraceRequest], bool]


class KeptLRU:
    """One worker's block cache: plain LRU, except that kept blocks go only when no plain one
    is left (or when the kept share passes ``KEPT_SHARE``, oldest kept first)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.plain: OrderedDict[int, None] = OrderedDict()
        self.kept: OrderedDict[int, None] = OrderedDict()

    def prefix(self, blocks: Sequence[int]) -> int:
        n = 0
        for key in blocks:
            if key not in self.plain and key not in self.kept:
                break
            n += 1
        return n

    def insert(self, blocks: Sequence[int], keep: bool) -> None:
        into = self.kept if keep else self.plain
        for key in blocks:
            self.plain.pop(key, None)
            self.kept.pop(key, None)
            into[key] = None
        while len(self.kept) > KEPT_SHARE * self.capacity:
            self.plain[self.kept.popitem(last=False)[0]] = None  # young end of the plain LRU
        while len(self.plain) + len(self.kept) > self.capacity:
            (self.plain if self.plain else self.kept).popitem(last=False)


def route(
    trace: Sequence[TraceRequest], workers: int, capacity_blocks: int, keep: Retention
) -> np.ndarray:
    """Per request, its prefix hit in blocks on the worker it was routed to."""
    caches = [KeptLRU(capacity_blocks) for _ in range(workers)]
    work = [0] * workers
    hits = np.zeros(len(trace), dtype=np.int64)
    for i, req in enumerate(trace):
        prefixes = [c.prefix(req.blocks) for c in caches]
        home = max(range(workers), key=lambda k: (prefixes[k], -work[k]))
        if prefixes[home] < 2:
            home = min(range(workers), key=lambda k: work[k])
        hits[i] = prefixes[home]
        work[home] += len(req.blocks) - prefixes[home]
        caches[home].insert(req.blocks, keep(req))
    return hits


def comes_back(trace: Sequence[TraceRequest]) -> set[int]:
    """``request_id`` s of the requests whose session sends another turn after them."""
    last: dict[str, int] = {}
    back: set[int] = set()
    for req in trace:
        if req.session_id in last:
            back.add(last[req.session_id])
        last[req.session_id] = req.request_id
    return back


def learned(label_after: float, threshold: float) -> Retention:
    """The ``learned`` rule: return rates per class from labels the router could see."""
    rates: dict[tuple[int, int], list[int]] = defaultdict(lambda: [1, 5])  # a 20% prior
    open_: dict[str, tuple[float, tuple[int, int]]] = {}  # session -> (arrival, class)

    def keep(req: TraceRequest) -> bool:
        for session, (arrival, cls) in list(open_.items()):
            if req.arrival - arrival > label_after:
                rates[cls][1] += 1
                del open_[session]
        if req.session_id in open_:
            cls = open_.pop(req.session_id)[1]
            rates[cls][0] += 1
            rates[cls][1] += 1
        cls = (min(req.turn, 3), int(math.log2(max(req.input_length, 1))))
        open_[req.session_id] = (req.arrival, cls)
        back, seen = rates[cls]
        return back / seen >= threshold

    return keep


def hit_rate(trace: Sequence[TraceRequest], blocks: np.ndarray) -> float:
    """Prompt tokens hit, in percent of all prompt tokens."""
    inputs = np.fromiter((r.input_length for r in trace), dtype=np.int64, count=len(trace))
    return 100.0 * float(np.minimum(blocks * BLOCK_TOKENS, inputs).sum() / inputs.sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--kv-capacity-tokens", type=int, default=1_000_000)
    parser.add_argument("--label-after", type=float, nargs="+", default=[100.0, 200.0, 300.0])
    parser.add_argument("--threshold", type=float, default=0.2)
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    blocks = args.kv_capacity_tokens // BLOCK_TOKENS
    back = comes_back(trace)

    def run(keep: Retention) -> np.ndarray:
        return route(trace, args.workers, blocks, keep)

    rows = [("lru (the workers' own rule)", run(lambda r: False))]
    rows.append(("turn >= 2", run(lambda r: r.turn >= 2)))
    for after in args.label_after:
        rows.append((f"learned, labels after {after:g} s", run(learned(after, args.threshold))))
    rows += [
        ("foresight", run(lambda r: r.request_id in back)),
        (f"one pooled LRU of {args.workers} x", pooled_lru_hits(trace, args.workers * blocks)),
        ("Belady's pooled ceiling", belady_hits(trace, args.workers * blocks)),
    ]
    sessions = len({r.session_id for r in trace})
    print(
        f"{args.trace}: {len(trace)} requests, {sessions} sessions, {len(back)} followed by "
        f"another turn; {args.workers} workers x {args.kv_capacity_tokens:,} tokens"
    )
    print("| retention | hit (% of prompt tokens) |\n|---|---:|")
    for name, hits in rows:
        print(f"| {name} | {hit_rate(trace, hits):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
