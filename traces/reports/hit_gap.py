"""The hit gap in ``simulate``'s report: each policy's ``hit_gap`` in results.json and a table.

results.json: every policy gets ``hit_gap`` (:meth:`traces.sim.hit_gap.HitGap.as_dict`: prompt
tokens and each as a ``*_rate`` fraction of them) when its run recorded block states. The
table shows them in points of prompt tokens: the hit rate, the ceiling, the gap and its parts
(``hit + parts - beyond ceiling = ceiling``), then the pooled LRU's hit rate and the
duplicated and recomputed work, which are outside that sum. ``capacity`` reads the gap at each
evaluated load as flat metrics (:func:`traces.sim.hit_gap.gap_metrics`) and shows it at each
policy's capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Gap(Protocol):
    """A policy's hit gap as the simulator measures it (traces/sim/hit_gap.py's HitGap)."""

    def as_dict(self) -> dict[str, float | int]: ...


COLUMNS: tuple[tuple[str, str], ...] = (
    # HitGap field (as a *_rate), header
    ("hit", "hit rate"),
    ("ceiling", "ceiling"),
    ("gap", "gap"),
    ("elsewhere", "elsewhere"),
    ("prefilling", "in flight: prefilling"),
    ("queued", "in flight: queued"),
    ("evicted_lru", "evicted: LRU too"),
    ("evicted_split", "evicted: split"),
    ("residual", "residual"),
    ("beyond_ceiling", "beyond ceiling"),
    ("pooled_lru", "pooled LRU"),
    ("duplicated", "duplicated"),
    ("recomputed", "recomputed"),
)


def add_hit_gap(document: dict[str, Any], gaps: Mapping[str, Gap]) -> None:
    """Each policy's gap (``gaps``, by policy name) as its entry's ``hit_gap``."""
    for name, gap in gaps.items():
        document["policies"][name]["hit_gap"] = gap.as_dict()


def hit_gap_table(document: Mapping[str, Any]) -> str:
    """One row per policy with a ``hit_gap``, in points of prompt tokens; "" if none."""
    rows = [
        "| policy | " + " | ".join(h for _, h in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name, entry in document["policies"].items():
        gap = entry.get("hit_gap")
        if gap is not None:
            cells = (f"{100 * gap[f'{key}_rate']:.2f}" for key, _ in COLUMNS)
            rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows) if len(rows) > 2 else ""


def hit_gap_note() -> str:
    """How to read the table (traces/sim/hit_gap.py defines each part)."""
    return (
        "hit gap, points of prompt tokens: hit rate + elsewhere + in flight + evicted + "
        "residual - beyond ceiling = ceiling (Belady on the pooled KV); elsewhere: the prefix "
        "sat on another worker; in flight: it was being prefilled on another worker, or its "
        "request still queued; evicted: gone from every worker, 'LRU too' where one pooled LRU "
        "of the same KV loses it as well (Belady's foresight), 'split' where it keeps it; "
        "duplicated / recomputed: prompt tokens computed while another worker held them / "
        "that some worker had computed before (outside the sum)"
    )


GAP_METRICS = ("gap", "elsewhere", "in_flight", "evicted")
"""The gap's metrics per evaluated load in ``capacity`` (``gap_*``, fractions of prompt tokens,
:func:`traces.sim.hit_gap.gap_metrics`): the gap, the prefix elsewhere, in flight (prefilling or
queued), evicted (both kinds); the residual and beyond ceiling are the rest."""
