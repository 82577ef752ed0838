"""vllm_router: vllm-router 0.1.17's ``cache_aware`` policy (vllm-project/router).

vllm-router is a fork of SGLang's router, and its ``cache_aware`` keeps the classic flags
(``--cache-threshold`` 0.3, ``--balance-abs-threshold`` 64, ``--balance-rel-threshold``
1.5, ``--eviction-interval-secs`` 120, ``--max-tree-size``), but it is not
:mod:`policies.sglang_cache_aware` (sgl-router 0.3.2): a miss goes to the least loaded
worker, not to the smallest tree. Its source (``src/policies/cache_aware.rs``) says so in the
code, though the file's header comment and the Python docstring still say "smallest tree";
the 0.1.17 binary, probed on sim workers, sent 40 sequential misses (every worker idle, one
tree 20,000 characters larger than the rest) all to one worker. The rule:

1. Imbalance test on the router's in-flight counts over *all* workers (vllm-router folds
   every worker's load, healthy or not): ``max - min > balance_abs_threshold`` (64) **and**
   ``max > balance_rel_threshold * min`` (1.5): the least loaded healthy worker (first on
   ties). Branch ``imbalance``.
2. Otherwise the longest prefix match over the workers' trees, ``match rate = matched /
   request length``; above ``cache_threshold`` (0.3), the holder of the deepest match.
   Branch ``cache_match``.
3. Otherwise the least loaded healthy worker (first on ties). Branch ``least_load``.
4. The request is inserted into the chosen worker's tree at pick time.

What we model and how (the trees, as in :mod:`policies.sglang_cache_aware`, whose class this
one extends): per-worker trees of the request's tokens (or block keys), bounded by
``max_tree_size`` characters per worker (vllm-router's default 2**25, half sgl-router's) at
``chars_per_token`` (4), trimmed by age on insert (vllm-router trims every 120 s).

Ties: vllm-router keeps one tree for all workers and answers a hit with the matched node's
cached tenant, the worker that created the node; a miss's ``min_by_key`` over equal loads
lands on one fixed worker (the probe's: the last of ``--worker-urls``). We take the first
worker by index in both cases. The first request of a fleet is a miss, so the worker that
takes the idle fleet's misses also creates the shared prefixes (a system prompt) that later
hits follow: one fixed worker either way, here as there. Live (bench/peers/peer_live.py,
conversation sample, 3 runs) the hit rates agree (14.5% against the binary's 15.2%), but the
binary spread the requests evenly (216-278 of 1,000 a worker) where this model sent 365-398 to
the first: the binary's character tree carries a match a character or two past a shared
block into one holder's text, so prompts that match only a shared system prompt land on
whichever holder shares those characters; the model matches whole 4-character groups and
gives the tie to the first worker. Not modelled: the session map of the
chat path (a ``/v1/chat/completions`` session key matched exactly; completions, which the
benches send, go by prompt text), and the random pick when the model has no tree.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import WorkerView
from policies.sglang_cache_aware import (
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    CACHE_THRESHOLD,
    CHARS_PER_TOKEN,
    SGLangCacheAwarePicker,
)
from router.cache.radix_tree import RadixTree

MAX_TREE_SIZE = 2**25
"""Characters of prompt text vllm-router keeps per worker (its ``--max-tree-size``)."""


class VLLMRouterCacheAwarePicker(SGLangCacheAwarePicker):
    """Imbalanced: least loaded; else the deepest match above the threshold; else least
    loaded."""

    name = "vllm_router"

    def __init__(
        self,
        *,
        cache_threshold: float = CACHE_THRESHOLD,
        balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
        max_tree_size: int = MAX_TREE_SIZE,
        chars_per_token: float = CHARS_PER_TOKEN,
    ) -> None:
        super().__init__(
            cache_threshold=cache_threshold,
            balance_abs_threshold=balance_abs_threshold,
            balance_rel_threshold=balance_rel_threshold,
            max_tree_size=max_tree_size,
            chars_per_token=chars_per_token,
        )

    @staticmethod
    def balance_loads(workers: Sequence[WorkerView], healthy: list[int]) -> list[int]:
        """Every worker's in-flight count, as vllm-router folds them."""
        return [w.num_requests for w in workers]

    @staticmethod
    def on_miss(healthy: list[int], trees: list[RadixTree], least: int) -> tuple[int, str]:
        """A miss goes to the least loaded worker, not the smallest tree."""
        return least, "least_load"
