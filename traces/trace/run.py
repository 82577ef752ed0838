"""A policy's run over a trace: every request's outcome, simulated or replayed live.

:class:`PolicyRun` is what the simulator (traces/sim/simulator.py) and a live replay
(traces/live/replay.py) both produce, and what the reports (traces/reports/) read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class PolicyRun:
    """Per-request outcomes of one policy over one trace (arrays indexed by request)."""

    name: str
    requests: int
    worker: np.ndarray
    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    output_length: np.ndarray
    input_length: np.ndarray
    cached: np.ndarray  # the worker's true cached prompt tokens (both tiers)
    estimated: np.ndarray  # the active estimate at booking (the KV index's when it answered)
    pick_us: np.ndarray
    branches: dict[str, int]
    inflight_t: np.ndarray  # sample times
    inflight: np.ndarray  # samples x workers: num_requests
    wall_seconds: float
    estimates: dict[str, np.ndarray] = field(default_factory=dict)  # per kind, nan: none
    lora_swaps: int = 0  # LoRA adapters the workers loaded (not resident when admitted)
    # disaggregated runs only (0 / None otherwise); ``worker``, ``cached`` and ``estimated``
    # are then the prefill side's, ``first_token`` and ``finish`` the decode worker's
    prefill_workers: int = 0
    decode_workers: int = 0
    decode_worker: np.ndarray | None = None  # index among the decode workers
    prefill_done: np.ndarray | None = None  # the prefill worker's first token
    transfer_s: np.ndarray | None = None
    transferred: np.ndarray | None = None  # prompt tokens whose KV crossed
    decode_branches: dict[str, int] = field(default_factory=dict)
    # tiered workers only: of ``cached``, the tokens loaded from the CPU tier, and the CPU
    # tier's estimate at booking (included in ``estimated``)
    cpu_cached: np.ndarray | None = None
    cpu_estimated: np.ndarray | None = None
    # flow control and goodput (None: the trace has no tenants or priorities and no flow
    # control ran): refused requests (no first token), each request's priority and tenant
    rejected: np.ndarray | None = None
    priority: np.ndarray | None = None
    tenant: np.ndarray | None = None
    slo_ttft_s: float = 2.0
    # SimConfig.hit_gap: each prompt block's state at its request's admission, flat in trace
    # order (traces/sim/miss_causes.py); None otherwise
    block_states: np.ndarray | None = None
    # requests refused as an engine refuses a prompt past its context (module docstring);
    # None: there were none
    too_long: np.ndarray | None = None
    # the router's predicted TTFT of each request (its cost model at booking, plus what it
    # had waited before: flow control's queue, the body's read), nan where none; None for a
    # disaggregated fleet
    predicted_ttft: np.ndarray | None = None

    def latencies(self) -> dict[str, np.ndarray]:
        """Each request's TTFT and end-to-end time, and the TPOT of those that decode."""
        decode_tokens = np.maximum(self.output_length - 1, 0)
        has_decode = decode_tokens > 0
        first, finish, arrival = self.first_token, self.finish, self.arrival
        if self.rejected is not None and self.rejected.any():  # served requests only
            served = ~self.rejected
            first, finish, arrival = first[served], finish[served], arrival[served]
            has_decode = has_decode[served]
            decode_tokens = decode_tokens[served]
        return {
            "ttft": first - arrival,
            "e2e": finish - arrival,
            "tpot": (finish - first)[has_decode] / decode_tokens[has_decode],
        }

    def goodput(self) -> dict[str, float | int]:
        """Requests meeting the TTFT SLO per second (of the run's span), overall, per
        priority and per tenant, each group's TTFT p90 (served requests) and the refused
        count; {} for a run without tenants, priorities or flow control."""
        if self.rejected is None:
            return {}
        served = ~self.rejected
        ttft = np.where(served, self.first_token - self.arrival, np.inf)
        good = served & (ttft <= self.slo_ttft_s)
        finish = self.finish[served]
        span = float(finish.max() - self.arrival.min()) if served.any() else 0.0
        out: dict[str, float | int] = {
            "rejected": int(self.rejected.sum()),
            "goodput_rps": float(good.sum()) / span if span > 0 else 0.0,
        }
        groups = []
        if self.priority is not None:
            groups += [(f"priority_{p}", self.priority == p) for p in np.unique(self.priority)]
        if self.tenant is not None:
            groups += [(str(t), self.tenant == t) for t in np.unique(self.tenant)]
        for label, mask in groups:
            out[f"goodput_rps_{label}"] = float((good & mask).sum()) / span if span else 0.0
            out[f"ttft_p90_{label}"] = _pct(ttft[mask & served], 90)
            out[f"rejected_{label}"] = int((self.rejected & mask).sum())
        return out

    def summary(self) -> dict[str, float | int]:
        """The per-policy entry of results.json (times in seconds, rates as fractions)."""
        latencies = self.latencies()
        ttft, e2e, tpot = latencies["ttft"], latencies["e2e"], latencies["tpot"]
        span = float(np.nanmax(self.finish) - self.arrival.min()) if self.requests else 0.0
        kept = slice(None) if self.too_long is None else ~self.too_long  # reached a worker
        prompt = float(self.input_length[kept].sum()) or 1.0
        picked = self.worker[kept]
        per_worker = np.bincount(picked, minlength=self.prefill_workers or self.inflight.shape[1])
        summary = {
            "requests": int(self.requests),
            "ttft_mean": float(ttft.mean()) if len(ttft) else 0.0,
            "ttft_p50": _pct(ttft, 50),
            "ttft_p90": _pct(ttft, 90),
            "ttft_p99": _pct(ttft, 99),
            "tpot_p50": _pct(tpot, 50),
            "tpot_p90": _pct(tpot, 90),
            "e2e_p50": _pct(e2e, 50),
            "e2e_p99": _pct(e2e, 99),
            "throughput_rps": self.requests / span if span > 0 else 0.0,
            "hit_rate": float(self.cached.sum()) / prompt,
            "shadow_abs_error": float(np.abs(self.estimated - self.cached).sum()) / prompt,
            **{
                f"shadow_abs_error_{kind}": _error(est, self.cached, self.input_length)
                for kind, est in self.estimates.items()
            },
            "imbalance": float(per_worker.max() / per_worker.mean()) if per_worker.any() else 0.0,
            "pick_us_p50": _pct(self.pick_us, 50),
            "pick_us_p99": _pct(self.pick_us, 99),
            "lora_swaps": self.lora_swaps,
            "wall_seconds": self.wall_seconds,
        }
        if self.too_long is not None:
            summary["rejected_too_long"] = int(self.too_long.sum())
        if self.predicted_ttft is not None:
            summary |= prediction_error(self.predicted_ttft, self.first_token - self.arrival)
        if self.decode_worker is not None:
            summary |= self._disaggregated_summary(prompt)
        if self.cpu_cached is not None:
            cpu = float(self.cpu_cached.sum())
            gpu_cached, gpu_estimated = (
                self.cached - self.cpu_cached,
                self.estimated - self.cpu_estimated,
            )
            summary |= {
                "gpu_hit_rate": (float(self.cached.sum()) - cpu) / prompt,
                "cpu_hit_rate": cpu / prompt,
                "shadow_abs_error_gpu": float(np.abs(gpu_estimated - gpu_cached).sum()) / prompt,
                "shadow_abs_error_cpu": float(np.abs(self.cpu_estimated - self.cpu_cached).sum())
                / prompt,
            }
        return summary | self.goodput()

    def _disaggregated_summary(self, prompt: float) -> dict[str, float | int]:
        """Prefill hit rate (the same as ``hit_rate``), decode balance, transfer times."""
        kept = slice(None) if self.too_long is None else ~self.too_long  # served ones
        per_decode = np.bincount(self.decode_worker[kept], minlength=self.decode_workers)
        return {
            "prefill_workers": self.prefill_workers,
            "decode_workers": self.decode_workers,
            "prefill_hit_rate": float(self.cached.sum()) / prompt,
            "decode_imbalance": float(per_decode.max() / per_decode.mean())
            if per_decode.any()
            else 0.0,
            # prompt tokens the decode workers already held (not transferred)
            "transfer_saved": 1.0 - float(self.transferred.sum()) / prompt,
            "transfer_p50": _pct(self.transfer_s[kept], 50),
            "transfer_p90": _pct(self.transfer_s[kept], 90),
            "prefill_ttft_p50": _pct((self.prefill_done - self.arrival)[kept], 50),
        }


def prediction_error(predicted: np.ndarray, observed: np.ndarray) -> dict[str, float | int]:
    """The router's predicted TTFT against the observed one, over the requests that have
    both: ``ttft_pred_mdape`` / ``ttft_pred_mape`` the median / mean of |predicted -
    observed| / observed, ``ttft_pred_bias`` the predicted seconds over the observed ones."""
    has = np.isfinite(predicted) & np.isfinite(observed) & (observed > 0)
    if not has.any():
        return {"ttft_pred_requests": 0}
    p, o = predicted[has], observed[has]
    error = np.abs(p - o) / o
    return {
        "ttft_pred_requests": int(has.sum()),
        "ttft_pred_mdape": float(np.median(error)),
        "ttft_pred_mape": float(error.mean()),
        "ttft_pred_bias": float(p.sum() / o.sum()),
    }


def _error(estimated: np.ndarray, cached: np.ndarray, prompt: np.ndarray) -> float:
    """Mean |estimate - true| over the prompt tokens of the requests that have an estimate."""
    has = ~np.isnan(estimated)
    total = float(prompt[has].sum())
    return float(np.abs(estimated[has] - cached[has]).sum()) / total if total else float("nan")


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0
