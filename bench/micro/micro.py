"""Micro-benchmarks of the hot-path data structures.

    python bench/micro/micro.py            # print the table
    python bench/micro/micro.py --record   # also append it to docs/bench-history.md, dated

Each figure is the median (and p99) of many timed calls with time.perf_counter_ns, so one
noisy neighbour moment does not decide it. Goals come from the foundation issue.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from router.cache.block_hash import hash_blocks, token_bytes
from router.cache.block_lru import BlockLRU
from router.cache.cost_model import CostTerms, WorkerCost
from router.cache.cost_profile import resolve
from router.cache.radix_tree import RadixTree
from traces.trace.formats import load_trace

CONVERSATION = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / "conversation_trace.jsonl"
)

PROMPT_TOKENS = 32_768
RNG = np.random.default_rng(0)


def timed(fn: Callable[[], object], runs: int, setup: Callable[[], object] | None = None):
    """Median and p99 of ``runs`` calls in microseconds; ``setup`` runs untimed before each."""
    samples = []
    for _ in range(runs):
        if setup is not None:
            setup()
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def random_tokens(n: int) -> np.ndarray:
    return RNG.integers(0, 150_000, n, dtype=np.uint32)


def row(name: str, fn, runs: int, goal: float | None = None, setup=None) -> tuple:
    return (name, *timed(fn, runs, setup), goal)


def bench_hashing(rows: list) -> None:
    arr = random_tokens(PROMPT_TOKENS)
    buf = arr.tobytes()
    as_list = arr.tolist()
    rows.append(row("hash 32k-token prompt (uint32 buffer)", lambda: hash_blocks(buf), 2000, 20))
    rows.append(row("hash 32k-token prompt (numpy array)", lambda: hash_blocks(arr), 2000))
    rows.append(row("hash 32k-token prompt (list of int)", lambda: hash_blocks(as_list), 300))
    rows.append(row("pack list of 32k ints -> bytes", lambda: token_bytes(as_list), 300))


def bench_estimate(rows: list) -> None:
    prompt = hash_blocks(random_tokens(PROMPT_TOKENS))  # 64 blocks
    workers = []
    for w in range(16):
        lru = BlockLRU(capacity_blocks=100_000)
        lru.insert(RNG.integers(0, 2**63, 50_000).tolist())  # unrelated cached blocks
        lru.insert(prompt[: len(prompt) * w // 15])  # worker w holds w/15 of the prompt
        workers.append(lru)

    def all_workers() -> None:
        for lru in workers:
            lru.estimate_cache_hit(prompt)

    rows.append(row("estimate_cache_hit, 16 workers, 64 blocks", all_workers, 5000, 50))


def build_tree(total_tokens: int, prompt_tokens: int = 16_384) -> tuple[RadixTree, list[bytes]]:
    """A tree of ``total_tokens`` from prompts that share a 2k-token system prefix."""
    tree = RadixTree()
    system = random_tokens(2048)
    prompts = []
    while tree.total_tokens < total_tokens:
        p = np.concatenate([system, random_tokens(prompt_tokens - 2048)]).tobytes()
        tree.insert(p)
        prompts.append(p)
    return tree, prompts


def bench_radix(rows: list) -> None:
    tree, prompts = build_tree(1_000_000)
    # a 32k-token request: a cached 16k prompt (system prefix + history) + 16k new tokens
    requests = [prompts[i % len(prompts)] + random_tokens(16_384).tobytes() for i in range(400)]
    it = iter(requests)
    fixed = requests[0]
    rows.append(
        row("radix prefix_length 32k vs 1M tree", lambda: tree.prefix_length(fixed), 2000, 200)
    )
    rows.append(
        row("radix match_prefix 32k vs 1M tree", lambda: tree.match_prefix(fixed), 2000, 200)
    )
    rows.append(
        row("radix insert 32k (16k new) into 1M tree", lambda: tree.insert(next(it)), 400, 200)
    )

    state: dict[str, RadixTree] = {}

    def big_nodes() -> None:  # ~250 leaves of 4k tokens under a shared prefix
        state["t"] = build_tree(1_000_000, prompt_tokens=4096)[0]

    def small_nodes() -> None:  # 100k leaves of 10 tokens
        t = RadixTree()
        for _ in range(100_000):
            t.insert(random_tokens(10).tobytes())
        state["t"] = t

    evict = lambda: state["t"].evict(100_000)  # noqa: E731
    rows.append(row("radix evict 100k of 1M tokens (4k-token nodes)", evict, 20, setup=big_nodes))
    rows.append(row("radix evict 100k of 1M tokens (10-token nodes)", evict, 5, setup=small_nodes))


def bench_trace_load(rows: list) -> None:
    """The Mooncake conversation trace (12,031 requests) parsed and checked: once a timed
    unit test (< 1 s), which failed on a loaded host rather than on slow code."""
    if CONVERSATION.exists():
        rows.append(
            row("load the Mooncake conversation trace", lambda: load_trace(CONVERSATION), 5, 1e6)
        )


def bench_engine_order(rows: list) -> None:
    """Booking on a worker with a queue of ``depth`` 8k-token prefills: first come first
    served (the default) against the engine-order shadow's prediction (``--engine-priority``),
    for a request that goes last in the order (the most steps to run through)."""
    terms = CostTerms.of_profile(resolve("h100-llama8b"))
    for depth in (16, 128, 512):
        cost = WorkerCost(terms)
        for _ in range(depth):
            entry = cost.book(8192, 16_384, 24_576, 256, now=0.0)
            cost.order(entry, int(RNG.integers(0, 10**6)), 16_384, now=0.0)
        booked: list = []

        def fcfs(cost=cost, booked=booked) -> None:
            booked.append(cost.book(8192, 16_384, 24_576, 256, now=0.0))

        def ordered(cost=cost, booked=booked) -> None:
            entry = cost.book(8192, 16_384, 24_576, 256, now=0.0)
            cost.order(entry, 10**6, 16_384, now=0.0)
            booked.append(entry)

        def release(cost=cost, booked=booked) -> None:
            while booked:
                cost.finish(booked.pop())

        rows.append(row(f"book, {depth} prefills queued", fcfs, 2000, setup=release))
        rows.append(row(f"book + engine order, last of {depth}", ordered, 300, setup=release))


def table(rows: list) -> str:
    lines = [
        "| benchmark | median µs | p99 µs | goal µs | met |",
        "|---|---:|---:|---:|---|",
    ]
    for name, med, p99, goal in rows:
        met = "" if goal is None else ("yes" if med <= goal else f"no ({med / goal:.1f}x)")
        goal_s = "" if goal is None else f"{goal}"
        lines.append(f"| {name} | {med:,.1f} | {p99:,.1f} | {goal_s} | {met} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="append to docs/bench-history.md")
    args = parser.parse_args()
    rows: list = []
    bench_hashing(rows)
    bench_estimate(rows)
    bench_radix(rows)
    bench_trace_load(rows)
    bench_engine_order(rows)
    out = table(rows)
    print(out)
    if args.record:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        path = Path(__file__).resolve().parents[2] / "docs" / "bench-history.md"
        with path.open("a") as f:
            f.write(f"\n## micro.py, {stamp}\n\n{machine()}\n\n{out}\n")


if __name__ == "__main__":
    main()
