"""A disaggregated request's KV transfer, prefill worker to decode worker: its cost, its options.

One model for the offline simulator (:class:`traces.sim.config.SimConfig`) and the sim worker
(:class:`traces.sim_worker.pd.PdConfig`), which both carry the three fields below:
``kv_transfer_latency_s + tokens * kv_bytes_per_token / (kv_transfer_gbps * 1e9)`` seconds for
the prompt tokens the decode worker does not hold. Defaults: 2 ms, 25 GB/s (an RDMA link) and
128 KiB a token (an 8B model: 32 layers x 8 KV heads x 128 x 2 x bf16).
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

from router.validation import BYTES, MILLISECONDS_OR_OFF, POSITIVE

LATENCY_S = 0.002
GBPS = 25.0
BYTES_PER_TOKEN = 131_072


class TransferModel(Protocol):
    kv_transfer_latency_s: float
    kv_transfer_gbps: float  # GB/s (1e9 bytes)
    kv_bytes_per_token: int  # all layers


def check(model: TransferModel) -> None:
    """ValueError for a negative latency or size, or a bandwidth that is not positive."""
    if model.kv_transfer_latency_s < 0 or model.kv_bytes_per_token < 0:
        raise ValueError("the KV transfer's latency and bytes per token must be >= 0")
    if not model.kv_transfer_gbps > 0:
        raise ValueError("the KV transfer's bandwidth must be > 0")


def seconds(model: TransferModel, tokens: int) -> float:
    """Seconds to move ``tokens`` tokens' KV (model time)."""
    size = tokens * model.kv_bytes_per_token
    return model.kv_transfer_latency_s + size / (model.kv_transfer_gbps * 1e9)


def add_options(p: Any, defaults: TransferModel, scaled: str = "") -> None:
    """``--kv-transfer-latency-ms``, ``--kv-transfer-gbps``, ``--kv-bytes-per-token`` on ``p``
    (a parser or an argument group); ``scaled``: a note on the clock they run on."""
    p.add_argument(
        "--kv-transfer-latency-ms",
        type=MILLISECONDS_OR_OFF,
        default=defaults.kv_transfer_latency_s * 1000,
        help=f"fixed cost of one prefill-to-decode KV transfer{scaled}",
    )
    p.add_argument(
        "--kv-transfer-gbps",
        type=POSITIVE,
        default=defaults.kv_transfer_gbps,
        help=f"KV transfer bandwidth, GB/s (1e9 bytes){scaled}",
    )
    p.add_argument(
        "--kv-bytes-per-token",
        type=BYTES,
        default=defaults.kv_bytes_per_token,
        help="KV bytes of one prompt token, all layers (default: an 8B model); a transfer moves "
        "only the tokens the decode worker has not cached itself",
    )


def from_args(args: argparse.Namespace, defaults: TransferModel) -> dict[str, Any]:
    """The three fields from parsed options (the defaults' where an option is absent)."""
    return {
        "kv_transfer_latency_s": getattr(
            args, "kv_transfer_latency_ms", defaults.kv_transfer_latency_s * 1000
        )
        / 1000,
        "kv_transfer_gbps": getattr(args, "kv_transfer_gbps", defaults.kv_transfer_gbps),
        "kv_bytes_per_token": getattr(args, "kv_bytes_per_token", defaults.kv_bytes_per_token),
    }
