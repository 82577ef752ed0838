"""A fleet's capacity at a latency SLO: the highest load at which every SLO holds.

The search is a pure function of an ``evaluate(load) -> metrics`` callable (the simulator's,
a live sweep's, or a test's fake curve): a coarse geometric grid from ``start`` (up while the
SLOs hold, down while they fail), one or more grid points above the first failure (to see
whether they hold again), then bisection (geometric) between the highest load that holds
below the first failure and that failure, until the two are within ``tolerance``. Then
(``verify``, the default) the grid step below the capacity (``capacity / factor`` up to it)
is filled in, evenly, until no two evaluated loads there are more than ``tolerance`` apart:
a tail percentile near a knee can fail at a load between two that hold (a burst that lands
differently), which bisection alone steps over; a failure found there is the new first
failure and the search goes on below it.

Capacity is the last load where the SLOs hold below the lowest load where they fail. A
latency percentile need not be monotone in load (a burst that lands differently, a policy
that switches regime); when a load above the first failure holds again the result says so
(``monotone`` False, ``holds_again`` that load) rather than hiding either number.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from router.validation import SECONDS

Metrics = Mapping[str, float]
METRICS = ("ttft", "e2e", "tpot")  # what an SLO may bound, each at any percentile


@dataclass(frozen=True)
class SLO:
    """``metric``'s ``percentile`` at most ``seconds`` (``ttft_p90=2``)."""

    metric: str
    percentile: float
    seconds: float

    @property
    def key(self) -> str:
        """The metrics' key it reads, e.g. ``ttft_p90`` (``ttft_p99.9`` for 99.9)."""
        return f"{self.metric}_p{self.percentile:g}"

    def holds(self, metrics: Metrics) -> bool:
        value = metrics.get(self.key)
        return value is not None and not math.isnan(value) and value <= self.seconds

    def __str__(self) -> str:
        return f"{self.key}={self.seconds:g}"


_SLO = re.compile(r"^(?P<metric>[a-z0-9]+)_p(?P<pct>\d+(?:\.\d+)?)=(?P<seconds>[0-9.eE+-]+)$")


def parse_slo(text: str) -> SLO:
    """``METRIC_pQ=SECONDS``, e.g. ``ttft_p90=2``, ``e2e_p99=30``; a ``ValueError`` if not."""
    m = _SLO.match(text.strip())
    if m is None or m["metric"] not in METRICS:
        raise ValueError(
            f"bad SLO {text!r}: want METRIC_pQ=SECONDS with METRIC one of {', '.join(METRICS)}"
        )
    pct = float(m["pct"])
    if not 0 < pct <= 100:
        raise ValueError(f"bad SLO {text!r}: percentile in (0, 100]")
    try:  # the seconds any other duration flag takes
        seconds = SECONDS.parse(m["seconds"])
    except ValueError as exc:
        raise ValueError(f"bad SLO {text!r}: seconds {exc}") from None
    return SLO(m["metric"], pct, seconds)


def slos_hold(slos: Sequence[SLO], metrics: Metrics) -> bool:
    return all(slo.holds(metrics) for slo in slos)


@dataclass(frozen=True)
class Grid:
    """Where and how finely to search (loads are trace speedups)."""

    start: float = 1.0
    factor: float = 1.5  # the coarse grid's step (geometric)
    min_load: float = 1.0 / 1.5**8  # the grid goes no lower...
    max_load: float = 64.0  # ...and no higher
    tolerance: float = 0.03  # bisect until first failure / capacity <= 1 + tolerance
    above: int = 1  # grid points evaluated above the first failure (monotonicity check)
    verify: bool = True  # fill in the grid step below the capacity (module docstring)

    def __post_init__(self) -> None:
        if not (self.factor > 1 and self.tolerance > 0 and self.above >= 0):
            raise ValueError("need factor > 1, tolerance > 0, above >= 0")
        if not 0 < self.min_load <= self.start <= self.max_load:
            raise ValueError("need 0 < min_load <= start <= max_load")


@dataclass(frozen=True)
class Point:
    """One evaluated load."""

    load: float
    holds: bool
    metrics: Metrics


