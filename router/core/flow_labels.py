"""Flow control's labels, bounded: any client picks its priority and its flow, so neither may
name a metric series or a view entry of its own without a cap.

- the ``band`` label: the bands of the configured objectives and 0 first, then the first
  bands seen, :data:`BAND_LABELS_MAX` in all; later ones count as ``other``;
- the ``flow`` label: ``default``, then the first flows seen, :data:`FLOW_LABELS_MAX` in all;
  later ones count as ``other``;
- a (band, flow) pair: the first :data:`PAIRS_MAX`; later pairs count under their band as
  flow ``other`` (the product of two capped labels is still thousands of series).

What one process exports is fixed once the caps fill: a scrape's size no longer grows with
the values clients send. :func:`bounded_snapshot` is the queue as ``/workers/flow`` and the
dashboard show it, under the same labels.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from router.core.flow_queue import DEFAULT_FLOW, FlowQueue

OTHER = "other"
BAND_LABELS_MAX = 32  # distinct band labels (then "other"): deployments use a handful
FLOW_LABELS_MAX = 100  # distinct flow labels (then "other")
PAIRS_MAX = 512  # distinct (band, flow) label pairs (then the band's "other" flow)


class BoundedLabels:
    """Values as labels: ``reserved`` ones always, then the first seen up to ``limit`` in
    all; any later value is ``other``."""

    def __init__(self, limit: int, reserved: Iterable[str] = ()) -> None:
        self.limit = limit
        self.known: set[str] = set(reserved)

    def __call__(self, value: str) -> str:
        known = self.known
        if value in known:
            return value
        if len(known) < self.limit:
            known.add(value)
            return value
        return OTHER


class FlowLabels:
    """The band, flow and pair labels of one flow control (see the module docstring)."""

    def __init__(self, reserved_bands: Iterable[int] = ()) -> None:
        self.band_of = BoundedLabels(BAND_LABELS_MAX, {"0", *(str(b) for b in reserved_bands)})
        self.flow_of = BoundedLabels(FLOW_LABELS_MAX, {DEFAULT_FLOW})
        self.pairs: set[tuple[str, str]] = set()

    def band(self, band: int) -> str:
        return self.band_of(str(band))

    def flow(self, flow: str) -> str:
        return self.flow_of(flow)

    def pair(self, band: int, flow: str) -> tuple[str, str]:
        """The (band, flow) labels of a request's counters."""
        key = (self.band(band), self.flow(flow))
        pairs = self.pairs
        if key in pairs:
            return key
        if len(pairs) < PAIRS_MAX:
            pairs.add(key)
            return key
        key = (key[0], OTHER)
        pairs.add(key)  # at most one a band label beyond the cap
        return key


def bounded_snapshot(queue: FlowQueue, labels: FlowLabels) -> dict[str, Any]:
    """Queued requests and bytes per band and flow label (higher bands first, ``other``
    last); a label that stands for several bands or flows sums their requests and bytes,
    and shows the least attained service among its flows (the next to go)."""
    bands: dict[str, dict[str, Any]] = {}
    order: dict[str, int] = {}
    for number in sorted(queue.bands, reverse=True):
        band = queue.bands[number]
        if not band.count:
            continue
        b_label = labels.band(number)
        order.setdefault(b_label, len(order))
        entry = bands.setdefault(b_label, {"queued": 0, "bytes": 0, "flows": {}})
        entry["queued"] += band.count
        entry["bytes"] += band.bytes
        flows = entry["flows"]
        for name, f in band.flows.items():
            f_label = labels.pair(number, name)[1]
            attained = round(f.attained)
            seen = flows.get(f_label)
            if seen is None:
                flows[f_label] = {"queued": len(f.items), "attained_tokens": attained}
            else:
                seen["queued"] += len(f.items)
                seen["attained_tokens"] = min(seen["attained_tokens"], attained)
    ranked = sorted(bands, key=lambda b: (b == OTHER, order[b]))
    return {
        "queued": len(queue),
        "bands": {
            b: {**bands[b], "flows": dict(sorted(bands[b]["flows"].items()))} for b in ranked
        },
    }
