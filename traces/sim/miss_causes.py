"""Where each prompt block a request did not find on its worker was, fleet-wide, at that moment.

The simulator's worker models decide a request's prefix hit at its *admission* (a step
boundary of its worker, after any queueing): the radix tree's match, then the CPU tier's
(:mod:`traces.sim.worker_model`), and the whole prompt's blocks enter that worker's tree at once,
before its prefill runs. A :class:`FleetLedger` watches every model (``WorkerModel.observer``)
and, at each admission, gives each block of the prompt past the hit one state, the first
that applies:

- ``ELSEWHERE``: another worker holds it (its GPU tree, or its CPU tier) and has finished
  the prefill that brought it: the prefix is computed again on a second worker.
- ``PREFILLING``: another worker holds it, but only as a block of a request still
  prefilling there (admitted, first token not yet out): this request came while its prefix
  was still being computed, and computes it again here.
- ``EVICTED``: no worker holds it, but some worker cached it before: evicted everywhere (by
  the LRUs at the workers' real capacities). A block of the chosen worker's CPU tier behind
  a block that tier evicted counts here too (the eviction broke its prefix).
- ``QUEUED``: never cached anywhere yet, and another request carrying it waits in a worker's
  queue (sent, not admitted): in flight, not yet computed.
- ``NEW``: never cached anywhere, and no request carrying it waits on a worker: the fleet
  sees it first here (or whatever brought it earlier has not reached a worker: not sent yet
  under session pacing, in the router's flow-control queue, refused).

Blocks of the hit are ``HIT``; a request never admitted (refused by flow control) keeps
``UNSERVED`` for all its blocks. :mod:`traces.sim.hit_gap` sets these states against the hit
ceiling. Block keys are prefix-chained and a radix tree is prefix-closed, so "another worker
holds block i" is "i is below the longest prefix another worker's tree matches", one lookup
per worker per admission. Disaggregated fleets are not watched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.cache.block_hash import KEY_TOKENS, keys_as_tokens
from traces.sim.worker_model import SimRequest, WorkerModel
from traces.trace.record import TraceRequest

HIT, ELSEWHERE, PREFILLING, EVICTED, QUEUED, NEW, UNSERVED = range(7)
STATE_NAMES = ("hit", "elsewhere", "prefilling", "evicted", "queued", "new", "unserved")


class FleetLedger:
    """Records one state per prompt block of ``trace`` (flat, in trace order) as the
    simulator runs it on ``models`` (module docstring); requests are known by their tag, the
    trace index."""

    def __init__(self, trace: Sequence[TraceRequest], models: Sequence[WorkerModel]) -> None:
        counts = np.fromiter((len(r.blocks) for r in trace), dtype=np.int64, count=len(trace))
        self.starts = np.zeros(len(trace) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self.states = np.full(int(self.starts[-1]), UNSERVED, dtype=np.int8)
        self.models = list(models)
        self.cached_ever: set[int] = set()  # every block any worker has cached
        self.waiting: dict[int, int] = {}  # block -> submitted, not yet admitted requests
        # per worker: block -> its requests computing it whose prefill is not done
        self.computing: list[dict[int, int]] = [{} for _ in self.models]
        self.hits: dict[int, int] = {}  # tag -> hit blocks, while prefilling
        for w, model in enumerate(self.models):
            model.observer = _Tap(self, w)

    def submitted(self, req: SimRequest) -> None:
        waiting = self.waiting
        for b in req.blocks:
            waiting[b] = waiting.get(b, 0) + 1

    def admitted(self, w: int, req: SimRequest, hit_blocks: int) -> None:
        blocks = req.blocks
        waiting = self.waiting
        for b in blocks:
            left = waiting[b] - 1
            if left:
                waiting[b] = left
            else:
                del waiting[b]
        start = int(self.starts[req.tag])
        states = self.states
        states[start : start + hit_blocks] = HIT
        missed = blocks[hit_blocks:]
        if missed:
            states[start + hit_blocks : start + len(blocks)] = self._where(w, blocks, hit_blocks)
            computing = self.computing[w]
            for b in missed:
                computing[b] = computing.get(b, 0) + 1
            self.hits[req.tag] = hit_blocks
        self.cached_ever.update(blocks)

    def prefilled(self, w: int, req: SimRequest) -> None:
        hit_blocks = self.hits.pop(req.tag, None)
        if hit_blocks is None:
            return
        computing = self.computing[w]
        for b in req.blocks[hit_blocks:]:
            left = computing[b] - 1
            if left:
                computing[b] = left
            else:
                del computing[b]

    def _where(self, w: int, blocks: tuple[int, ...], hit_blocks: int) -> list[int]:
        """The states of ``blocks[hit_blocks:]``, worker ``w`` missing them (docstring)."""
        tokens = keys_as_tokens(blocks)
        held = []  # (prefix length, worker): the other workers' GPU trees past the hit
        for v, model in enumerate(self.models):
            if v != w:
                k = model.cache.prefix_length(tokens) // KEY_TOKENS
                if k > hit_blocks:
                    held.append((k, v))
        out = []
        reach = max((k for k, _ in held), default=hit_blocks)
        computing = self.computing
        for i in range(hit_blocks, reach):
            b = blocks[i]
            done = any(k > i and b not in computing[v] for k, v in held)
            out.append(ELSEWHERE if done else PREFILLING)
        cpus = [m.cpu for v, m in enumerate(self.models) if v != w and m.cpu is not None]
        cached_ever, waiting = self.cached_ever, self.waiting
        for b in blocks[reach:]:
            if cpus and any(b in cpu for cpu in cpus):
                out.append(ELSEWHERE)
            elif b in cached_ever:
                out.append(EVICTED)
            elif b in waiting:
                out.append(QUEUED)
            else:
                out.append(NEW)
        return out


class _Tap:
    """One worker model's observer: the ledger's calls with the worker's index."""

    __slots__ = ("ledger", "worker")

    def __init__(self, ledger: FleetLedger, worker: int) -> None:
        self.ledger = ledger
        self.worker = worker

    def submitted(self, req: SimRequest) -> None:
        self.ledger.submitted(req)

    def admitted(self, req: SimRequest, hit_blocks: int) -> None:
        self.ledger.admitted(self.worker, req, hit_blocks)

    def prefilled(self, req: SimRequest) -> None:
        self.ledger.prefilled(self.worker, req)
