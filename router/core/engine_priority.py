"""The priority the router gives a request for the engine's own queue (vLLM's and SGLang's
priority scheduling), so a worker's short prefills do not wait behind its long ones.

A worker with ``--scheduling-policy priority`` (vLLM) takes its waiting requests by
``(priority, arrival)``, lower first. The router knows what no engine does before admitting a
request: how much of the prompt the chosen worker holds, hence the prefill it still needs.
The priority is that prefill's predicted seconds (the cost model's, on the chosen worker)
plus ``AGING_PER_S`` of each second of the request's send time, in milliseconds: a request
goes ahead of an earlier one when its prefill is shorter by more than that share of the
time between them, so a long prompt waits behind shorter ones sent at most ``1 / AGING_PER_S``
times its own prefill later, never indefinitely. A client's own ``priority`` (vLLM's field)
stays the major key: each of its steps is worth ``CLIENT_BAND`` of the router's.

Only pickers that say so order the engine (``orders_engine``; the ttft picker): the peer
re-implementations route as their projects ship, which set no priority.
"""

from __future__ import annotations

from router.cache.worker_state import Booking

AGING_PER_S = 0.05
"""Seconds of own prefill one second of arrival time is worth in the key."""
CLIENT_BAND = 10**15
"""The router's keys in milliseconds stay below this for a wall clock of 2 x 10^13 s."""


def orders_engine(picker: object) -> bool:
    """Whether ``picker``'s router sets the engines' request priorities."""
    return bool(getattr(picker, "orders_engine", False))


def engine_priority(
    booking: Booking, sent_s: float, client: int = 0, after: int | None = None
) -> int:
    """The engine priority (lower first) of the request ``booking`` placed, sent at
    ``sent_s`` (any clock the router's replicas share; the wall clock live), at least
    ``after`` (the key of the request held or queued there whose prefill computes this
    one's cached prefix: :mod:`router.core.prefix_owners`); the worker's cost model is told,
    so it predicts the request's TTFT in the engine's order."""
    cost, cached = booking.worker.cost, booking.input_length - booking.new_prefill
    own = cost.prefill_s(booking.new_prefill, cached)
    key = client * CLIENT_BAND + round((float(sent_s) * AGING_PER_S + own) * 1000)
    if after is not None and after > key:
        key = after
    if booking.cost_entry is not None:
        cost.order(booking.cost_entry, key, cached, booking.booked_at)
    return key
