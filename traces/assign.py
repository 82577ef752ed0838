"""Give a trace's sessions models: each session one model (a base model or a LoRA adapter),
chosen by a stable hash of its id, so every turn of a conversation names the same model and
the same trace always splits the same way (``cache-router trace models``)."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from traces.record import TraceRequest


def parse_model_weights(specs: Sequence[str]) -> list[tuple[str, float]]:
    """``NAME`` or ``NAME:WEIGHT`` each (weight 1 by default), e.g. ``model-a:2 lora-0``."""
    out = []
    for spec in specs:
        name, _, weight = spec.partition(":")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"{spec!r}: the weight after ':' must be a number") from None
        if not name or not w > 0:
            raise ValueError(f"{spec!r}: a model needs a name and a positive weight")
        out.append((name, w))
    if not out:
        raise ValueError("name at least one model")
    return out


def session_share(session_id: str) -> float:
    """A session's stable place in [0, 1): crc32 of its id."""
    return zlib.crc32(session_id.encode()) / 2**32


def assign_models(
    trace: Sequence[TraceRequest], models: Sequence[tuple[str, float]]
) -> list[TraceRequest]:
    """Copies of ``trace``'s requests, each naming its session's model: model ``k`` takes
    the sessions whose :func:`session_share` falls in its slice (slices in proportion to
    the weights)."""
    total = sum(w for _, w in models)
    bounds, acc = [], 0.0
    for name, w in models:
        acc += w / total
        bounds.append((acc, name))
    out = []
    for req in trace:
        share = session_share(req.session_id)
        model = next((name for bound, name in bounds if share < bound), bounds[-1][1])
        out.append(dataclasses.replace(req, model=model))
    return out
