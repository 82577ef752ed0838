"""sglang_cache_aware: SGLang router's ``cache_aware`` policy, modelled as SGLang runs it.

A baseline so the simulator can compare our pickers with what users would otherwise
deploy. The algorithm, as SGLang documents it (router docs and the policy's own header; defaults
are the current router's, older releases used 0.5 / 32 / 1.0001 / 2**24):

1. Imbalance test on the router's in-flight counts (our ``num_requests``) over healthy
   workers: imbalanced iff ``max - min > balance_abs_threshold`` (64) **and**
   ``max > balance_rel_threshold * min`` (1.5). Then shortest queue: the least loaded,
   first worker on ties. Branch ``imbalance``.
2. Otherwise, the longest prefix match over the per-worker approximate trees;
   ``match rate = matched / request length``. If the rate is ``> cache_threshold`` (0.3),
   the best-matching worker (first on ties). Branch ``cache_match``.
3. Otherwise the worker whose tree is smallest ("most available cache"), first on ties.
   Branch ``smallest_tree``.
4. Whatever was chosen, the request is inserted into the chosen worker's tree at pick
   time: this is the picker's own state, updated as SGLang's router updates its tree.

What we model and how:

- The trees are *not* the router's shadow of the worker's KV cache: SGLang's router never
  sizes its tree to the worker's cache. Its bound is ``max_tree_size`` = 2**26 characters
  of prompt text per worker (SGLang's current default), trimmed by age (least recently
  used leaves). We hold token trees (:class:`router.cache.radix_tree.RadixTree`, LRU) with a
  capacity of ``max_tree_size / chars_per_token`` tokens (``chars_per_token`` = 4, a usual
  BPE ratio for English), i.e. about 16.8M tokens per worker, far more than a real KV
  cache: the tree remembers prefixes the worker has long evicted, as SGLang's does.
- SGLang trims the tree every ``eviction_interval_secs`` in a background thread; pickers
  have no clock, so we trim on insert. The only difference is the transient overshoot
  between two trims, which is negligible next to a tree this large.
- SGLang's HTTP router matches raw text characters; we match what the request carries:
  exact token ids (``RequestFeatures.tokens``) when present, else the block keys as
  pseudo-tokens (each 64-bit key packed as two uint32 tokens in a tree with
  ``page_size=2``, so matches stay whole blocks; match rate = matched blocks / blocks;
  capacity converted to blocks of ``block_size`` tokens).
- SGLang keeps one multi-tenant tree; we keep one tree per worker index, which gives the
  same longest match and per-worker size. Where SGLang's ties fall to map iteration order
  we take the first worker. Under light load (no imbalance) every request that shares more
  than 30% of its length with what one worker has seen (a chat template, a system prompt)
  goes to that worker: this is how SGLang's router was seen sending every new conversation
  to one worker.
- Unhealthy workers are skipped everywhere (no match, no load, no insert).

``hit_tokens`` / ``best_hit_tokens`` in the returned :class:`~policies.base.Pick` come from
the worker views (the router's own shadow), like every other picker, so routing loss is
measured the same way for all policies.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from router.cache.block_hash import TOKEN_BYTES, keys_as_tokens
from router.cache.radix_tree import RadixTree

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
MAX_TREE_SIZE = 2**26
"""Characters of prompt text SGLang's router keeps per worker tree."""
CHARS_PER_TOKEN = 4.0

_TOKENS_PER_KEY = 2  # one uint64 block key = two uint32 pseudo-tokens


class SGLangCacheAwarePicker:
    """Imbalanced: shortest queue; else best tree match above the threshold; else smallest tree."""

    name = "sglang_cache_aware"
    needs = ()  # the core view alone

    def __init__(
        self,
        *,
        cache_threshold: float = CACHE_THRESHOLD,
        balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
        max_tree_size: int = MAX_TREE_SIZE,
        chars_per_token: float = CHARS_PER_TOKEN,
    ) -> None:
        if max_tree_size <= 0 or chars_per_token <= 0:
            raise ValueError("max_tree_size and chars_per_token must be positive")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_tree_size = max_tree_size
        self.chars_per_token = chars_per_token
        # one list of per-worker trees per key kind ("tokens", or block keys of a block size)
        self._trees: dict[tuple[str, int], list[RadixTree]] = {}

    @property
    def capacity_tokens(self) -> int:
        """Tokens a worker's tree may hold before its oldest leaves are trimmed."""
        return int(self.max_tree_size / self.chars_per_token)

    def trees(self, request: RequestFeatures, num_workers: int) -> list[RadixTree]:
        """The per-worker trees that requests like ``request`` are matched against."""
        kind = ("tokens", 1) if request.tokens is not None else ("blocks", request.block_size)
        trees = self._trees.get(kind)
        if trees is None:
            trees = self._trees[kind] = []
        while len(trees) < num_workers:
            if kind[0] == "tokens":
                trees.append(RadixTree(self.capacity_tokens))
            else:
                keys = self.capacity_tokens // kind[1]
                trees.append(RadixTree(keys * _TOKENS_PER_KEY, page_size=_TOKENS_PER_KEY))
        return trees

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        trees = self.trees(request, len(workers))
        key = _tree_key(request)

        least = min(healthy, key=lambda i: (workers[i].num_requests, i))
        loads = self.balance_loads(workers, healthy)
        max_load, min_load = max(loads), min(loads)
        if (
            max_load - min_load > self.balance_abs_threshold
            and max_load > min_load * self.balance_rel_threshold
        ):
            chosen, branch = least, "imbalance"
        else:
            best_match, chosen = -1, -1
            for i in healthy:
                matched = trees[i].prefix_length(key)
                if matched > best_match:
                    best_match, chosen = matched, i
            total = len(key) // TOKEN_BYTES
            if total and best_match / total > self.cache_threshold:
                branch = "cache_match"
            else:
                chosen, branch = self.on_miss(healthy, trees, least)
        trees[chosen].insert(key)
        return Pick(chosen, branch, hits[chosen], best_hit)

    @staticmethod
    def balance_loads(workers: Sequence[WorkerView], healthy: list[int]) -> list[int]:
        """The in-flight counts the imbalance test reads: the healthy workers'."""
        return [workers[i].num_requests for i in healthy]

    @staticmethod
    def on_miss(healthy: list[int], trees: list[RadixTree], least: int) -> tuple[int, str]:
        """Where a request no tree matches well enough goes: the smallest tree."""
        sizes = [trees[i].total_tokens for i in healthy]
        return healthy[sizes.index(min(sizes))], "smallest_tree"


def _tree_key(request: RequestFeatures) -> bytes:
    """The request as a uint32 LE token buffer: its tokens, or its block keys as pseudo-tokens."""
    if request.tokens is not None:
        return request.tokens
    return keys_as_tokens(request.blocks)
