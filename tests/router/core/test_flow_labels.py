"""Flow control's labels: capped with ``other`` however many priorities and flows clients
send, the configured bands kept, and the queue's view under the same labels."""

from __future__ import annotations

from router.core.flow_labels import (
    BAND_LABELS_MAX,
    FLOW_LABELS_MAX,
    OTHER,
    PAIRS_MAX,
    FlowLabels,
    bounded_snapshot,
)
from router.core.flow_queue import FlowQueue, Waiting


def test_band_and_flow_labels_are_capped_with_other():
    labels = FlowLabels()
    bands = {labels.band(b) for b in range(1, 1000)}
    flows = {labels.flow(f"tenant-{i}") for i in range(1000)}
    assert len(bands) == BAND_LABELS_MAX and OTHER in bands
    assert len(flows) == FLOW_LABELS_MAX and OTHER in flows
    assert labels.band(0) == "0" and labels.flow("default") == "default"  # reserved
    assert labels.band(1) == "1" and labels.band(999) == OTHER  # first seen kept


def test_configured_bands_keep_their_label_whatever_clients_sent_first():
    labels = FlowLabels(reserved_bands=[5, -1])
    for b in range(100, 200):
        labels.band(b)
    assert labels.band(5) == "5" and labels.band(-1) == "-1" and labels.band(0) == "0"


def test_pairs_are_capped_under_their_band():
    labels = FlowLabels()
    pairs = {labels.pair(b % 20, f"t{i}") for i, b in enumerate(range(5000))}
    assert len(pairs) <= PAIRS_MAX + BAND_LABELS_MAX
    assert labels.pair(3, "a-new-tenant")[1] == OTHER


def test_the_queue_view_lists_at_most_the_caps():
    q = FlowQueue()
    for i in range(600):
        q.push(Waiting(i, f"t{i}", 10, 1, 0.0))
    view = bounded_snapshot(q, FlowLabels())
    assert view["queued"] == 600
    assert len(view["bands"]) == BAND_LABELS_MAX + 1 and list(view["bands"])[-1] == OTHER
    assert sum(b["queued"] for b in view["bands"].values()) == 600
    assert sum(b["bytes"] for b in view["bands"].values()) == 600
    flows = {f for b in view["bands"].values() for f in b["flows"]}
    assert len(flows) <= FLOW_LABELS_MAX + 1
