"""Give a trace's sessions models: each session one model (a base model or a LoRA adapter),
chosen by a stable hash of its id, so every turn of a conversation names the same model and
the same trace always splits the same way (``cache-router trace models``); and, for flow
control, tenants and priorities the same way (:func:`assign_tenants`)."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from router.validation import POSITIVE
from traces.trace.record import TraceRequest


def parse_model_weights(specs: Sequence[str]) -> list[tuple[str, float]]:
    """``NAME`` or ``NAME:WEIGHT`` each (weight 1 by default), e.g. ``model-a:2 lora-0``."""
    out = []
    for spec in specs:
        name, _, weight = spec.partition(":")
        if not name:
            raise ValueError(f"{spec!r}: a model needs a name")
        try:  # a weight is held to the rule of every other weight (nan, inf refused)
            w = POSITIVE.parse(weight) if weight else 1.0
        except ValueError as exc:
            raise ValueError(f"{spec!r}: the weight after ':' {exc}") from None
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


def parse_tenant_weights(spec: str) -> list[float]:
    """``4:1``: two tenants, the first sending 4 times the second's sessions."""
    try:
        return [POSITIVE.parse(part) for part in spec.split(":")]
    except ValueError as exc:
        raise ValueError(
            f"{spec!r}: tenants are weights separated by ':' (e.g. 4:1): {exc}"
        ) from None


def tenant_name(k: int) -> str:
    return f"tenant-{k}"


def assign_tenants(
    trace: Sequence[TraceRequest],
    weights: Sequence[float],
    interactive_share: float = 0.0,
    interactive_priority: int = 1,
) -> list[TraceRequest]:
    """Copies of ``trace``'s requests, each session given a tenant (``tenant-0`` .. in
    slices of :func:`session_share` in proportion to ``weights``) and, for an
    ``interactive_share`` of the sessions (an independent stable hash), the priority
    ``interactive_priority`` (the others 0): every turn of a conversation alike."""
    if not 0.0 <= interactive_share <= 1.0:
        raise ValueError("interactive_share must be within [0, 1]")
    total = sum(weights)
    bounds, acc = [], 0.0
    for k, w in enumerate(weights):
        acc += w / total
        bounds.append((acc, tenant_name(k)))
    out = []
    for req in trace:
        share = session_share(req.session_id)
        tenant = next((name for bound, name in bounds if share < bound), bounds[-1][1])
        interactive = session_share(req.session_id + "/priority") < interactive_share
        priority = interactive_priority if interactive else 0
        out.append(dataclasses.replace(req, tenant=tenant, priority=priority))
    return out
