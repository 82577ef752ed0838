"""The real-time engine of the simulated worker: a WorkerModel on the event loop's clock.

Real-time driving (:class:`RealTimeWorker`): model time is ``(loop.time() - t0) *
time_scale``. The model is only touched from the event loop's thread, so it needs no lock.
One timer (``loop.call_at``) is armed for the model's ``next_event`` and re-armed whenever the
model's ``version`` changes; before any submit or scrape the model is first caught up to
"now" by advancing through every event that is due, at that event's own time, so step
boundaries keep the model's schedule even when the loop wakes late, and no request is ever
admitted before it arrived.

Streaming: the first token is sent when the model produces it, the last when the model
finishes the request. Between them tokens are paced by an estimate, one per decode step of
the current batch (``step_overhead + decode_per_seq * batch``, or its GPU profile's price of
the batch's context), never running ahead of the
second-to-last token; chunked-prefill steps make real steps longer than the estimate, so the
tail may arrive in a burst at the finish. Timing is therefore exact for TTFT and end-to-end
latency and approximate in between.

The metrics collector lives here too: it reads the model, so what ``/metrics`` reports and
what responses report come from the same books.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from traces.sim.worker_model import SimRequest, WorkerModel, WorkerModelConfig
from traces.sim_worker.api import FINISH_REASON
from traces.trace.record import BLOCK_TOKENS

log = logging.getLogger(__name__)

MIN_TICK_S = 0.002
"""Shortest real sleep between streamed tokens, so fast time scales do not spin the loop."""


# ---- the real-time driver --------------------------------------------------------------


class WorkerUnavailable(Exception):
    """The model failed; requests in flight and new ones are answered with 503."""


@dataclass(eq=False)
class Handle:
    """A submitted request's view of the model: resolved with model times."""

    request: SimRequest
    first: asyncio.Future[float]
    done: asyncio.Future[float]
    submitted: float  # real (loop) time
    # called once when the request ends: True at its finish, False if the model failed (a
    # plain callback, so a waiter that is cancelled, a client gone, does not skip it)
    on_end: Callable[[bool], None] | None = None


def _resolve(fut: asyncio.Future[float], t: float) -> None:
    if not fut.done():  # a waiter that was cancelled cancels its future
        fut.set_result(t)


