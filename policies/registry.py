"""Pickers by name: ``make_picker("unified", overload_factor=3.0)``.

One place maps the names used on the command line, in configs and in metric labels to the
picker classes, so the proxy and the simulator build pickers the same way. Parameters are
the picker's keyword arguments (each documented, with its default, in its module);
an unknown name or parameter is a ``ValueError`` that lists what is valid.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from policies.aibrix import AIBrixPicker
from policies.base import Picker
from policies.capped import CappedPicker
from policies.decode_load import DecodeLoadPicker
from policies.dynamo import DynamoPicker
from policies.llmd import LLMDPicker
from policies.llmd_precise import LLMDPrecisePicker
from policies.lmetric import LMetricPicker
from policies.load_only import LoadOnlyPicker
from policies.power_of_two import PowerOfTwoPicker
from policies.random_choice import RandomPicker
from policies.round_robin import RoundRobinPicker
from policies.sglang_cache_aware import SGLangCacheAwarePicker
from policies.smg import SMGCacheAwarePicker
from policies.sticky import StickyPicker
from policies.tiered import TieredPicker
from policies.ttft import TTFTPicker
from policies.unified import UnifiedPicker
from policies.vllm_router import VLLMRouterCacheAwarePicker

PICKERS: dict[str, Callable[..., Picker]] = {
    cls.name: cls
    for cls in (
        TTFTPicker,
        LMetricPicker,
        LoadOnlyPicker,
        StickyPicker,
        UnifiedPicker,
        CappedPicker,
        RoundRobinPicker,
        RandomPicker,
        PowerOfTwoPicker,
        SGLangCacheAwarePicker,
        DecodeLoadPicker,
        LLMDPicker,
        LLMDPrecisePicker,
        DynamoPicker,
        SMGCacheAwarePicker,
        AIBrixPicker,
        TieredPicker,
        VLLMRouterCacheAwarePicker,
    )
}

PICKER_NAMES: tuple[str, ...] = tuple(PICKERS)


def picker_params(name: str) -> dict[str, Any]:
    """The parameters a picker accepts and their defaults."""
    cls = _lookup(name)
    return {p.name: p.default for p in inspect.signature(cls).parameters.values()}


def make_picker(name: str, **params: Any) -> Picker:
    """A fresh picker (with its own state) for ``name``, configured by ``params``."""
    cls = _lookup(name)
    valid = picker_params(name)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        accepted = ", ".join(valid) or "none"
        raise ValueError(f"picker {name!r} got unknown parameter(s) {unknown}; accepts: {accepted}")
    return cls(**params)


def _lookup(name: str) -> Callable[..., Picker]:
    try:
        return PICKERS[name]
    except KeyError:
        raise ValueError(
            f"unknown picker {name!r}; choose one of {', '.join(PICKER_NAMES)}"
        ) from None
