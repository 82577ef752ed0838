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
  num_gpu_blocks`` tokens; ``kv_offloading_size``: its CPU KV tier in GiB (vLLM's
  ``--kv-offloading-size``, for the native OffloadingConnector or LMCache; the info metric
  carries every CacheConfig field; "None" without one);
- ``vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}``: its
  LoRA slots and the adapters running and waiting (comma-separated names). The value is the
  time of the update and every label set ever set stays exported, so the newest one counts.

SGLang (``--enable-metrics``) names the same figures its own way
(``python/sglang/srt/metrics/collector.py``), read into the same fields:

- ``sglang:realtime_tokens_total{mode=prefill_cache|prefill_compute}``: prompt tokens found
  cached / computed, so ``queries = cache + compute`` and ``hits = cache`` (older versions
  without it: ``sglang:cache_hit_rate``, the gauge, gives the hit rate);
- ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``: running / waiting;
- ``sglang:token_usage``: fraction of the KV pool in use;
- ``sglang:max_total_num_tokens``: the KV pool in tokens (older versions: ``num_used_tokens /
  token_usage``). SGLang pages are tokens (``page_size`` 1 by default), so no block size.

Values are summed over label sets (several engines behind one server), except the usage,
which is averaged. A size past what any worker has (:data:`MAX_REPORTED`: block sizes, block
counts, KV pools, LoRA slots, the CPU tier's bytes; or not finite) is a broken page, not a
worker: it is read as not reported, so it neither sizes a shadow nor breaks ``GET
/workers``' JSON (a capacity past 2**63 did). Only the lines of these families are parsed
(vLLM's page is mostly histograms), with ``prometheus_client``'s parser. The simulated worker
exports the same names, so the whole path is tested without vLLM; tests/integration runs it
against real vLLM.
"""

from __future__ import annotations

import math
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
LORA_INFO = "vllm:lora_requests_info"
SG_REALTIME = "sglang:realtime_tokens"
SG_HIT_RATE = "sglang:cache_hit_rate"
SG_RUNNING = "sglang:num_running_reqs"
SG_WAITING = "sglang:num_queue_reqs"
SG_USAGE = "sglang:token_usage"
SG_MAX_TOKENS = "sglang:max_total_num_tokens"
SG_USED_TOKENS = "sglang:num_used_tokens"
SGLANG = (SG_REALTIME, SG_HIT_RATE, SG_RUNNING, SG_WAITING, SG_USAGE, SG_MAX_TOKENS, SG_USED_TOKENS)
FAMILIES = (QUERIES, HITS, RUNNING, WAITING, USAGE, CACHE_CONFIG, LORA_INFO, *SGLANG)
_MEANS = (USAGE, SG_USAGE, SG_HIT_RATE)  # ratios: averaged over label sets
_PREFIXES = tuple(name + suffix for name in FAMILIES for suffix in ("{", " ", "_total"))
MAX_REPORTED = 2**50
"""The largest size a worker may report (tokens, blocks, bytes: a PiB of KV); past it the
figure is ignored (module docstring)."""


def _size(value: float | None) -> int | None:
    """A reported size as an int, None unless it is finite, positive and at most
    :data:`MAX_REPORTED`."""
    if value is None or not 0 < value <= MAX_REPORTED:  # NaN compares false
        return None
    return round(value)


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
    cpu_kv_bytes: int | None = None  # its CPU KV tier (vLLM's kv_offloading_size)
    engine: str | None = None  # "vllm" or "sglang", from the names it exports
    pool_tokens: int | None = None  # SGLang's KV pool in tokens
    cache_hit_rate: float | None = None  # SGLang's own gauge (versions without counters)
    max_lora: int | None = None  # vLLM's LoRA slots, with the adapters running and waiting
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()

    @property
    def capacity_tokens(self) -> int | None:
        """KV capacity in tokens, when the worker told both its block size and block count
        (vLLM) or its pool size (SGLang)."""
        if self.block_size and self.num_gpu_blocks:
            return _size(self.block_size * self.num_gpu_blocks)
        return self.pool_tokens


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        value = int(labels.get(name, ""))
    except ValueError:
        return None  # "None" before the engine has sized its cache
    return value if 0 < value <= MAX_REPORTED else None


def _float_label(labels: dict[str, str], name: str) -> float | None:
    try:
        value = float(labels.get(name, ""))
    except ValueError:
        return None  # "None": not set
    return value if value > 0 and math.isfinite(value) else None


def _names(labels: dict[str, str], name: str) -> frozenset[str]:
    return frozenset(part for part in labels.get(name, "").split(",") if part)


def parse_worker_metrics(text: str) -> WorkerReading:
    """The vLLM figures of a Prometheus text page (other lines are skipped unparsed)."""
    kept = [line for line in text.splitlines() if line.startswith(_PREFIXES)]
    sums: dict[str, float] = {}
    means: dict[str, list[float]] = {}
    reading = WorkerReading()
    lora_at = -1.0
    for family in text_string_to_metric_families("\n".join(kept) + "\n"):
        for sample in family.samples:
            name = sample.name
            if name.endswith(("_created", "_total_created")):
                continue
            if name.endswith("_total"):
                name = name[: -len("_total")]
            if name in _MEANS:
                means.setdefault(name, []).append(sample.value)
            elif name == SG_REALTIME:
                mode = sample.labels.get("mode", "")
                sums[f"{name}:{mode}"] = sums.get(f"{name}:{mode}", 0.0) + sample.value
            elif name == LORA_INFO:
                if sample.value >= lora_at:  # the newest label set
                    lora_at = sample.value
                    reading.max_lora = _int_label(sample.labels, "max_lora")
                    reading.lora_running = _names(sample.labels, "running_lora_adapters")
                    reading.lora_waiting = _names(sample.labels, "waiting_lora_adapters")
            elif name == CACHE_CONFIG:
                reading.block_size = _int_label(sample.labels, "block_size")
                blocks = _int_label(sample.labels, "num_gpu_blocks")
                if blocks is not None:
                    reading.num_gpu_blocks = _size((reading.num_gpu_blocks or 0) + blocks)
                gib = _float_label(sample.labels, "kv_offloading_size")
                tier = _size(gib * 2**30) if gib is not None else None
                if tier is not None:
                    reading.cpu_kv_bytes = _size((reading.cpu_kv_bytes or 0) + tier)
            elif name in FAMILIES:
                sums[name] = sums.get(name, 0.0) + sample.value
    mean = {name: sum(v) / len(v) for name, v in means.items()}
    if any(name.startswith("sglang:") for name in (*sums, *mean)):
        return _sglang(reading, sums, mean)
    reading.engine = "vllm" if sums or mean or reading.block_size else None
    reading.prefix_cache_queries = sums.get(QUERIES)
    reading.prefix_cache_hits = sums.get(HITS)
    reading.running = sums.get(RUNNING)
    reading.waiting = sums.get(WAITING)
    reading.kv_cache_usage = mean.get(USAGE)
    return reading


def _sglang(
    reading: WorkerReading, sums: dict[str, float], mean: dict[str, float]
) -> WorkerReading:
    """SGLang's names into the same reading (see the module docstring)."""
    reading.engine = "sglang"
    cached = sums.get(f"{SG_REALTIME}:prefill_cache")
    computed = sums.get(f"{SG_REALTIME}:prefill_compute")
    if cached is not None or computed is not None:
        reading.prefix_cache_hits = cached or 0.0
        reading.prefix_cache_queries = (cached or 0.0) + (computed or 0.0)
    reading.cache_hit_rate = mean.get(SG_HIT_RATE)
    reading.running = sums.get(SG_RUNNING)
    reading.waiting = sums.get(SG_WAITING)
    usage = reading.kv_cache_usage = mean.get(SG_USAGE)
    pool = sums.get(SG_MAX_TOKENS)
    used = sums.get(SG_USED_TOKENS)
    if not pool and used and usage:
        pool = used / usage  # versions without max_total_num_tokens
    reading.pool_tokens = _size(pool)
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
        if r is None:
            return None
        if not r.prefix_cache_queries or r.prefix_cache_hits is None:
            return r.cache_hit_rate  # SGLang without token counters: its own gauge
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
            "cpu_kv_bytes": r.cpu_kv_bytes,
            "engine": r.engine,
            "max_lora": r.max_lora,
            "lora_running": sorted(r.lora_running),
            "lora_waiting": sorted(r.lora_waiting),
        }
