"""``oracle``: LMetric scored on the worker models' truth, a reference for the simulator only.

The live router can only estimate what a worker holds and how much prefill is still ahead; in
the simulator the worker models know. The oracle asks LMetric's question
(``(pending + new_prefill) * num_requests``, the 4-key tie-break) on that truth:

- cached prefix: the longest prefix of the request's blocks in the model's radix KV cache,
  or in the blocks of requests already queued there (they will be cached by the time this
  one is admitted, and they share their prefix with it);
- remaining prefill: the uncached tokens still to prefill of the running requests, plus
  those of the queued ones (each counted when it was queued, against the same truth).

It is not offered by ``serve`` (the proxy has no such truth) and is not in
:data:`policies.registry.PICKERS`; ``simulate`` accepts it by name. The simulator gives it
:class:`TruthView` s instead of the router's :class:`~router.cache.worker_state.WorkerState` s
(:meth:`OraclePicker.truth_views`) and tells it of each submission (:meth:`TruthView.queue`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import takewhile

from policies.lmetric import LMetricPicker
from router.cache.worker_state import WorkerState
from traces.sim.worker_model import SimRequest, WorkerModel
from traces.trace.record import BLOCK_TOKENS

ORACLE = "oracle"


class TruthView:
    """A ``WorkerView`` answered from a worker model instead of the router's shadow."""

    __slots__ = ("_queued", "_queued_blocks", "_queued_prefill", "model", "state")
    tiered = False  # no CPU tier read (policies.base.CPUTier): flow control's estimate reads it

    def __init__(self, state: WorkerState, model: WorkerModel) -> None:
        self.state = state
        self.model = model
        self._queued: deque[tuple[SimRequest, int]] = deque()  # mirror of model.waiting
        self._queued_blocks: dict[int, int] = {}  # block -> queued requests holding it
        self._queued_prefill = 0

    @property
    def healthy(self) -> bool:
        return True

    @property
    def num_requests(self) -> int:
        return self.model.num_running + self.model.num_waiting

    @property
    def cost(self) -> None:
        return None  # the truth has no prediction to make

    @property
    def ongoing_decode_tokens(self) -> int:
        return self.state.ongoing_decode_tokens

    @property
    def pending_prefill_tokens(self) -> int:
        self._sync()
        running = sum(r.prefill_left for r in self.model.prefilling)
        return running + self._queued_prefill

    def estimate_cache_hit(self, blocks: Sequence[int], tokens: bytes | None = None) -> int:
        self._sync()
        cached = self.model.cached_prefix_blocks(blocks)
        queued = len(list(takewhile(self._queued_blocks.__contains__, blocks)))
        return max(cached, queued) * BLOCK_TOKENS

    def queue(self, request: SimRequest) -> None:
        """``request`` is about to be submitted to this model: count its uncached tokens."""
        hit = min(self.estimate_cache_hit(request.blocks), request.input_length)
        uncached = request.input_length - hit
        self._queued.append((request, uncached))
        self._queued_prefill += uncached
        counts = self._queued_blocks
        for block in request.blocks:
            counts[block] = counts.get(block, 0) + 1

    def _sync(self) -> None:
        """Forget queued requests the model has admitted (its waiting queue is FIFO)."""
        queued, waiting = self._queued, self.model.waiting
        head = waiting[0] if waiting else None
        counts = self._queued_blocks
        while queued and queued[0][0] is not head:
            request, uncached = queued.popleft()
            self._queued_prefill -= uncached
            for block in request.blocks:
                left = counts[block] - 1
                if left:
                    counts[block] = left
                else:
                    del counts[block]


class OraclePicker(LMetricPicker):
    """LMetric (4-key tie-break) over :class:`TruthView` s; simulator only."""

    name = ORACLE

    def truth_views(
        self, states: Sequence[WorkerState], models: Sequence[WorkerModel]
    ) -> list[TruthView]:
        return [TruthView(s, m) for s, m in zip(states, models, strict=True)]
