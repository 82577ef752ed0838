"""How a picker settles exact ties among equally good workers (seed 002).

Two named rules, chosen per picker with ``tie_break=``:

``"first"``
    The seed's Python ``min()``: the first worker (lowest index) with the best primary key
    wins. Kept to reproduce the B3 runs, where it caused *unintentional stickiness*: with
    every worker idle, every tie lands on worker 0.
``"multikey"``
    The seed's unified 4-key rule: compare secondary keys (for LMetric: ``new_prefill``,
    then ``num_requests``), then go round-robin among workers still exactly tied. An idle
    fleet thus still prefers the warm cache (smaller ``new_prefill``) and spreads cold
    traffic instead of pinning worker 0.
"""

from __future__ import annotations

from typing import Final, Literal

TieBreak = Literal["first", "multikey"]

FIRST: Final = "first"
MULTIKEY: Final = "multikey"
TIE_BREAKS: Final[tuple[str, ...]] = (FIRST, MULTIKEY)


def check_tie_break(value: str) -> TieBreak:
    """Validate a tie-break name early, with the valid names in the error."""
    if value not in TIE_BREAKS:
        raise ValueError(f"unknown tie_break {value!r}; choose one of {', '.join(TIE_BREAKS)}")
    return value  # type: ignore[return-value]


class RoundRobinCounter:
    """The seed's ``_rr_counter``: advances only when it actually settles a tie."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def choose(self, tied: list[int]) -> int:
        """Pick one of ``tied`` (worker indices in order) and advance the counter."""
        winner = tied[self.count % len(tied)]
        self.count += 1
        return winner
