"""LoRA adapters in the cache model: each adapter's own prefix cache, and a worker's adapter
slots as the router books them.

Prefix caches. An engine never serves a block computed under adapter A to adapter B or to the
base model (vLLM puts the LoRA in the block hash's extra keys; SGLang's LoRA radix cache keys
its tree by adapter). :func:`under_adapter` gives a request's features that property: its
block keys re-chained from a root that names the adapter (equal keys still mean equal
prefixes, now under one adapter), and its tokens behind two pseudo-tokens of that root for
the radix shadow, which therefore counts those two tokens in a match. Those tokens are marked
:class:`~router.cache.block_hash.TextBytes` (not the worker's token ids), so the KV-event
index, which holds the base model's blocks, never answers for an adapter request: the shadows
do.

Slots. A vLLM worker runs at most ``max_loras`` adapters in one batch and keeps the adapters
it loaded on the GPU until a slot is needed (least recently used first). A request whose
adapter is not resident costs a load; one whose adapter is not running while every slot runs
another adapter waits until one of them drains. :class:`AdapterSlots` tracks this from the
router's own bookings (the running adapters and the recently used ones), corrected by the
worker's ``vllm:lora_requests_info`` when its /metrics say so, and counts the loads the
router caused (``swaps``).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import xxhash

from router.cache.block_hash import TextBytes, chain_ids
from router.cache.features import RequestFeatures

DEFAULT_MAX_LORAS = 1
"""vLLM's default ``--max-loras``: the slots assumed until the worker's metrics say."""


def adapter_root(adapter: str) -> int:
    """The block-chain root of ``adapter``'s prefix cache (never 0, the base model's)."""
    return xxhash.xxh3_64_intdigest(b"lora:" + adapter.encode()) or 1


def adapter_blocks(blocks: Sequence[int], adapter: str) -> list[int]:
    """``blocks`` (prefix-chained keys) re-chained under ``adapter``'s root: the keys of the
    same prompt in the adapter's own prefix cache (the router's shadows and the sim worker's
    KV cache both key an adapter's blocks so)."""
    return chain_ids(blocks, 1, adapter_root(adapter)) if len(blocks) else []


def under_adapter(features: RequestFeatures, adapter: str) -> RequestFeatures:
    """``features`` of the same prompt served by LoRA ``adapter`` (see the module doc)."""
    root = adapter_root(adapter)
    tokens = features.tokens
    if tokens is not None:
        tokens = TextBytes(root.to_bytes(8, "little") + tokens)
    blocks = adapter_blocks(features.blocks, adapter)
    return dataclasses.replace(features, blocks=blocks, tokens=tokens, adapter=adapter)


class AdapterSlots:
    """The adapters a worker holds, as the router books them (see the module doc)."""

    __slots__ = ("max_loras", "recent", "reported", "reported_running", "running", "swaps")

    def __init__(self, max_loras: int = DEFAULT_MAX_LORAS) -> None:
        self.max_loras = max_loras
        self.running: dict[str, int] = {}  # adapter -> requests booked and not finished
        self.recent: OrderedDict[str, None] = OrderedDict()  # resident, least recent first
        self.swaps = 0  # bookings of an adapter that was not resident
        self.reported = False  # max_loras and the resident set come from the worker
        self.reported_running: frozenset[str] = frozenset()  # the worker's last word

    def resident(self, adapter: str) -> bool:
        return adapter in self.running or adapter in self.recent

    def full(self) -> bool:
        """No free slot: loading another adapter evicts a resident one."""
        return len(self.recent) >= self.max_loras

    def blocked(self, adapter: str) -> bool:
        """Every slot runs another adapter: ``adapter`` waits until one of them drains."""
        return adapter not in self.running and len(self.running) >= self.max_loras

    def acquire(self, adapter: str) -> bool:
        """A request for ``adapter`` is booked here; True if that loads it (a swap)."""
        swap = not self.resident(adapter)
        self.swaps += swap
        self.running[adapter] = self.running.get(adapter, 0) + 1
        self.recent[adapter] = None
        self.recent.move_to_end(adapter)
        self._trim()
        return swap

    def release(self, adapter: str) -> None:
        left = self.running.get(adapter, 0) - 1
        if left > 0:
            self.running[adapter] = left
        else:
            self.running.pop(adapter, None)

    def report(self, max_loras: int, running: frozenset[str]) -> None:
        """The worker's own view (``vllm:lora_requests_info``): its slot count, and the
        adapters it runs, which are resident whatever the router booked."""
        self.max_loras = max(1, max_loras)
        self.reported = True
        self.reported_running = running
        for adapter in running:
            self.recent[adapter] = None
            self.recent.move_to_end(adapter)
        self._trim()

    def _trim(self) -> None:
        """Forget the least recent adapters beyond the slots; running ones stay resident."""
        busy = self.running.keys() | self.reported_running
        idle = [a for a in self.recent if a not in busy]
        for adapter in idle[: max(0, len(self.recent) - max(self.max_loras, len(busy)))]:
            del self.recent[adapter]

    def describe(self) -> dict[str, Any]:
        return {
            "max_loras": self.max_loras,
            "reported": self.reported,
            "running": dict(self.running),
            "resident": list(self.recent),
            "swaps": self.swaps,
        }
