"""The router's decisions on its workers' states, free of I/O and of the clock.

Choose (the picker's pick among the views, its branch counted), book, learn from the worker's
report (its cached tokens scored against the estimates, the shadow's capacity corrected while
it is a guess) and release: :class:`Placement` is the one implementation of these steps.
``serve`` and the EPP reach it through :class:`router.core.routing.RouterCore` and
:class:`router.fleet.pool.WorkerPool` (the pool's ``placement``); the offline simulator
(:class:`traces.sim.simulator.Simulation`) holds one per fleet side and calls the same methods in
virtual time (``now``). What stays with each front end is how a request's bytes move and when
its events happen (a socket's bytes, a worker model's steps), not what the router decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.base import Pick, Picker, RequestFeatures
from router.cache.feedback import correct_shadow
from router.cache.worker_state import Booking, WorkerState


class Placement:
    """Choose, book, report and release on one fleet's states.

    ``decisions``: the picks by branch (the pool's ``decisions`` counter, a simulated run's
    ``branches``), counted by :meth:`choose` and :meth:`count`."""

    __slots__ = ("decisions",)

    def __init__(self, decisions: dict[str, int] | None = None) -> None:
        self.decisions = decisions if decisions is not None else {}

    def choose(self, picker: Picker, features: RequestFeatures, views: Sequence[Any]) -> Pick:
        """``picker``'s worker for ``features`` among ``views`` (indices into them); its
        branch counted. Raises what the picker raises (no healthy worker)."""
        pick = picker.pick(features, views)
        decisions = self.decisions
        decisions[pick.branch] = decisions.get(pick.branch, 0) + 1
        return pick

    def count(self, pick: Pick) -> None:
        """Count a pick made without the picker (a stored response's owner)."""
        decisions = self.decisions
        decisions[pick.branch] = decisions.get(pick.branch, 0) + 1

    # The steps on a booking are the state's and the booking's own methods, named here so
    # that every front end reaches them through one object (no wrapper frame on the hot
    # path: these run once or twice per proxied request).

    book = staticmethod(WorkerState.book)
    """``book(state, features, expected_output, now=None, radix_later=False)``: book
    ``features`` on ``state`` (load, pinned blocks, the estimates it is picked on); ``now``:
    the monotonic clock by default."""

    first_token = staticmethod(Booking.first_token)
    """``first_token(booking, now=None)``: the worker's first token; the booking's prefill
    is released."""

    report = staticmethod(Booking.report_cached)
    """``report(booking, reported, cpu_reported=None)``: the worker's cached prompt tokens
    (router tokens; ``cpu_reported`` those from its CPU tier, where it says) scored against
    the estimates the request was booked on; a clean one also teaches the worker's prefill
    rate and cost model."""

    correct = staticmethod(correct_shadow)
    """``correct(booking, reported, capacity_blocks, capacity_tokens) -> Correction``: the
    shadows' capacities adapted to the worker's report, within their configured
    ``capacity_blocks`` and the radix tree's ``capacity_tokens``
    (:func:`router.cache.feedback.correct_shadow`), while the capacity is a guess."""

    release = staticmethod(Booking.finish)
    """``release(booking) -> bool``: release everything the booking holds; True the first
    time only."""
