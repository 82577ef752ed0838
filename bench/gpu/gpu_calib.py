"""Measure a GPU's cost surface for the worker model's profiles (no engine: plain PyTorch).

    OUT=out/gpu python bench/gpu/gpu_calib.py          # on the GPU's machine, ~90 s
    MODEL=70b OUT=out/gpu python bench/gpu/gpu_calib.py
    QUICK=1 OUT=/tmp python bench/gpu/gpu_calib.py     # tiny shapes on a CPU: checks the script

Then ``python bench/gpu/fit_profile.py out/gpu/gpu_calib.json --name NAME --out FILE``
(bench/gpu/README.md). A Llama-3-8B-shaped decoder layer (hidden 4096, 32 query / 8 KV heads
of 128, MLP 14336, bf16, random weights) run 32 times per forward (``MODEL=70b``: the 70B
shape, 80 layers), as an engine would:

- prefill of ``s`` new tokens after a cached prefix of ``p`` tokens (lower-right causal
  attention over ``p + s`` keys): the cost of a cache hit's remaining work and of chunked
  prefill;
- a decode step of a batch of ``b`` sequences of context ``c`` (one layer's KV reused across
  layers; no split-KV kernel, so one sequence at long context reads slow);
- host to GPU copies, pinned, in pieces of several sizes: the CPU KV tier's load rate.

CUDA-event timings, median of 3 (1 for the longest prefills). ``GRID=holdout`` measures a
second grid, for checking a profile fitted on the first; ``BUDGET_S`` (200) bounds the run.
Writes ``$OUT/gpu_calib.json`` after every figure, so a partial run still reports. Adapted
from the reference script the issue's measurements were taken with (../shared/gpu/).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

OUT = os.environ.get("OUT", ".")
QUICK = os.environ.get("QUICK") == "1"  # tiny shapes, for a CPU check of the script
MODEL = os.environ.get("MODEL", "8b")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DT = torch.bfloat16 if DEV == "cuda" else torch.float32
if QUICK:
    H, NH, NKV, HD, FF, L = 256, 4, 2, 64, 512, 2
elif MODEL == "70b":  # Llama-3-70B-shaped, on one GPU (no tensor parallelism)
    H, NH, NKV, HD, FF, L = 8192, 64, 8, 128, 28672, 80
else:
    H, NH, NKV, HD, FF, L = 4096, 32, 8, 128, 14336, 32
G = NH // NKV
K = 1024
RES: dict[str, Any] = {
    "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
    "torch": torch.__version__,
    "shape": {"hidden": H, "heads": NH, "kv_heads": NKV, "head_dim": HD, "ffn": FF, "layers": L},
    "errors": [],
}


def save() -> None:
    with open(os.path.join(OUT, "gpu_calib.json"), "w") as f:
        json.dump(RES, f, indent=1)


def log(key: str, val: Any) -> None:
    RES[key] = val
    save()
    print(key, json.dumps(val), flush=True)


def error(what: str) -> None:
    RES["errors"].append(what)
    save()


def timed(fn: Callable[[], Any], reps: int = 3, warm: int = 1) -> float:
    """The median of ``reps`` timings of ``fn`` (CUDA events on the GPU)."""
    for _ in range(warm):
        fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        if DEV == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def fast() -> AbstractContextManager:
    """On the GPU never the math kernel (it materialises the whole score matrix)."""
    if DEV != "cuda":
        return nullcontext()
    kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    return sdpa_kernel([*kernels, SDPBackend.CUDNN_ATTENTION])


torch.manual_seed(0)
STD = 0.02
W = {
    "qkv": (torch.randn(H, (NH + 2 * NKV) * HD, device=DEV) * STD).to(DT),
    "o": (torch.randn(NH * HD, H, device=DEV) * STD).to(DT),
    "up": (torch.randn(H, 2 * FF, device=DEV) * STD).to(DT),
    "down": (torch.randn(FF, H, device=DEV) * STD).to(DT),
    "n1": torch.ones(H, device=DEV, dtype=DT),
    "n2": torch.ones(H, device=DEV, dtype=DT),
}


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)


def mlp(x: torch.Tensor) -> torch.Tensor:
    g, u = (x @ W["up"]).split(FF, dim=-1)
    return (F.silu(g) * u) @ W["down"]


# attention for prefill after a cached prefix: the first mode that runs (and matches a
# reference) wins
def attn_gqa_bias(q, k, v, s, n):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(s, n), enable_gqa=True
    )


def attn_expand_bias(q, k, v, s, n):
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(s, n))


def attn_mask(q, k, v, s, n):
    m = torch.ones(s, n, dtype=torch.bool, device=DEV).tril(diagonal=n - s)
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


MODES = [
    ("gqa_lower_right", attn_gqa_bias),
    ("expand_lower_right", attn_expand_bias),
    ("bool_mask", attn_mask),
]


def pick_mode() -> tuple[str, Callable]:
    s, p = 64, 96
    n = p + s
    q = torch.randn(1, NH, s, HD, device=DEV, dtype=DT)
    k = torch.randn(1, NKV, n, HD, device=DEV, dtype=DT)
    v = torch.randn(1, NKV, n, HD, device=DEV, dtype=DT)
    ref = attn_mask(q.float(), k.float(), v.float(), s, n).to(DT)
    for name, fn in MODES:
        try:
            err = (fn(q, k, v, s, n).float() - ref.float()).abs().max().item()
            if err < 0.05:
                return name, fn
            error(f"mode {name}: max err {err}")
        except Exception as e:
            error(f"mode {name}: {type(e).__name__}: {str(e)[:200]}")
    raise SystemExit("no attention mode works")


def prefill(attn: Callable, p: int, s: int, kc: torch.Tensor, vc: torch.Tensor) -> torch.Tensor:
    """One forward of s new tokens after p cached ones; kc/vc hold p + s keys (one layer's,
    reused)."""
    n = p + s
    x = torch.randn(s, H, device=DEV, dtype=DT)
    for _ in range(L):
        qkv = rms(x, W["n1"]) @ W["qkv"]
        q = qkv[:, : NH * HD].view(s, NH, HD).transpose(0, 1).unsqueeze(0)
        k = qkv[:, NH * HD : (NH + NKV) * HD].view(s, NKV, HD).transpose(0, 1)
        v = qkv[:, (NH + NKV) * HD :].view(s, NKV, HD).transpose(0, 1)
        kc[0, :, p:n] = k
        vc[0, :, p:n] = v
        a = attn(q, kc[:, :, :n], vc[:, :, :n], s, n)
        x = x + a.squeeze(0).transpose(0, 1).reshape(s, NH * HD) @ W["o"]
        x = x + mlp(rms(x, W["n2"]))
    return x


def decode(b: int, kc: torch.Tensor, vc: torch.Tensor) -> torch.Tensor:
    """One decode step: b sequences, each attending its cached keys (GQA as G query rows per
    KV head; no mask, every key is earlier)."""
    x = torch.randn(b, H, device=DEV, dtype=DT)
    for _ in range(L):
        q = (rms(x, W["n1"]) @ W["qkv"])[:, : NH * HD].view(b, NKV, G, HD)
        a = F.scaled_dot_product_attention(q, kc, vc)  # [b, NKV, G, HD]
        x = x + a.reshape(b, NH * HD) @ W["o"]
        x = x + mlp(rms(x, W["n2"]))
    return x


def fits(b: int, c: int) -> bool:
    """Whether ``b`` sequences of ``c`` thousand tokens' KV (one layer) fit in 40 GB."""
    return b * c * K * NKV * HD * 2 * 2 <= 40e9


