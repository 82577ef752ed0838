"""The picker contract: what each picker reads, checked once against its views."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import policies
from policies.base import CAPABILITIES, RequestFeatures, check_views
from policies.registry import PICKER_NAMES, PICKERS, make_picker
from router.cache.block_lru import BlockLRU
from router.cache.worker_state import WorkerState


@dataclass
class CoreView:
    """The core members alone (:class:`policies.base.WorkerView`), no capability."""

    healthy: bool = True
    num_requests: int = 0
    pending_prefill_tokens: int = 0
    ongoing_decode_tokens: int = 0
    held_tokens: int = 0
    kv_capacity_tokens: int = 1 << 20
    cost: None = None

    def estimate_cache_hit(self, blocks, tokens=None) -> int:
        return 0


def _state(name: str) -> WorkerState:
    return WorkerState(name=name, blocks=BlockLRU(64, 512))


@pytest.mark.parametrize("name", PICKER_NAMES)
def test_every_picker_names_what_it_reads_and_the_router_state_offers_it(name, worker):
    needs = PICKERS[name].needs
    assert all(cap in CAPABILITIES for cap in needs)
    picker = make_picker(name)
    check_views(picker, [_state("a"), _state("b")])  # the pool's and the simulator's views
    check_views(picker, [worker()])  # a test double: every capability, neutral
    pick = picker.pick(RequestFeatures([1, 2], 1024, "s"), [_state("a"), _state("b")])
    assert pick.worker in (0, 1)


@pytest.mark.parametrize("name", PICKER_NAMES)
def test_a_view_without_a_capability_is_refused_once_by_the_pickers_that_read_it(name):
    picker = make_picker(name)
    needs = [cap.__name__ for cap in PICKERS[name].needs]
    if not needs:
        check_views(picker, [CoreView()])  # the core view is enough
        return
    with pytest.raises(TypeError) as refused:
        check_views(picker, [CoreView()])
    assert all(cap in str(refused.value) for cap in needs) and "CoreView" in str(refused.value)


def test_the_ttft_picker_reads_each_capability_it_names(worker):
    """Drop any one capability's members and ttft's check refuses the view."""
    picker = make_picker("ttft")
    for cap in PICKERS["ttft"].needs:
        view = CoreView()
        for other in PICKERS["ttft"].needs:
            if other is not cap:
                for member in _members(other):
                    setattr(view, member, getattr(worker(), member))
        with pytest.raises(TypeError, match=cap.__name__):
            check_views(picker, [view])


def _members(cap: type) -> list[str]:
    return [m for m in vars(cap) if not m.startswith("_") and m not in ("__init__",)]


def test_no_picker_probes_a_view_with_getattr():
    """The contract states what a picker reads: no ``getattr`` in policies/."""
    probes = []
    for path in sorted(Path(policies.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
                probes.append(f"{path.name}:{node.lineno}")
    assert probes == []
