"""Worker truth: what each worker says about itself on its Prometheus ``/metrics``.

The router's shadows are estimates; the workers count the real thing. The scraper
(:mod:`router.fleet.worker_metrics`) reads each worker's ``/metrics`` and keeps, per worker, a
:class:`WorkerTruth`:

- ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``: prompt tokens looked
  up in the prefix cache and found there (vLLM counts whole blocks), so ``hits / queries`` is
  the worker's own hit rate;
- ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``: its real queue;
- ``vllm:kv_cache_usage_perc``: fraction of KV blocks in use (0..1);
- ``vllm:cache_config_info{block_size, num_gpu_blocks}``: its KV capacity, ``block_size *
  num_gpu_blocks`` tokens.

Values are summed over label sets (several engines behind one server), except the usage,
which is averaged. Only the lines of these families are parsed (vLLM's page is mostly
histograms), with ``prometheus_client``'s parser. The simulated worker exports the same names,
so the whole path is tested without vLLM; tests/integration runs it against real vLLM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

QUERIES = "vllm:prefix_cache_queries"
HITS = "vllm:prefix_cache_hits"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
FAMILIES = (QUERIES, HITS, RUNNING, WAITING, USAGE, CACHE_CONFIG)
_PREFIXES = tuple(name + suffix for name in FAMILIES for suffix in ("{", " ", "_total"))


@dataclass
class WorkerReading:
    """One parse of a worker's ``/metrics`` page (None: the worker did not export it)."""

    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None

    @property
    def capacity_tokens(self) -> int | None:
        """KV capacity in tokens, when the worker told both its block size and block count."""
        if self.block_size and self.num_gpu_blocks:
            return self.block_size * self.num_gpu_blocks
        return None


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        value = int(labels.get(name, ""))
    except ValueError:
        return None  # "None" before the engine has sized its cache
    return value if value > 0 else None


def parse_worker_metrics(text: str) -> WorkerReading:
    """The vLLM figures of a Prometheus text page (other lines are skipped unparsed)."""
    kept = [line for line in text.splitlines() if line.startswith(_PREFIXES)]
    sums: dict[str, float] = {}
    usage: list[float] = []
    reading = WorkerReading()
    for family in text_string_to_metric_families("\n".join(kept) + "\n"):
        for sample in family.samples:
            name = sample.name
            if name.endswith(("_created", "_total_created")):
                continue
            if name.endswith("_total"):
                name = name[: -len("_total")]
            if name == USAGE:
                usage.append(sample.value)
            elif name == CACHE_CONFIG:
                reading.block_size = _int_label(sample.labels, "block_size")
                blocks = _int_label(sample.labels, "num_gpu_blocks")
                if blocks is not None:
                    reading.num_gpu_blocks = (reading.num_gpu_blocks or 0) + blocks
            elif name in FAMILIES:
                sums[name] = sums.get(name, 0.0) + sample.value
    reading.prefix_cache_queries = sums.get(QUERIES)
    reading.prefix_cache_hits = sums.get(HITS)
    reading.running = sums.get(RUNNING)
    reading.waiting = sums.get(WAITING)
    if usage:
        reading.kv_cache_usage = sum(usage) / len(usage)
    return reading


@dataclass
class WorkerTruth:
    """The last reading of one worker, and how the scrapes went."""

    reading: WorkerReading | None = None
    scrapes: int = 0
    failures: int = 0
    last_scrape_monotonic: float | None = None
    last_error: str | None = None

    @property
    def hit_rate(self) -> float | None:
        """The worker's lifetime prefix-cache hit rate (its own counters)."""
        r = self.reading
        if r is None or not r.prefix_cache_queries or r.prefix_cache_hits is None:
            return None
        return r.prefix_cache_hits / r.prefix_cache_queries

    def describe(self) -> dict[str, Any]:
        """The ``worker_metrics`` entry of ``GET /workers``."""
        r = self.reading or WorkerReading()
        age = (
            round(time.monotonic() - self.last_scrape_monotonic, 3)
            if self.last_scrape_monotonic is not None
            else None
        )
        return {
            "scrapes": self.scrapes,
            "failures": self.failures,
            "age_s": age,
            "last_error": self.last_error,
            "prefix_cache_queries": r.prefix_cache_queries,
            "prefix_cache_hits": r.prefix_cache_hits,
            "prefix_cache_hit_rate": self.hit_rate,
            "requests_running": r.running,
            "requests_waiting": r.waiting,
            "kv_cache_usage": r.kv_cache_usage,
            "block_size": r.block_size,
            "num_gpu_blocks": r.num_gpu_blocks,
            "kv_capacity_tokens": r.capacity_tokens,
        }
