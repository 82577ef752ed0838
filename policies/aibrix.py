"""aibrix: AIBrix's ``prefix-cache`` routing algorithm, with its code defaults.

Follows vllm-project/aibrix ``pkg/plugins/gateway/algorithms/prefix_cache.go`` and its
prefix-cache indexer (character tokenizer, no KV-event sync), as read 2026-11 (the spec's
section 4). For each request, over the healthy pods and their running-request counts:

1. Running-count filter: if ``max - min > 8`` (``imbalance_abs``), keep only the pods with
   the fewest running requests.
2. Prefix match over the index, block by block, narrowing to the kept pods holding each
   block; a pod's match is ``100 * (blocks it held in a row from the start) / blocks``
   (integer percent) while it stays in the walk.
3. The matched pods, shuffled, then stable-sorted by match % descending, then running count
   ascending; the first with ``running <= mean + 1 * stddev`` (``stddev_factor``; mean and
   population stddev over all healthy pods' counts) wins. Branch ``prefix_match``.
4. Else (no match, or every matched pod over that bound) the pod with the fewest running
   requests, ties at random. Branch ``least_request``.
5. All the request's block hashes are recorded for the chosen pod at routing time.

The index is one LRU for the whole fleet, block -> the pods (per model) it was routed to:
200,000 entries; an entry lives 20 minutes from its last write (AIBrix sweeps every second);
writes refresh it, lookups do not; adding a pod to a block keeps the pods already there.

Modelling choices and deviations:

- AIBrix hashes raw UTF-8 bytes in blocks of ``AIBRIX_PREFIX_CACHE_BLOCK_SIZE`` (4 in the
  code, 128 in its README), dropping only a partial tail block of under 4 bytes; we have no
  text on the hot path, so (as :mod:`policies.sglang_cache_aware` maps characters onto
  tokens) we use the request's block keys, ``chars_per_token`` (4) bytes a token, its
  trailing partial block included where the caller has one (a trace's), as AIBrix's fine
  blocks cover nearly the whole prompt. The index keeps
  AIBrix's span in bytes: 200,000 entries of ``block_bytes`` bytes, about 200k tokens with the
  code's 4 (the fleet's whole memory of prompts), expressed in our (coarser) blocks, so a
  match is whole blocks of ours.
- Block keys are the router's chained hashes (AIBrix hashes each block on its own with a
  seed; chaining only removes its false matches of a block seen after another prefix).
- The TTL runs on ``request.arrival`` (the simulator's virtual time) when set, else on
  :attr:`AIBrixPicker.clock` (``time.monotonic``); expiry is exact, at the next pick.
- Running counts are the router's in-flight counts (``num_requests``), as AIBrix counts the
  requests it routed.
- Random draws come from the picker's seeded generator (``seed``).
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits

BLOCK_NUMBER = 200_000
BLOCK_BYTES = 4
CHARS_PER_TOKEN = 4.0
TTL_S = 20 * 60.0
IMBALANCE_ABS = 8
STDDEV_FACTOR = 1.0


class PrefixIndex:
    """AIBrix's global LRU: block -> (last write, {model: pods}); oldest write first."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[int, tuple[float, dict[str | None, set[int]]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def expire(self, now: float, ttl_s: float) -> None:
        entries = self._entries
        while entries and now - next(iter(entries.values()))[0] > ttl_s:
            entries.popitem(last=False)

    def pods(self, block: int, model: str | None) -> set[int]:
        entry = self._entries.get(block)
        return entry[1].get(model, set()) if entry is not None else set()

    def add(
        self, blocks: Sequence[int], model: str | None, pod: int, now: float, capacity: int
    ) -> None:
        entries = self._entries
        for block in blocks:
            entry = entries.pop(block, None)
            models = entry[1] if entry is not None else {}
            models.setdefault(model, set()).add(pod)
            entries[block] = (now, models)
            if len(entries) > capacity:
                entries.popitem(last=False)


class AIBrixPicker:
    """Filter on running counts, best match % within mean + stddev, else least running."""

    name = "aibrix"
    needs = ()  # the core view alone
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self,
        *,
        block_number: int = BLOCK_NUMBER,
        block_bytes: int = BLOCK_BYTES,
        chars_per_token: float = CHARS_PER_TOKEN,
        ttl_s: float = TTL_S,
        imbalance_abs: int = IMBALANCE_ABS,
        stddev_factor: float = STDDEV_FACTOR,
        seed: int | None = 0,
    ) -> None:
        if min(block_number, block_bytes, chars_per_token, ttl_s) <= 0:
            raise ValueError("block_number, block_bytes, chars_per_token and ttl_s must be > 0")
        self.block_number = block_number
        self.block_bytes = block_bytes
        self.chars_per_token = chars_per_token
        self.ttl_s = ttl_s
        self.imbalance_abs = imbalance_abs
        self.stddev_factor = stddev_factor
        self.seed = seed
        self._rng = random.Random(seed)
        self.index = PrefixIndex()

    def capacity_blocks(self, block_size: int) -> int:
        """The index's span (``block_number`` entries of ``block_bytes``) in our blocks."""
        tokens = self.block_number * self.block_bytes / self.chars_per_token
        return max(1, int(tokens // block_size))

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        now = request.arrival if request.arrival is not None else self.clock()
        running = {i: workers[i].num_requests for i in healthy}
        low = min(running.values())
        kept = healthy
        if max(running.values()) - low > self.imbalance_abs:
            kept = [i for i in healthy if running[i] == low]

        index = self.index
        index.expire(now, self.ttl_s)
        blocks = request.blocks
        matched = self.match(blocks, request.model, kept)
        chosen = None
        if matched:
            counts = list(running.values())
            mean = sum(counts) / len(counts)
            bound = mean + self.stddev_factor * math.sqrt(
                sum((c - mean) ** 2 for c in counts) / len(counts)
            )
            order = list(matched)
            self._rng.shuffle(order)
            order.sort(key=lambda i: (-matched[i], running[i]))
            chosen = next((i for i in order if running[i] <= bound), None)
        branch = "prefix_match"
        if chosen is None:
            fewest = [i for i in healthy if running[i] == low]
            chosen = fewest[self._rng.randrange(len(fewest))] if len(fewest) > 1 else fewest[0]
            branch = "least_request"
        if blocks:
            index.add(blocks, request.model, chosen, now, self.capacity_blocks(request.block_size))
        return Pick(chosen, branch, hits[chosen], best_hit)

    def match(self, blocks: Sequence[int], model: str | None, kept: list[int]) -> dict[int, int]:
        """Match % per pod of ``kept`` still in the walk when it last matched a block."""
        matched: dict[int, int] = {}
        walking = set(kept)
        total = len(blocks)
        for k, block in enumerate(blocks):
            holders = walking & self.index.pods(block, model)
            if not holders:
                break
            percent = (k + 1) * 100 // total
            for pod in holders:
                matched[pod] = percent
            walking = holders
        return matched