class RealTimeWorker:
    """Owns one :class:`WorkerModel` and keeps it in step with the event loop's clock."""

    def __init__(
        self,
        config: WorkerModelConfig,
        time_scale: float = 1.0,
        on_events: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        events = on_events is not None
        self.model = WorkerModel(config, self._on_first_token, self._on_finish, events=events)
        self.on_events = on_events  # each engine step's KV events (one batch), when recorded
        self.scale = time_scale
        self.generation_tokens = 0
        self.failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._armed: tuple[int, float] | None = None  # (model version, model time)
        self._inflight: set[Handle] = set()

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The clock starts with the first use, on the loop that serves requests."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._t0 = self._loop.time()
        return self._loop

    def clock(self) -> float:
        """Real (loop) time now."""
        return self._bind().time()

    def now(self) -> float:
        """Model time now."""
        return (self._bind().time() - self._t0) * self.scale

    def kv_in_use(self) -> float:
        """Share of KV blocks held by requests in flight, as vLLM v1 reports usage: cached
        blocks no request holds are free (evictable) there, so an idle worker reads 0."""
        model, cache = self.model, self.model.cache
        held = cache.protected_tokens // cache.page_size + model.extra_blocks
        return min(1.0, held / max(1, model.config.capacity_blocks))

    @property
    def idle(self) -> bool:
        return self.model.num_running == 0 and self.model.num_waiting == 0

    def submit(
        self,
        blocks: tuple[int, ...],
        input_length: int,
        output_length: int,
        tokens: bytes | None = None,
        adapter: str | None = None,
        kv_transferred: bool = False,
        on_end: Callable[[bool], None] | None = None,
        priority: int = 0,
    ) -> Handle:
        """Queue a request at model time now; await ``handle.first`` / ``handle.done``.
        ``tokens``: the prompt's ids, which its KV events carry; ``adapter``: the LoRA
        adapter it runs (None: the base model); ``kv_transferred``: a disaggregated decode
        whose prompt KV came from a prefill worker; ``on_end``: see :class:`Handle`;
        ``priority``: its place under the priority scheduling policy (lower first)."""
        if self.failed is not None:
            raise WorkerUnavailable(str(self.failed))
        loop = self._bind()
        req = SimRequest(
            blocks,
            input_length,
            output_length,
            tokens=tokens,
            adapter=adapter,
            kv_transferred=kv_transferred,
            priority=priority,
        )
        handle = Handle(req, loop.create_future(), loop.create_future(), loop.time(), on_end)
        req.tag = handle
        self.sync()
        self._inflight.add(handle)
        self.model.submit(req, self.now())
        self._rearm()
        return handle

    def sync(self, floor: float = 0.0) -> None:
        """Advance the model through every event due by now (or ``floor``, if later)."""
        if self.failed is not None:
            return
        model, now = self.model, max(self.now(), floor)
        try:
            while model.next_event is not None and model.next_event <= now:
                model.advance(model.next_event)
                self._publish()
        except Exception as exc:  # a model bug: fail loudly, never hang clients
            self._fail(exc)

    def reset_cache(self) -> bool:
        """Drop the prefix cache if nothing is in flight (vLLM's reset_prefix_cache)."""
        self.sync()
        if not self.idle:
            return False
        self.model.reset_cache()
        self._publish()
        return True

    def _publish(self) -> None:
        if self.on_events is not None:
            events = self.model.take_events()
            if events:
                self.on_events(events)

    async def progress(self, handle: Handle) -> AsyncIterator[int]:
        """How many output tokens exist, as they appear (see the module docstring)."""
        n = handle.request.output_length
        t_first = await handle.first
        emitted = 1
        yield 1
        while emitted < n and not handle.done.done():
            step = self.model.decode_step_s()
            due = min(n - 1, 1 + int((self.now() - t_first) / step))
            if due > emitted:
                emitted = due
                yield due
            await asyncio.wait([handle.done], timeout=max(step / self.scale, MIN_TICK_S))
        await handle.done
        if n > emitted:
            yield n

    # ---- internals ---------------------------------------------------------------------

    def _rearm(self) -> None:
        model = self.model
        when = model.next_event
        if when is None or self.failed is not None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._armed = None
            return
        if self._timer is not None and self._armed == (model.version, when):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed = (model.version, when)
        self._timer = self._bind().call_at(self._t0 + when / self.scale, self._tick, when)

    def _tick(self, when: float) -> None:
        self._timer = self._armed = None
        self.sync(floor=when)  # the loop may wake a hair early: never re-arm for the past
        self._rearm()

    def _on_first_token(self, req: SimRequest, t: float) -> None:
        self.generation_tokens += 1
        _resolve(req.tag.first, t)

    def _on_finish(self, req: SimRequest, t: float) -> None:
        self.generation_tokens += max(0, req.output_length - 1)
        handle = req.tag
        self._inflight.discard(handle)
        if handle.on_end is not None:
            handle.on_end(True)
        _resolve(handle.done, t)

    def _fail(self, exc: Exception) -> None:
        log.exception("worker model failed; the simulated worker is now unhealthy")
        self.failed = exc
        for handle in self._inflight:
            if handle.on_end is not None:
                handle.on_end(False)
            for fut in (handle.first, handle.done):
                if not fut.done():
                    fut.set_exception(WorkerUnavailable(str(exc)))
                    fut.exception()  # retrieved: waiters that are gone must not log it
        self._inflight.clear()


# ---- metrics ---------------------------------------------------------------------------


class VllmCollector(Collector):
    """vLLM's metric names, read from the model at scrape time (one place, no double books).

    Token counters are the model's own totals at admission, the moment vLLM counts prefix
    cache queries and hits, so they agree with the ``cached_tokens`` the responses report.
    """

    def __init__(self, worker: RealTimeWorker, model_name: str) -> None:
        self.worker = worker
        self.labels = {"model_name": model_name, "engine": "0"}

    def collect(self) -> Iterator[Metric]:
        worker, model = self.worker, self.worker.model
        keys, values = list(self.labels), list(self.labels.values())
        stats = model.stats

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            metric = CounterMetricFamily(name, doc, labels=keys)
            metric.add_metric(values, value)
            return metric

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            metric = GaugeMetricFamily(name, doc, labels=keys)
            metric.add_metric(values, value)
            return metric

        queries = "Prefix cache queries, in terms of number of queried tokens."
        yield counter("vllm:prefix_cache_queries", queries, stats.prompt_tokens)
        hits = "Prefix cache hits, in terms of number of cached tokens."
        gpu_hits = stats.cached_tokens - stats.cpu_cached_tokens  # the GPU's own cache
        yield counter("vllm:prefix_cache_hits", hits, gpu_hits)
        if model.cpu is not None:  # the KV connector's (OffloadingConnector's CPU tier)
            queried = "External prefix cache queries from KV connector cross-instance cache "
            yield counter(
                "vllm:external_prefix_cache_queries",
                queried + "sharing, in terms of number of queried tokens.",
                stats.prompt_tokens - gpu_hits,
            )
            yield counter(
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, "
                "in terms of number of cached tokens.",
                stats.cpu_cached_tokens,
            )
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens
        )
        cached = "Number of cached prompt tokens (local + external)."
        yield counter("vllm:prompt_tokens_cached", cached, stats.cached_tokens)
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_cached_by_source",
            "Number of cached prompt tokens by source.",
            labels=[*keys, "source"],
        )
        by_source.add_metric([*values, "device"], gpu_hits)
        if model.cpu is not None:
            by_source.add_metric([*values, "host"], stats.cpu_cached_tokens)
        yield by_source
        gen = "Number of generation tokens processed."
        yield counter("vllm:generation_tokens", gen, worker.generation_tokens)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*keys, "finished_reason"],
        )
        success.add_metric([*values, FINISH_REASON], stats.finished)
        yield success
        yield gauge(
            "vllm:num_requests_running", "Requests in model execution batches.", model.num_running
        )
        yield gauge(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", model.num_waiting
        )
        usage = "KV-cache usage. 1 means 100 percent usage."
        yield gauge("vllm:kv_cache_usage_perc", usage, worker.kv_in_use())
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                "block_size",
                "num_gpu_blocks",
                "enable_prefix_caching",
                "kv_offloading_size",
                "kv_offloading_backend",
                "engine",
            ],
        )
        config = model.config
        # the CPU tier as vLLM's --kv-offloading-size states it: GiB, "None" without one
        cpu_bytes = config.cpu_kv_capacity_tokens * config.kv_bytes_per_token
        offloading = repr(cpu_bytes / 2**30) if cpu_bytes else "None"
        info.add_metric(
            [str(BLOCK_TOKENS), str(config.capacity_blocks), "True", offloading, "native", "0"],
            1.0,
        )
        yield info


