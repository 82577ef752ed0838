"""A tiny in-memory WorkerView and request helpers for the picker tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pytest

from policies.base import RequestFeatures
from router.cache.block_lru import BlockLRU
from router.cache.cost_model import WorkerCost
from router.cache.lora import AdapterSlots
from router.cache.workload import PrefillRate, SessionFootprint

BLOCK = 512


@dataclass
class FakeWorker:
    """A WorkerView whose cache is a set of block keys; counts estimate calls.

    It offers every capability of ``policies.base`` at its neutral value (tracks none of
    them) unless a test sets one: ``view.adapters = AdapterSlots(2)``.
    """

    cached: set[int] = field(default_factory=set)
    num_requests: int = 0
    pending_prefill_tokens: int = 0
    ongoing_decode_tokens: int = 0
    healthy: bool = True
    block_size: int = BLOCK
    estimate_calls: int = 0
    held_tokens: int = 0
    kv_capacity_tokens: int = 1 << 20
    cost: WorkerCost | None = None
    rate: PrefillRate | None = None
    prefill_queue: None = None
    footprint: SessionFootprint | None = None
    blocks: BlockLRU | None = None
    tiered: bool = False
    kv_load_s_per_token: float = 0.0
    adapters: AdapterSlots | None = None
    num_requests_waiting: int | None = None
    kv_usage_fraction: float | None = None
    worker_block_size: int | None = None

    def prefill_left(self, now: float) -> int:
        return self.pending_prefill_tokens  # never called: no prefill queue tracked

    def prefill_tail(self, chunk_tokens: int) -> tuple[int, int]:
        return 0, 0

    def estimate_tiers(self, blocks: Sequence[int], tokens: bytes | None = None) -> tuple[int, int]:
        return self.estimate_cache_hit(blocks, tokens), 0  # never called: not tiered

    def estimate_cache_hit(self, blocks: Sequence[int], tokens: bytes | None = None) -> int:
        self.estimate_calls += 1
        n = 0
        for block in blocks:
            if block not in self.cached:
                break
            n += 1
        return n * self.block_size


def _worker(
    num_requests: int = 0,
    *,
    cached: Iterable[int] = (),
    pending: int = 0,
    healthy: bool = True,
    decode: int = 0,
) -> FakeWorker:
    return FakeWorker(set(cached), num_requests, pending, decode, healthy)


def _request(
    blocks: Sequence[int] = (1, 2, 3, 4),
    input_length: int | None = None,
    session: str | None = None,
    tokens: bytes | None = None,
) -> RequestFeatures:
    length = len(blocks) * BLOCK if input_length is None else input_length
    return RequestFeatures(list(blocks), length, session, tokens)


@pytest.fixture
def worker() -> Callable[..., FakeWorker]:
    """``worker(num_requests=0, *, cached=(1, 2), pending=100, healthy=True, decode=0)``."""
    return _worker


@pytest.fixture
def request_for() -> Callable[..., RequestFeatures]:
    """``request_for(blocks, input_length=len(blocks)*512, session=None, tokens=None)``."""
    return _request


@pytest.fixture
def idle_fleet() -> Callable[[int], list[FakeWorker]]:
    """``idle_fleet(n)``: n healthy, cold, idle workers."""
    return lambda n: [_worker() for _ in range(n)]
