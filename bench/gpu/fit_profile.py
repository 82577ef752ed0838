"""Fit a GPU cost profile (router/cache/cost_profile.py) to a calibration run (gpu_calib.py).

    python bench/gpu/fit_profile.py bench/gpu/data/h200_llama8b.json --name h200-llama8b \
        --out router/cache/profiles/h200-llama8b.json [--tensor-parallel 4]

- prefill: non-negative least squares of ``a*s + c*(s*p + s**2/2) + d`` over the chunk rows
  (``prefix > 0``: engines chunk long prompts, and a single forward over a whole 64k-128k
  prompt runs 13-35% faster than chunks of it), weighted by ``1/t`` so every row counts by its
  relative error;
- decode: the same for ``base + per_context_token * batch * context`` over the rows of at
  least ``--decode-min-batch`` sequences (8): the calibration's decode has no split-KV kernel,
  so one sequence at long context reads slower than an engine's (the rows left out are kept,
  with their error, marked ``fitted: false``);
- KV loads: the measured host to GPU copy curve, pieces of ``--piece-bytes`` (default: one
  512-token block of one layer on one GPU, 2 MiB for both Llama shapes at one GPU; vLLM's
  offloading has copied 0.5-2 MB blocks since 0.12).

``--tensor-parallel N`` derives an N-GPU worker from a one-GPU run: an assumption, not a
measurement, stated in the file: every term divided by N (each GPU holds 1/N of the heads
and of the MLP), plus tensor parallelism's two all-reduces a layer of ``hidden`` bf16 values
a token (ring: ``2(N-1)/N`` of them cross each GPU's link at ``--allreduce-bus-gbps``, 360,
what NCCL reaches on NVLink 4; each all-reduce also ``--allreduce-latency-us``, 5, once a
step); a load runs over N host links at once, each with its GPU's 1/N of the KV.

The profile keeps the measured points, the fitted terms and the fit's residuals; it is read
back with router/cache/cost_profile.py before it is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router.cache.cost_profile import from_dict  # noqa: E402
from traces.trace.record import BLOCK_TOKENS  # noqa: E402

BF16 = 2


def nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Least squares of ``x @ coef ~ y`` weighted by ``w``, every coefficient >= 0 (the most
    negative one is pinned at 0 and the rest refitted, until none is negative)."""
    free = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        sol, *_ = np.linalg.lstsq(x[:, free] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[free] = sol
            return coef
        free.pop(int(np.argmin(sol)))
    return coef


def errors(measured: np.ndarray, fitted: np.ndarray) -> dict[str, float]:
    err = np.abs(fitted / measured - 1)
    return {
        "median_abs_rel_err": round(float(np.median(err)), 4),
        "max_abs_rel_err": round(float(err.max()), 4),
    }


def fit_prefill(rows: list[dict]) -> tuple[dict[str, float], dict]:
    chunk = [r for r in rows if r["prefix"] > 0]
    if len(chunk) < 3:
        raise SystemExit("need at least 3 prefill rows with prefix > 0")
    p = np.array([r["prefix"] for r in chunk], dtype=float)
    s = np.array([r["new"] for r in chunk], dtype=float)
    t = np.array([r["s"] for r in chunk], dtype=float)
    x = np.c_[s, s * p + s * s / 2, np.ones_like(s)]
    a, c, d = nnls(x, t, 1 / t)
    fitted = x @ np.array([a, c, d])
    residuals = [
        {
            "prefix": int(pi),
            "new": int(si),
            "measured_s": float(ti),
            "fitted_s": round(float(fi), 6),
            "rel_err": round(float(fi / ti - 1), 4),
        }
        for pi, si, ti, fi in zip(p, s, t, fitted, strict=True)
    ]
    terms = {"a": float(f"{a:.6g}"), "c": float(f"{c:.6g}"), "d": float(f"{d:.6g}")}
    return terms, {
        "rows": len(chunk),
        "weights": "1/t",
        **errors(t, fitted),
        "residuals": residuals,
    }


def fit_decode(rows: list[dict], min_batch: int) -> tuple[dict[str, float], dict]:
    b = np.array([r["batch"] for r in rows], dtype=float)
    ctx = np.array([r["context"] for r in rows], dtype=float)
    t = np.array([r["step_s"] for r in rows], dtype=float)
    used = b >= min_batch
    if used.sum() < 2:
        raise SystemExit(f"need at least 2 decode rows of >= {min_batch} sequences")
    x = np.c_[np.ones_like(b), b * ctx]
    base, per_ctx = nnls(x[used], t[used], 1 / t[used])
    fitted = x @ np.array([base, per_ctx])
    residuals = [
        {
            "batch": int(bi),
            "context": int(ci),
            "measured_s": float(ti),
            "fitted_s": round(float(fi), 6),
            "rel_err": round(float(fi / ti - 1), 4),
            "fitted": bool(u),
        }
        for bi, ci, ti, fi, u in zip(b, ctx, t, fitted, used, strict=True)
    ]
    terms = {
        "base": float(f"{base:.6g}"),
        "per_context_token": float(f"{per_ctx:.6g}"),
        "per_sequence": 0.0,
    }
    return terms, {
        "rows": int(used.sum()),
        "min_batch": min_batch,
        "weights": "1/t",
        **errors(t[used], fitted[used]),
        "residuals": residuals,
    }


def kv_bytes_per_layer_token(shape: dict) -> int:
    """One token's K and V in one layer, bf16, the whole model."""
    return 2 * shape["kv_heads"] * shape["head_dim"] * BF16


def tensor_parallel(profile: dict, shape: dict, n: int, bus_gbps: float, latency_us: float) -> None:
    """``profile`` (one GPU's terms) as an ``n``-GPU tensor-parallel worker (module docstring)."""
    per_token = 2 * shape["layers"] * shape["hidden"] * BF16 * 2 * (n - 1) / n / (bus_gbps * 1e9)
    per_step = 2 * shape["layers"] * latency_us * 1e-6
    pre, dec = profile["prefill"], profile["decode"]
    profile["prefill"] = {
        "a": float(f"{pre['a'] / n + per_token:.6g}"),
        "c": float(f"{pre['c'] / n:.6g}"),
        "d": float(f"{pre['d'] / n + per_step:.6g}"),
    }
    profile["decode"] = {
        "base": float(f"{dec['base'] / n + per_step:.6g}"),
        "per_context_token": float(f"{dec['per_context_token'] / n:.6g}"),
        "per_sequence": float(f"{per_token:.6g}"),
    }
    profile["tensor_parallel"] = n
    profile["tensor_parallel_assumption"] = {
        "degree": n,
        "allreduce_bus_gbps": bus_gbps,
        "allreduce_latency_us": latency_us,
        "allreduce_s_per_token": float(f"{per_token:.6g}"),
        "allreduce_s_per_step": float(f"{per_step:.6g}"),
        "how": f"the one-GPU fit's terms divided by {n}; plus two all-reduces a layer of "
        f"hidden ({shape['hidden']}) bf16 values a token, 2({n}-1)/{n} of them over each "
        f"GPU's link at {bus_gbps:g} GB/s (added to a, and to decode as per_sequence), and "
        f"{latency_us:g} us each, once a step (added to d and to decode's base); CPU-tier "
        f"loads over {n} links at once, each GPU's 1/{n} of the KV. Not measured: real "
        "tensor parallelism scales less than 1/N (kernels on smaller matrices, overlap lost)",
    }


def build(calib: dict, args: argparse.Namespace) -> dict:
    shape = calib["shape"]
    n = args.tensor_parallel
    prefill, prefill_fit = fit_prefill(calib["prefill"])
    decode, decode_fit = fit_decode(calib["decode"], args.decode_min_batch)
    layer_token = kv_bytes_per_layer_token(shape)
    piece = args.piece_bytes or BLOCK_TOKENS * layer_token // n
    curve = [[c["piece_bytes"], c["h2d_gbps"]] for c in calib.get("pinned_copies", [])]
    if not curve:
        raise SystemExit("the calibration has no pinned_copies (run it on a GPU)")
    profile = {
        "name": args.name,
        "device": calib["device"],
        "model": {"shape": shape, "dtype": "bf16"},
        "tensor_parallel": 1,
        "kv_bytes_per_token": layer_token * shape["layers"],
        "prefill": prefill,
        "decode": decode,
        "kv_load": {"piece_bytes": piece, "links": n, "curve": curve},
        "units": "seconds. prefill: a per new token, c per query-key pair "
        "(s*p + s^2/2 for s new tokens after p cached), d per engine step that carries "
        "prefill. decode: base per step, per_context_token per context token of the batch, "
        "per_sequence per sequence. kv_load.curve: [piece bytes, host to GPU GB/s]",
        "fit": {"prefill": prefill_fit, "decode": decode_fit},
        "measured": {
            k: calib[k]
            for k in ("torch", "prefill_attention_mode", "prefill", "decode", "pinned_copies")
            if k in calib
        },
        "notes": [args.note] if args.note else [],
    }
    if n > 1:
        tensor_parallel(profile, shape, n, args.allreduce_bus_gbps, args.allreduce_latency_us)
        profile["notes"].append(
            f"derived from the one-GPU measurement with tensor parallelism {n} (see "
            "tensor_parallel_assumption); fit and measured are the one-GPU run's"
        )
    from_dict(json.loads(json.dumps(profile)), args.name)  # as cost_profile.py reads it
    return profile


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("calib", type=Path, help="gpu_calib.py's gpu_calib.json")
    p.add_argument("--name", required=True, help="the profile's name (--gpu-profile NAME)")
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--decode-min-batch", type=int, default=8)
    p.add_argument("--piece-bytes", type=int, default=None, help="a CPU-tier load's pieces")
    p.add_argument("--tensor-parallel", type=int, default=1)
    p.add_argument("--allreduce-bus-gbps", type=float, default=360.0)
    p.add_argument("--allreduce-latency-us", type=float, default=5.0)
    p.add_argument("--note", default="", help="a line for the profile's notes")
    args = p.parse_args()
    if args.tensor_parallel < 1:
        p.error("--tensor-parallel must be >= 1")
    profile = build(json.loads(args.calib.read_text()), args)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    pre, dec = profile["fit"]["prefill"], profile["fit"]["decode"]
    print(
        f"{args.name}: prefill {profile['prefill']} (median |err| {pre['median_abs_rel_err']:.1%}, "
        f"max {pre['max_abs_rel_err']:.1%} over {pre['rows']} chunk rows); decode "
        f"{profile['decode']} (median {dec['median_abs_rel_err']:.1%}, max "
        f"{dec['max_abs_rel_err']:.1%} over {dec['rows']} rows); wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
