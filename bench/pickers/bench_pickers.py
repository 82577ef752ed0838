"""One pick over 16 workers for a 32k-token prompt: p50 / p99 latency per picker.

    .venv/bin/python bench/pickers/bench_pickers.py [--workers 16] [--blocks 64] [--rounds 5]

The prompt's 64 block keys are precomputed (as the proxy computes them once per request);
each worker view is backed by the real shadow, :class:`router.cache.block_lru.BlockLRU`, filled
to a realistic state: one worker holds the whole prompt, three hold its first half (a
shared system prompt and early turns), the rest hold unrelated blocks. Loads are mixed.
Goal: p99 <= 50 us for ttft, lmetric and unified. Workers carry what the ttft picker
reads from the worker state: a learned rate, a session footprint whose warm sessions
overfill the KV cache (so its eviction charge is computed too) and the shadow's pinned
blocks with booked output (its memory check). The timer wraps
``picker.pick`` only; GC stays on, as it is in the proxy.

The machine is shared (2 cores, other jobs come and go), so every scenario runs in several
interleaved rounds; the table shows p50/p99 of the quietest round (lowest p99) and the
median round's p99, so a noisy neighbour is visible rather than hidden.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Sequence

from policies.base import Picker, RequestFeatures
from policies.registry import PICKER_NAMES, make_picker
from router.cache.block_hash import BLOCK_SIZE, chain_ids
from router.cache.block_lru import BlockLRU
from router.cache.workload import PrefillRate, SessionFootprint

GOAL_US = 50.0
GOAL_PICKERS = ("ttft", "lmetric", "unified")


class BenchWorker:
    """A WorkerView over a real BlockLRU, shaped like the router's per-worker state."""

    __slots__ = (
        "blocks",
        "cost",
        "footprint",
        "healthy",
        "held_tokens",
        "kv_capacity_tokens",
        "lru",
        "num_requests",
        "ongoing_decode_tokens",
        "pending_prefill_tokens",
        "rate",
    )

    # the capabilities it does not track (policies.base), at their neutral values
    prefill_queue = adapters = num_requests_waiting = kv_usage_fraction = worker_block_size = None
    tiered = False
    kv_load_s_per_token = 0.0

    def __init__(self, lru: BlockLRU, num_requests: int, pending: int) -> None:
        self.lru = self.blocks = lru  # ttft reads the shadow's pinned blocks (its memory check)
        self.healthy = True
        self.num_requests = num_requests
        self.pending_prefill_tokens = pending
        self.ongoing_decode_tokens = 256 * num_requests
        self.held_tokens = pending + self.ongoing_decode_tokens  # decode_load reads it
        self.kv_capacity_tokens = lru.capacity_blocks * lru.block_size
        self.rate = PrefillRate()
        self.cost = None  # no cost model: ttft prices flat
        self.footprint = SessionFootprint()
        for k in range(64):  # 64 warm sessions of 128k tokens: twice the KV capacity
            self.footprint.touch(f"other-{k}", 131_072, now=float(k))

    def estimate_cache_hit(self, blocks: Sequence[int], tokens: bytes | None = None) -> int:
        return self.lru.estimate_cache_hit(blocks)