@dataclass(frozen=True)
class Capacity:
    """The search's result; ``points`` in evaluation order."""

    capacity: float | None  # last load that holds below first_fail (None: none held)
    first_fail: float | None  # the lowest load that fails (None: none failed)
    holds_again: float | None  # the highest load above first_fail that holds (None: none)
    points: tuple[Point, ...] = field(default=())

    @property
    def monotone(self) -> bool:
        return self.holds_again is None

    @property
    def censored(self) -> bool:
        """No load failed: the capacity is at least the highest load tried."""
        return self.first_fail is None and self.capacity is not None

    def at(self, load: float | None) -> Point | None:
        """The point evaluated at ``load``."""
        return next((p for p in self.points if p.load == load), None)

    def curve(self) -> list[Point]:
        """Every evaluated point, by load."""
        return sorted(self.points, key=lambda p: p.load)


def summarize(points: Sequence[Point]) -> Capacity:
    """Capacity, first failure and any load that holds above it, from evaluated points."""
    fails = [p.load for p in points if not p.holds]
    first_fail = min(fails, default=None)
    holds = [p.load for p in points if p.holds]
    below = [x for x in holds if first_fail is None or x < first_fail]
    above = [x for x in holds if first_fail is not None and x > first_fail]
    return Capacity(max(below, default=None), first_fail, max(above, default=None), tuple(points))


def search_capacity(
    evaluate: Callable[[float], Metrics],
    holds: Callable[[Metrics], bool],
    grid: Grid | None = None,
    on_point: Callable[[Point], None] | None = None,
    flat: Callable[[Metrics, Metrics], bool] | None = None,
    max_probes: int = 60,
) -> Capacity:
    """The capacity of whatever ``evaluate`` measures, ``holds`` judging each load's metrics
    (module docstring). ``on_point`` sees each point as it is evaluated (progress);
    ``flat(higher, lower)``, when given, stops the way down once a lower load's metrics are
    no better (queueing is not what breaks the SLO: no lower load will meet it)."""
    grid = grid or Grid()
    points: list[Point] = []

    def probe(load: float) -> Point:
        for p in points:  # a grid point reached twice (up, then down) is not run again
            if math.isclose(p.load, load, rel_tol=1e-9):
                return p
        metrics = evaluate(load)
        point = Point(load, holds(metrics), metrics)
        points.append(point)
        if on_point is not None:
            on_point(point)
        return point

    load = grid.start
    previous = probe(load)
    if previous.holds:  # up the grid until a load fails or the top is reached
        while load < grid.max_load:
            load = min(load * grid.factor, grid.max_load)
            if not probe(load).holds:
                break
    else:  # down until a load holds, the bottom is reached or the metrics stop improving
        while load > grid.min_load:
            load = max(load / grid.factor, grid.min_load)
            point = probe(load)
            if point.holds or (flat is not None and flat(previous.metrics, point.metrics)):
                break
            previous = point
    result = summarize(points)
    if result.first_fail is not None:
        load = result.first_fail
        for _ in range(grid.above):
            if load >= grid.max_load:
                break
            load = min(load * grid.factor, grid.max_load)
            probe(load)
    filled = False  # the fill-in has run: a failure it found may leave nothing held below
    for _ in range(max_probes):
        result = summarize(points)
        low, high = result.capacity, result.first_fail
        if low is None and filled and high is not None and high > grid.min_load:
            probe(max(high / grid.factor, grid.min_load))  # down the grid again
            continue
        if low is None or high is None:
            break
        if high > low * (1 + grid.tolerance):
            probe(math.sqrt(low * high))
        elif not grid.verify or not _fill_below(low, grid, points, probe):
            break
        else:
            filled = True
    return summarize(points)


def _fill_below(
    capacity: float, grid: Grid, points: Sequence[Point], probe: Callable[[float], Point]
) -> bool:
    """Evaluate one more load in the grid step below ``capacity``: its bottom when nothing
    was evaluated within ``tolerance`` above it, else, in the widest gap between evaluated
    loads there when it is wider than ``tolerance``, the first of the fewest evenly spaced
    loads that close it; False when there is none."""
    bottom = max(capacity / grid.factor, grid.min_load)
    loads = sorted({p.load for p in points if bottom <= p.load <= capacity})
    if loads[0] > bottom * (1 + grid.tolerance):
        probe(bottom)
        return True
    ratio, low = max(((high / low, low) for low, high in pairwise(loads)), default=(1.0, 0.0))
    if ratio <= 1 + grid.tolerance:
        return False
    probe(low * ratio ** (1 / math.ceil(math.log(ratio) / math.log1p(grid.tolerance))))
    return True