class SglangCollector(Collector):
    """SGLang's metric names (``--enable-metrics``), from the same books as
    :class:`VllmCollector`: what the router's worker truth reads from a real SGLang server
    (:mod:`router.fleet.worker_truth`), in the shape of the committed real sample
    (``tests/router/fleet/data/sglang_metrics.txt``: one ``model_name`` label), plus the
    newer ``max_total_num_tokens`` and ``realtime_tokens_total{mode}``.
    """

    def __init__(self, worker: RealTimeWorker, model_name: str) -> None:
        self.worker = worker
        self.labels = {"model_name": model_name}

    def collect(self) -> Iterator[Metric]:
        worker, model = self.worker, self.worker.model
        keys, values = list(self.labels), list(self.labels.values())
        stats = model.stats
        pool = model.config.capacity_blocks * BLOCK_TOKENS
        usage = worker.kv_in_use()

        def family(kind: type, name: str, doc: str, value: float) -> Metric:
            metric = kind(name, doc, labels=keys)
            metric.add_metric(values, value)
            return metric

        yield family(
            CounterMetricFamily,
            "sglang:prompt_tokens",
            "Number of prefill tokens processed.",
            stats.prompt_tokens,
        )
        yield family(
            CounterMetricFamily,
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            worker.generation_tokens,
        )
        realtime = CounterMetricFamily(
            "sglang:realtime_tokens",
            "Number of tokens processed, by mode.",
            labels=[*keys, "mode"],
        )
        realtime.add_metric([*values, "prefill_compute"], stats.prompt_tokens - stats.cached_tokens)
        realtime.add_metric([*values, "prefill_cache"], stats.cached_tokens)
        realtime.add_metric([*values, "decode"], worker.generation_tokens)
        yield realtime
        yield family(GaugeMetricFamily, "sglang:token_usage", "The token usage", usage)
        hit_rate = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
        yield family(GaugeMetricFamily, "sglang:cache_hit_rate", "The cache hit rate", hit_rate)
        yield family(
            GaugeMetricFamily,
            "sglang:num_running_reqs",
            "The number of running requests",
            model.num_running,
        )
        yield family(
            GaugeMetricFamily,
            "sglang:num_used_tokens",
            "The number of used tokens",
            round(usage * pool),
        )
        yield family(
            GaugeMetricFamily,
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool",
            pool,
        )
        yield family(
            GaugeMetricFamily,
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue",
            model.num_waiting,
        )


class LoraCollector(Collector):
    """The worker's LoRA slots: vLLM's ``vllm:lora_requests_info`` and ``sim:lora_swaps_total``.

    vLLM sets the info gauge to the current time under the labels of every engine step
    (``max_lora``, ``waiting_lora_adapters``, ``running_lora_adapters``: comma-separated
    names), and the page keeps every label set it ever had: the newest value is the current
    one. Here the label set is read at each scrape; the last ``KEEP`` sets stay listed.
    """

    KEEP = 16

    def __init__(self, worker: RealTimeWorker, flavor: str = "vllm") -> None:
        self.worker = worker
        self.flavor = flavor
        self.seen: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def collect(self) -> Iterator[Metric]:
        model = self.worker.model
        swaps = CounterMetricFamily(
            "sim:lora_swaps", "LoRA adapters loaded into a slot (not resident when admitted)."
        )
        swaps.add_metric([], model.stats.lora_swaps)
        yield swaps
        if self.flavor != "vllm":
            return
        labels = (
            str(model.config.max_loras),
            ",".join(model.waiting_adapters()),
            ",".join(model.lora_running),
        )
        self.seen[labels] = time.time()
        self.seen.move_to_end(labels)
        while len(self.seen) > self.KEEP:
            self.seen.popitem(last=False)
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        for key, at in self.seen.items():
            info.add_metric(list(key), at)
        yield info
