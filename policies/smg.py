"""smg: SMG's ``cache_aware`` policy (the newer SGLang model gateway), as SMG 1.13 runs it.

Follows smg-project/smg, the ``smg`` wheel 1.13.0 (``model_gateway/src/policies/
cache_aware.rs``, approximate tree mode, CLI defaults): the spec's "newer SMG". Unlike
SGLang's router (:mod:`policies.sglang_cache_aware`, kept for the 0.3.2 behaviour) there is
no fleet-wide imbalance switch and no smallest-tree fallback:

1. Longest prefix match over the per-worker approximate trees; ``match rate = matched /
   request length``.
2. Hit (rate ``> cache_threshold``, 0.3): the holders of the deepest match (at most 8, SMG's
   ``MATCHED_TENANTS_CAP``) and of them the least loaded, ties at random. Then the gate: if
   that worker's load ``> balance_rel_threshold * avg`` (1.5) **and** ``> avg +
   balance_abs_threshold`` (64), ``avg`` the mean load of the healthy workers, the request
   spills to the least loaded worker. Branches ``cache_match`` / ``spill``.
3. Miss: the least loaded worker. Branch ``least_load``.
4. The request is inserted into the chosen worker's tree at pick time (a spill makes its
   target a new holder of the prefix, as SMG's does).

Load is the router's in-flight count (our ``num_requests``); "least loaded" breaks ties on
fewer requests sent there by this picker, then the lower index (SMG's ``(load, processed,
index)`` key).

What we model and how (the tree, as in :mod:`policies.sglang_cache_aware`, whose class this
one extends for its trees):

- SMG's HTTP path matches raw text characters in a string tree; we match the request's
  exact tokens when present, else its block keys as pseudo-tokens (whole blocks), in
  per-worker trees bounded by ``max_tree_size`` (2**26) characters at ``chars_per_token`` (4)
  per token, trimmed by age on insert (SMG trims every ``eviction_interval_secs``, 60 s).
- SMG keeps one multi-tenant tree and takes the tenants of the deepest matched node in map
  order; the workers whose own tree matches as deep are the same set, and we take the first
  8 of them by index (only a fleet of more than 8 holders can tell).
- Not modelled (off by default in SMG): the KV-usage imbalance gate, the waiting-prefill
  overlap decay and selection temperature, the hash-index under-layer, the event-driven mode.
- Not modelled either, though on by default in the 1.13 binary (its ``--help``): a warm-up
  slice (a quarter of the misses to workers registered less than 60 s ago), one hit in 8
  diverted to a thin worker, overload protection from its polled loads (8 waiting requests,
  0.8 KV use), and a spill margin capped at "the in-flight count's natural swing at the
  pool's current mean (two standard deviations, never under four)". Live
  (bench/peers/peer_live.py, conversation sample, 3 runs) the binary's hit rate was 12.5%
  against this model's 14.6%, and 15.4% with the warm-up and diversion off and its timers in
  the workers' time (``smg:cache_aware:steady``).
- Random ties draw from the picker's seeded generator (``seed``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.sglang_cache_aware import (
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    CACHE_THRESHOLD,
    CHARS_PER_TOKEN,
    MAX_TREE_SIZE,
    SGLangCacheAwarePicker,
    _tree_key,
)
from router.cache.block_hash import TOKEN_BYTES

MATCHED_TENANTS_CAP = 8


class SMGCacheAwarePicker(SGLangCacheAwarePicker):
    """Hit: least-loaded holder of the deepest match unless over the load gate; miss: least
    loaded."""

    name = "smg"

    def __init__(
        self,
        *,
        cache_threshold: float = CACHE_THRESHOLD,
        balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
        max_tree_size: int = MAX_TREE_SIZE,
        chars_per_token: float = CHARS_PER_TOKEN,
        max_candidates: int = MATCHED_TENANTS_CAP,
        seed: int | None = 0,
    ) -> None:
        super().__init__(
            cache_threshold=cache_threshold,
            balance_abs_threshold=balance_abs_threshold,
            balance_rel_threshold=balance_rel_threshold,
            max_tree_size=max_tree_size,
            chars_per_token=chars_per_token,
        )
        if max_candidates <= 0:
            raise ValueError("max_candidates must be positive")
        self.max_candidates = max_candidates
        self.seed = seed
        self._rng = random.Random(seed)
        self._processed: list[int] = []  # requests this picker sent to each worker

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        trees = self.trees(request, len(workers))
        processed = self._processed
        processed.extend([0] * (len(workers) - len(processed)))
        key = _tree_key(request)
        loads = {i: workers[i].num_requests for i in healthy}
        least = min(healthy, key=lambda i: (loads[i], processed[i], i))

        matched = {i: trees[i].prefix_length(key) for i in healthy}
        deepest = max(matched.values())
        total = len(key) // TOKEN_BYTES
        if total and deepest / total > self.cache_threshold:
            holders = [i for i in healthy if matched[i] == deepest][: self.max_candidates]
            low = min(loads[i] for i in holders)
            tied = [i for i in holders if loads[i] == low]
            chosen = tied[self._rng.randrange(len(tied))] if len(tied) > 1 else tied[0]
            avg = sum(loads.values()) / len(loads)
            load = loads[chosen]
            if load > self.balance_rel_threshold * avg and load > avg + self.balance_abs_threshold:
                chosen, branch = least, "spill"
            else:
                branch = "cache_match"
        else:
            chosen, branch = least, "least_load"
        trees[chosen].insert(key)
        processed[chosen] += 1
        return Pick(chosen, branch, hits[chosen], best_hit)
