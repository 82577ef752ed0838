"""What the flow-control tests of ``serve`` and the EPP share: one router configuration and
one prompt shape, so both front ends are tested against the same saturation point."""

from __future__ import annotations

FLOW = {
    "flow_control": True,
    "prefill_tokens_per_s": 500.0,  # slow workers, on the flat prior (a profile ignores it)
    "cost_profile": "flat",
    "flow_target_ttft_s": 2.5,
    "correct_shadow": False,
}


def flow_prompt(tag: str) -> str:
    """4000 bytes, a distinct first block: ~1000 tokens, nothing cached for the others."""
    return tag.ljust(16, "-") + "x" * 3984
