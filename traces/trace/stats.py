"""Summary statistics of a trace, and the infinite-cache hit ceiling.

The **hit ceiling** is the prefix-cache hit ratio of one cache that never evicts, cold at the
start: for each request in arrival order, its hit is the number of leading block keys seen in
any earlier request. We report it two ways:

- ``hit_ceiling`` (the headline): hit blocks / total blocks. Equivalently hit tokens over input
  tokens rounded up to whole blocks. This is the team's reference figure: 36.6% for Mooncake's
  ``conversation_trace.jsonl``.
- ``hit_ceiling_tokens``: ``min(hit blocks × 512, input_length)`` summed over input tokens.
  37.4% on the same trace: each request's partial last block counts as a whole block in the
  numerator when hit but only as its real tokens in the denominator.

Formats whose keys cover only full blocks (Weka, Bailian) give block ratios over full blocks.
A trace without block keys (Azure) has no ceiling (``None``).

Percentiles are nearest-rank (the value at rank ``ceil(p/100 × n)``), so every reported value
is a value of the data, as in ``bench/trace_stats.py`` and seed 002.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from traces.trace.record import BLOCK_TOKENS, TraceRequest

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class HitCeiling:
    """Hits of an infinite, never-evicting prefix cache over a whole trace."""

    hit_blocks: int
    total_blocks: int
    hit_tokens: int
    total_tokens: int

    @property
    def block_ratio(self) -> float | None:
        return self.hit_blocks / self.total_blocks if self.total_blocks else None

    @property
    def token_ratio(self) -> float | None:
        if not self.total_blocks or not self.total_tokens:
            return None
        return self.hit_tokens / self.total_tokens


def hit_ceiling(requests: Sequence[TraceRequest]) -> HitCeiling:
    """The infinite-cache hit ceiling of requests given in arrival order."""
    seen: set[int] = set()
    hit_blocks = total_blocks = hit_tokens = total_tokens = 0
    for req in requests:
        hits = 0
        for key in req.blocks:
            if key not in seen:
                break
            hits += 1
        hit_blocks += hits
        total_blocks += len(req.blocks)
        hit_tokens += min(hits * BLOCK_TOKENS, req.input_length)
        total_tokens += req.input_length
        seen.update(req.blocks)
    return HitCeiling(hit_blocks, total_blocks, hit_tokens, total_tokens)


def distribution(values: Sequence[int] | np.ndarray) -> dict[str, float]:
    """mean, nearest-rank p50/p90/p99 and max of ``values`` ({} when empty)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return {}
    out: dict[str, float] = {"mean": round(float(arr.mean()), 2)}
    for p in PERCENTILES:
        out[f"p{p}"] = _plain(np.percentile(arr, p, method="inverted_cdf"))
    out["max"] = _plain(arr.max())
    return out


def trace_stats(requests: Sequence[TraceRequest]) -> dict:
    """Requests, span, lengths, sessions, turns per session and the hit ceiling."""
    n = len(requests)
    span = max((r.arrival for r in requests), default=0.0) - min(
        (r.arrival for r in requests), default=0.0
    )
    turns = Counter(r.session_id for r in requests)
    ceiling = hit_ceiling(requests)
    inputs = np.fromiter((r.input_length for r in requests), dtype=np.int64, count=n)
    return {
        "requests": n,
        "span_s": round(span, 3),
        "rate_rps": round(n / span, 3) if span > 0 else None,
        "input_length": distribution(inputs),
        "output_length": distribution([r.output_length for r in requests]),
        "total_input_tokens": int(inputs.sum()),
        "sessions": len(turns),
        "multi_turn_sessions": sum(1 for c in turns.values() if c > 1),
        "turns_per_session": distribution(list(turns.values())),
        "blocks": ceiling.total_blocks,
        "hit_blocks": ceiling.hit_blocks,
        "hit_ceiling": _round(ceiling.block_ratio),
        "hit_ceiling_tokens": _round(ceiling.token_ratio),
    }


def format_stats(stats: dict, title: str = "") -> str:
    """Human-readable summary of :func:`trace_stats`."""
    lines = [title] if title else []
    rate = f" ({stats['rate_rps']:,.2f} req/s)" if stats["rate_rps"] else ""
    lines.append(f"requests      {stats['requests']:,} over {stats['span_s']:,.1f} s{rate}")
    for name in ("input_length", "output_length"):
        lines.append(f"{name:<14}{_dist(stats[name])}")
    lines.append(
        f"sessions      {stats['sessions']:,} ({stats['multi_turn_sessions']:,} multi-turn)"
    )
    lines.append(f"turns/session {_dist(stats['turns_per_session'])}")
    if stats["hit_ceiling"] is None:
        lines.append("hit ceiling   n/a (no block keys)")
    else:
        lines.append(
            f"hit ceiling   {stats['hit_ceiling']:.1%} of {stats['blocks']:,} blocks"
            f" ({stats['hit_ceiling_tokens']:.1%} of input tokens)"
        )
    return "\n".join(lines)


def _dist(d: dict) -> str:
    if not d:
        return "-"
    return "  ".join(f"{k} {v:,.0f}" if k != "mean" else f"mean {v:,.1f}" for k, v in d.items())


def _plain(x: np.generic) -> float:
    value = x.item()
    return int(value) if float(value).is_integer() else value


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
