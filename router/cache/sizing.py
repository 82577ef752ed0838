"""One worker's router-side state, sized to its KV capacity: the one rule for every front end.

``serve`` and the EPP (:meth:`router.fleet.pool.WorkerPool.add` and ``resize``) and the offline
simulator (:func:`traces.sim.simulator.make_worker_states`) build each worker's
:class:`~router.cache.worker_state.WorkerState` here, so its shadows get the same sizes for the
same capacity:

- the block-hash LRU: ``capacity_tokens // block_size`` blocks (at least one);
- the radix tree: ``capacity_tokens`` of its own tokens, or, where the tree holds block keys
  instead of token ids (``radix_key_tokens``: one block as that many tree tokens, the
  simulator's traces of hashed blocks), ``radix_key_tokens`` per block of the LRU, each tree
  token weighing ``block_size // radix_key_tokens`` real tokens;
- the CPU tier's LRU (:func:`cpu_blocks`): ``cpu_tokens // block_size`` blocks (at least one),
  none for no tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.cache.block_lru import BlockLRU
from router.cache.cost_model import CostTerms, WorkerCost
from router.cache.kv_index import KVIndex
from router.cache.lora import AdapterSlots
from router.cache.radix_tree import RadixTree
from router.cache.worker_state import ShadowKind, WorkerState
from router.cache.workload import PrefillRate


@dataclass(frozen=True, slots=True)
class ShadowSizes:
    """The shadows' sizes for one KV capacity (see the module docstring)."""

    blocks: int  # the block-hash LRU's capacity, blocks
    radix_tokens: int  # the radix tree's capacity, in its own tokens
    radix_page: int  # the tree's page size, its own tokens
    radix_weight: int  # real tokens per tree token


def shadow_sizes(capacity_tokens: int, block_size: int, radix_key_tokens: int = 0) -> ShadowSizes:
    """The shadows' sizes for a worker of ``capacity_tokens`` KV tokens."""
    blocks = max(1, capacity_tokens // block_size)
    if radix_key_tokens:
        return ShadowSizes(
            blocks, radix_key_tokens * blocks, radix_key_tokens, block_size // radix_key_tokens
        )
    return ShadowSizes(blocks, capacity_tokens, 1, 1)


def cpu_blocks(cpu_tokens: int, block_size: int) -> int:
    """The CPU tier shadow's blocks for a tier of ``cpu_tokens`` (0: no tier)."""
    return max(1, cpu_tokens // block_size) if cpu_tokens > 0 else 0


def new_worker_state(
    name: str,
    capacity_tokens: int,
    block_size: int,
    *,
    shadow: ShadowKind,
    prefill_tokens_per_s: float,
    cost_terms: CostTerms,
    radix_policy: str = "lru",
    radix_key_tokens: int = 0,
    kv_index: KVIndex | None = None,
    adapters: AdapterSlots | None = None,
) -> WorkerState:
    """A worker's state: both shadows sized by :func:`shadow_sizes`, its prefill rate's prior
    and its cost model's terms (a CPU tier is sized by the caller, :func:`cpu_blocks`)."""
    sizes = shadow_sizes(capacity_tokens, block_size, radix_key_tokens)
    state = WorkerState(
        name=name,
        blocks=BlockLRU(sizes.blocks, block_size),
        radix=RadixTree(
            capacity_tokens=sizes.radix_tokens, page_size=sizes.radix_page, policy=radix_policy
        ),
        shadow=shadow,
        radix_token_weight=sizes.radix_weight,
        kv_index=kv_index,
        rate=PrefillRate(prefill_tokens_per_s),
        cost=WorkerCost(cost_terms),
    )
    if adapters is not None:
        state.adapters = adapters
    return state
