"""GPU cost profiles: what an engine step costs, measured on a real GPU and model shape.

The flat worker model prices prefill at a fixed rate and a decode step per sequence, whatever
the context; measured on H100s and H200s (bench/gpu/, docs/simulation.md) both are wrong
where long prompts extend earlier ones. A profile prices them by the work an engine does:

- a prefill chunk of ``s`` new tokens after ``p`` tokens already in the KV cache costs
  ``a*s + c*(s*p + s**2/2)`` (the tokens' own layers, and attention over every earlier key)
  plus ``d`` once per engine step that carries prefill;
- a decode step costs ``base + per_sequence*batch + per_context_token*(context tokens of
  every sequence in the batch)`` (the KV each step reads);
- a CPU-tier KV load of ``n`` bytes moves at the pinned-copy rate measured for its pieces
  (``piece_bytes``, log-linear between measured sizes, clamped at the ends), over ``links``
  host links in parallel (one per GPU of a tensor-parallel worker).

A profile is a JSON file (``router/cache/profiles/*.json`` ship with the package; bring your
own with ``--gpu-profile FILE`` or ``--cost-profile FILE``): its measured points, the fitted
terms and how well they fit (bench/gpu/fit_profile.py writes them). Only the terms are read
here. It lives under the cache model so that both the worker model (traces/, the simulated
workers' steps) and the router (:mod:`router.cache.cost_model`, its TTFT prediction) read
the same files; a file is read once, when a command starts.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

FLAT = "flat"
"""``--gpu-profile flat`` / ``--cost-profile flat``: no profile, the flat model of the
worker model's (or the router's) own flags."""

FLAT_KV_LOAD_GBPS = 20.0
"""The flat model's host to GPU KV load rate, GB/s: PCIe Gen4 class (vLLM measures about 50
one way on an H100 with its 0.5-2 MB blocks since 0.12; smaller blocks and older links move
less). A profile's loads run at its measured copy curve instead."""

DEFAULT = "h100-llama8b"
"""The profile the worker model prices steps by, and the router predicts with, when not told
(``--gpu-profile``, ``--cost-profile``): an H100 serving an 8B model, the deployment the
router's other defaults describe."""


@dataclass(frozen=True)
class GpuProfile:
    """A profile's fitted terms, in seconds (module docstring)."""

    name: str
    device: str
    a: float  # per new prefill token
    c: float  # per query-key pair of a prefill chunk
    d: float  # per engine step that carries prefill
    decode_base: float  # per decode step
    decode_per_context_token: float  # per context token of the batch, each decode step
    decode_per_sequence: float  # per sequence of the batch, each decode step
    kv_bytes_per_token: int  # a token's KV, all layers, the whole model
    kv_piece_bytes: int  # the pieces a CPU-tier load copies, on one GPU
    kv_links: int  # host to GPU links a load runs over at once (GPUs of a worker)
    copy_curve: tuple[tuple[int, float], ...]  # (piece bytes, GB/s) ascending by piece
    tensor_parallel: int = 1
    source: str = ""  # what --gpu-profile named it by (a shipped name or a file)

    def prefill_work_s(self, tokens: Any, cached: Any = 0) -> Any:
        """The token and attention terms of ``tokens`` new tokens after ``cached`` ones (no
        step cost); scalars or numpy arrays. Summed over chunks it telescopes to the same
        attention over the whole span, however the prefill is chunked."""
        return self.a * tokens + self.c * pairs_of(tokens, cached)

    def decode_step_s(self, batch: int, context: int) -> float:
        """One decode-only step of ``batch`` sequences holding ``context`` tokens in all."""
        return (
            self.decode_base
            + self.decode_per_sequence * batch
            + self.decode_per_context_token * context
        )

    def copy_gbps(self, piece_bytes: float) -> float:
        """The pinned host to GPU rate for pieces of ``piece_bytes`` (interpolated)."""
        curve = self.copy_curve
        sizes = [s for s, _ in curve]
        i = bisect.bisect_left(sizes, piece_bytes)
        if i == 0:
            return curve[0][1]
        if i == len(curve):
            return curve[-1][1]
        (s0, g0), (s1, g1) = curve[i - 1], curve[i]
        f = math.log(piece_bytes / s0) / math.log(s1 / s0)
        return g0 + f * (g1 - g0)

    def load_s_per_token(self) -> float:
        """Seconds per token of a load of whole blocks (every link copying ``kv_piece_bytes``
        pieces): the price of a CPU-tier hit, which :meth:`load_s` of one token would
        overstate at a one-token piece's rate."""
        per_link = self.kv_bytes_per_token / self.kv_links
        return per_link / (self.copy_gbps(self.kv_piece_bytes) * 1e9)

    def load_s(self, tokens: int) -> float:
        """Seconds to load ``tokens`` tokens' KV from host memory (each link its share)."""
        per_link = tokens * self.kv_bytes_per_token / self.kv_links
        if per_link <= 0:
            return 0.0
        return per_link / (self.copy_gbps(min(self.kv_piece_bytes, per_link)) * 1e9)