def grids() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(prefix, new) prefill points and (batch, context) decode points."""
    if QUICK:
        return [(0, 256), (512, 128), (1024, 256)], [(1, 256), (4, 1024)]
    if MODEL == "70b":
        pre = [(0, s * K) for s in (1, 4, 16)] + [(p * K, s * K) for p in (16, 64) for s in (2, 8)]
        return pre, [(b, c * K) for b in (1, 16, 64) for c in (4, 32)]
    if os.environ.get("GRID") == "holdout":
        pre = [(0, s * K) for s in (3, 12, 24, 48, 96)]
        pre += [(p * K, s * K) for p in (8, 48, 96, 160) for s in (1, 4, 16)]
        dec = [(b, c * K) for b in (4, 16, 64) for c in (4, 16, 64) if fits(b, c)]
        return pre, dec
    pre = [(0, s * K) for s in (1, 2, 4, 8, 16, 32, 64, 128)]
    pre += [(p * K, s) for p in (4, 16, 32, 64, 128, 192) for s in (512, 2048, 8192)]
    dec = [(b, c * K) for b in (1, 8, 32, 128) for c in (2, 8, 32, 128) if fits(b, c)]
    return pre, [*dec, (256, 2 * K), (256, 8 * K)]


def measure_compute(attn: Callable, budget: float, t0: float) -> None:
    pre_grid, dec_grid = grids()
    maxn = max(p + s for p, s in pre_grid)
    kc = torch.zeros(1, NKV, maxn, HD, device=DEV, dtype=DT)
    vc = torch.zeros(1, NKV, maxn, HD, device=DEV, dtype=DT)
    pre: list[dict] = []
    for p, s in pre_grid:
        if time.time() - t0 > budget:
            error(f"prefill budget reached before p={p} s={s}")
            break
        last = pre[-1] if pre else None
        if last and p == 0 and last["prefix"] == 0 and last["s"] * (s / last["new"]) ** 2 > 60:
            error(f"prefill p=0 s={s} skipped: predicted over 60 s")
            continue
        try:
            t = timed(lambda p=p, s=s: prefill(attn, p, s, kc, vc), reps=3 if s <= 32 * K else 1)
            pre.append({"prefix": p, "new": s, "s": round(t, 5), "new_tokens_per_s": round(s / t)})
            log("prefill", pre)
        except Exception as e:
            error(f"prefill p={p} s={s}: {type(e).__name__}: {str(e)[:200]}")
    kc = vc = None  # free the prefill caches before the decode ones
    if DEV == "cuda":
        torch.cuda.empty_cache()
    dec: list[dict] = []
    for b, c in dec_grid:
        if time.time() - t0 > budget * 1.5:
            error(f"decode budget reached before b={b} c={c}")
            break
        try:
            kb = torch.randn(b, NKV, c, HD, device=DEV, dtype=DT)
            vb = torch.randn(b, NKV, c, HD, device=DEV, dtype=DT)
            t = timed(lambda b=b, kb=kb, vb=vb: decode(b, kb, vb), reps=5)
            dec.append({"batch": b, "context": c, "step_s": round(t, 6)})
            log("decode", dec)
            del kb, vb
        except Exception as e:
            error(f"decode b={b} c={c}: {type(e).__name__}: {str(e)[:200]}")
        if DEV == "cuda":
            torch.cuda.empty_cache()


def measure_copies() -> None:
    """Host <-> GPU copies of 2 GiB, pinned, in pieces from 64 KiB to the whole."""
    total = 2 << 30
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(total, dtype=torch.uint8, device=DEV)
    copies: list[dict] = []
    for piece in (64 << 10, 512 << 10, 2 << 20, 16 << 20, total):
        n = total // piece

        def h2d(piece: int = piece, n: int = n) -> None:
            for i in range(n):
                gpu[i * piece : (i + 1) * piece].copy_(
                    host[i * piece : (i + 1) * piece], non_blocking=True
                )

        def d2h(piece: int = piece, n: int = n) -> None:
            for i in range(n):
                host[i * piece : (i + 1) * piece].copy_(
                    gpu[i * piece : (i + 1) * piece], non_blocking=True
                )

        try:
            th, td = timed(h2d), timed(d2h)
            gbps = {"h2d_gbps": round(total / th / 1e9, 2), "d2h_gbps": round(total / td / 1e9, 2)}
            copies.append({"piece_bytes": piece, **gbps})
            log("pinned_copies", copies)
        except Exception as e:
            error(f"copy piece={piece}: {type(e).__name__}: {str(e)[:200]}")


def main() -> int:
    t0 = time.time()
    budget = float(os.environ.get("BUDGET_S", "200"))
    with fast():
        mode, attn = pick_mode()
    log("prefill_attention_mode", mode)
    with torch.inference_mode(), fast():
        measure_compute(attn, budget, t0)
    if DEV == "cuda":
        measure_copies()
    log("wall_s", round(time.time() - t0, 1))
    print("errors:", RES["errors"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