def build_fleet(num_workers: int, prompt: list[int], rng: random.Random) -> list[BenchWorker]:
    capacity = 8192  # blocks: 4M tokens of KV cache per worker
    workers = []
    for i in range(num_workers):
        lru = BlockLRU(capacity, BLOCK_SIZE)
        other = chain_ids([rng.getrandbits(63) for _ in range(capacity // 2)], root=i + 1)
        lru.insert(other)
        if i == 0:
            lru.insert(prompt)
        elif i <= 3:
            lru.insert(prompt[: len(prompt) // 2])
        workers.append(BenchWorker(lru, rng.randrange(1, 9), rng.randrange(0, 65536)))
    return workers


def measure(
    picker: Picker, request: RequestFeatures, workers: list[BenchWorker], iterations: int
) -> tuple[float, float]:
    """p50 and p99 of one pick, in microseconds."""
    clock = time.perf_counter_ns
    pick = picker.pick
    for _ in range(min(2000, iterations)):
        pick(request, workers)
    samples = []
    append = samples.append
    gc.collect()
    for _ in range(iterations):
        start = clock()
        pick(request, workers)
        append(clock() - start)
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[len(samples) * 99 // 100] / 1000


class _NoBindings:
    """A session table that never keeps a binding: every pick is a new session's."""

    def get(self, session_id: str) -> None:
        return None

    def peek(self, session_id: str) -> None:
        return None

    def bind(self, session_id: str, worker: int) -> None:
        return None


def scenarios(prompt: list[int]):
    """(label, picker, request): every registered picker, plus unified's fallback path and
    ttft's two costlier paths (outside the goal): a new session (its balance check) and a
    131k-token prompt cold everywhere (its block charge over every worker's live sessions)."""
    request = RequestFeatures(prompt, len(prompt) * BLOCK_SIZE, "bench-session")
    for name in PICKER_NAMES:
        picker = make_picker(name)
        sessions = getattr(picker, "sessions", None)
        if sessions is not None:
            sessions.bind("bench-session", 0)  # bound to the warm worker: the stick path
        yield name, picker, request
    unified = make_picker("unified", overload_factor=0.1)  # the warm worker counts as overloaded
    unified.sessions.bind("bench-session", 0)
    yield "unified (fallback)", unified, request
    yield (
        "lmetric (no session)",
        make_picker("lmetric"),
        RequestFeatures(prompt, len(prompt) * BLOCK_SIZE),
    )
    fresh = make_picker("ttft")
    fresh.sessions = _NoBindings()
    yield "new session: ttft", fresh, request
    cold = chain_ids([random.Random(1).getrandbits(63) for _ in range(256)], root=1 << 20)
    long_cold = make_picker("ttft")
    long_cold.sessions.bind("bench-session", 0)
    yield (
        "long cold: ttft",
        long_cold,
        RequestFeatures(cold, len(cold) * BLOCK_SIZE, "bench-session"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=64, help="prompt blocks of 512 tokens")
    parser.add_argument("--iterations", type=int, default=10000, help="picks per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    prompt = chain_ids([rng.getrandbits(63) for _ in range(args.blocks)])
    workers = build_fleet(args.workers, prompt, rng)
    print(
        f"one pick, {args.workers} workers, {args.blocks * BLOCK_SIZE}-token prompt "
        f"({args.blocks} precomputed blocks), {args.rounds} rounds x {args.iterations} picks, "
        f"Python {sys.version.split()[0]}"
    )
    runs = list(scenarios(prompt))
    rounds: list[list[tuple[float, float]]] = [[] for _ in runs]
    for _ in range(args.rounds):
        for i, (_, picker, request) in enumerate(runs):
            rounds[i].append(measure(picker, request, workers, args.iterations))
    print(f"{'picker':<22} {'branch':<20} {'p50 us':>7} {'p99 us':>7} {'p99 med':>8}")
    failed = []
    for (label, picker, request), results in zip(runs, rounds, strict=True):
        branch = picker.pick(request, workers).branch  # steady state, after the rounds
        p50, p99 = min(results, key=lambda r: r[1])
        median_p99 = sorted(r[1] for r in results)[len(results) // 2]
        goal = label.split()[0] in GOAL_PICKERS
        mark = ("  ok" if p99 <= GOAL_US else "  OVER GOAL") if goal else ""
        if goal and p99 > GOAL_US:
            failed.append(label)
        print(f"{label:<22} {branch:<20} {p50:7.1f} {p99:7.1f} {median_p99:8.1f}{mark}")
    print(f"goal: p99 <= {GOAL_US:.0f} us for {', '.join(GOAL_PICKERS)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