def profiles_dir() -> Path:
    """Where the shipped profiles live (package data of ``router.cache``)."""
    return Path(str(resources.files("router.cache") / "profiles"))


def profile_names() -> list[str]:
    """The shipped profiles' names (their files' stems)."""
    return sorted(p.stem for p in profiles_dir().glob("*.json"))


def resolve(text: str) -> GpuProfile | None:
    """``--gpu-profile``'s (or ``--cost-profile``'s) value: ``flat`` (None: the flat model),
    a shipped profile's name, or a profile file. ValueError, one line, for anything else."""
    if text == FLAT:
        return None
    shipped = profiles_dir() / f"{text}.json"
    if "/" not in text and shipped.is_file():
        return load(shipped, text)
    path = Path(text)
    if path.is_file():
        return load(path, str(path.resolve()))
    names = ", ".join([FLAT, *profile_names()])
    raise ValueError(f"unknown GPU profile {text!r}: give one of {names}, or a profile file")


def load(path: Path, source: str | None = None) -> GpuProfile:
    """The profile in ``path``; ValueError naming the file and what is wrong with it."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"GPU profile {path}: cannot read it as JSON ({exc})") from None
    try:
        return from_dict(raw, source or str(path))
    except (KeyError, TypeError, ValueError) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"GPU profile {path}: {what}") from None


def _number(section: dict, key: str, positive: bool = False) -> float:
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a number, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{key} must be {'> 0' if positive else '>= 0'}, not {value!r}")
    return float(value)


def from_dict(raw: Any, source: str) -> GpuProfile:
    """A profile from its JSON object (KeyError, TypeError or ValueError when malformed)."""
    if not isinstance(raw, dict):
        raise ValueError("the file must hold a JSON object")
    prefill, decode, kv = raw["prefill"], raw["decode"], raw["kv_load"]
    if not all(isinstance(s, dict) for s in (prefill, decode, kv)):
        raise ValueError("prefill, decode and kv_load must be objects")
    curve = []
    for point in kv["curve"]:
        if not isinstance(point, list | tuple) or len(point) != 2:
            raise ValueError(f"kv_load.curve holds [piece_bytes, GB/s] pairs, not {point!r}")
        size, gbps = _number({"piece": point[0]}, "piece", True), point[1]
        curve.append((int(size), _number({"GB/s": gbps}, "GB/s", True)))
    curve.sort()
    if not curve or len({s for s, _ in curve}) != len(curve):
        raise ValueError("kv_load.curve needs one or more points of distinct piece sizes")
    profile = GpuProfile(
        name=str(raw.get("name", source)),
        device=str(raw.get("device", "")),
        a=_number(prefill, "a", True),
        c=_number(prefill, "c"),
        d=_number(prefill, "d"),
        decode_base=_number(decode, "base"),
        decode_per_context_token=_number(decode, "per_context_token"),
        decode_per_sequence=_number(decode, "per_sequence") if "per_sequence" in decode else 0.0,
        kv_bytes_per_token=int(_number(raw, "kv_bytes_per_token", True)),
        kv_piece_bytes=int(_number(kv, "piece_bytes", True)),
        kv_links=int(_number(kv, "links", True)) if "links" in kv else 1,
        copy_curve=tuple(curve),
        tensor_parallel=int(_number(raw, "tensor_parallel", True))
        if "tensor_parallel" in raw
        else 1,
        source=source,
    )
    if profile.decode_step_s(1, 1) <= 0:
        raise ValueError("a decode step must cost something (decode.base and its terms are 0)")
    return profile


def pairs_of(new: Any, cached: Any) -> Any:
    """Query-key pairs of ``new`` prompt tokens computed after ``cached`` ones (scalars or
    numpy arrays): the attention term's count."""
    return new * cached + new * new / 2.0
