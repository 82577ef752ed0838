"""A fleet of two models, one with LoRA adapters, behind one router vs one router per model.

    python bench/models/model_fleet.py [--requests 600] [--speedup 10] [--policy ttft] [--out FILE]

Sim workers (real radix KV caches): ``--workers-a`` serve ``model-a``; ``--workers-b`` serve
``model-b`` and the adapters ``lora-0 .. lora-{N-1}`` (``--max-loras`` slots each). The
bundled conversation sample's sessions are each given one model (by a hash of the session:
``model-a``, ``model-b`` or an adapter), and every model's requests are replayed at once,
each with its own ``model``:

1. *mixed*: one router in front of every worker;
2. *separate*: the caches reset, one router per base model in front of its own workers
   (the adapters' requests go to model-b's router), the same requests.

Reported per model: requests, errors (a worker that does not serve the model answers 404, so
0 errors means every request reached a worker that serves its model), where the requests
went, the workers' own hit rate (their reported cached tokens / prompt tokens) and TTFT; and
the router's own 404 ``model_not_found`` for a model nobody serves. The figures go to
bench/results/model_fleet.json (``--out``). tests/traces/test_model_fleet.py runs a small version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from traces.live.fleet import reset_caches, router, sim_workers  # noqa: E402
from traces.live.replay import ReplayConfig, ReplayOutcome, replay  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402
from traces.trace.record import TraceRequest  # noqa: E402

SAMPLE = ROOT / "traces" / "data" / "conversation_sample.jsonl"


@dataclass
class ModelResult:
    model: str
    requests: int
    errors: int
    hit_rate: float  # the workers' reported cached tokens / prompt tokens
    ttft_p50: float
    ttft_p90: float
    workers: dict[str, int]  # worker URL -> requests
    prompt_tokens: int = 0
    cached_tokens: int = 0


def assign_models(
    trace: Sequence[TraceRequest], adapters: int, share_a: float = 0.5
) -> dict[str, list[TraceRequest]]:
    """Each session to one model: ``model-a`` for a ``share_a`` of them (by a stable hash),
    the rest to ``model-b`` and its adapters in turn."""
    models = ["model-b", *(f"lora-{i}" for i in range(adapters))]
    groups: dict[str, list[TraceRequest]] = {}
    for req in trace:
        h = zlib.crc32(req.session_id.encode()) / 2**32
        if h < share_a:
            model = "model-a"
        else:
            model = models[int((h - share_a) / (1 - share_a) * len(models)) % len(models)]
        groups.setdefault(model, []).append(req)
    return groups


def result_of(model: str, outcome: ReplayOutcome) -> ModelResult:
    run = outcome.run
    prompt = float(run.input_length.sum()) or 1.0
    ttft = run.first_token - run.arrival
    counts: dict[str, int] = {}
    for index in run.worker:
        url = outcome.served_by[int(index)]
        counts[url] = counts.get(url, 0) + 1
    return ModelResult(
        model=model,
        requests=run.requests,
        errors=outcome.errors,
        hit_rate=float(run.cached.sum()) / prompt,
        ttft_p50=float(np.percentile(ttft, 50)) if len(ttft) else float("nan"),
        ttft_p90=float(np.percentile(ttft, 90)) if len(ttft) else float("nan"),
        workers=counts,
        prompt_tokens=int(run.input_length.sum()),
        cached_tokens=int(run.cached.sum()),
    )


async def replay_groups(
    groups: dict[str, list[TraceRequest]], url_of: dict[str, str], speedup: float
) -> dict[str, ModelResult]:
    """Every model's requests at once, each to its router, each naming its model."""

    async def one(model: str) -> tuple[str, ReplayOutcome]:
        cfg = ReplayConfig(url=url_of[model], speedup=speedup, model=model, max_output_tokens=64)
        return model, await replay(groups[model], cfg, model)

    done = await asyncio.gather(*(one(m) for m in sorted(groups)))
    return {model: result_of(model, outcome) for model, outcome in done}


@contextlib.contextmanager
def fleet(
    workers_a: int, workers_b: int, adapters: int, max_loras: int, worker_args: Sequence[str]
) -> Iterator[tuple[list[str], list[str]]]:
    lora = ["--lora", *(f"lora-{i}" for i in range(adapters)), "--max-loras", str(max_loras)]
    with (
        sim_workers(workers_a, ["--model-name", "model-a", *worker_args]) as a,
        sim_workers(
            workers_b, ["--model-name", "model-b", *(lora if adapters else ()), *worker_args]
        ) as b,
    ):
        yield [w.url for w in a], [w.url for w in b]


def unknown_model_answer(url: str) -> tuple[int, str]:
    r = httpx.post(url + "/v1/completions", json={"model": "no-such-model", "prompt": "hi"})
    return r.status_code, r.json().get("error", {}).get("code", "")


def run(args: argparse.Namespace) -> dict:
    trace = load_trace(str(args.trace))[: args.requests]
    groups = assign_models(trace, args.adapters)
    worker_args = ["--time-scale", str(args.speedup), "--log-level", "warning",
                   "--kv-capacity-tokens", str(args.kv_capacity_tokens)]  # fmt: skip
    router_args = ["--log-level", "warning", "--models-interval-s", "1"]
    out: dict = {"groups": {m: len(g) for m, g in groups.items()}}
    with fleet(args.workers_a, args.workers_b, args.adapters, args.max_loras, worker_args) as (
        a,
        b,
    ):
        with router([*a, *b], args.policy, router_args) as mixed:
            _wait_models(mixed.url, len(a) + len(b))
            out["unknown_model"] = unknown_model_answer(mixed.url)
            t0 = time.monotonic()
            url_of = dict.fromkeys(groups, mixed.url)
            out["mixed"] = asyncio.run(replay_groups(groups, url_of, args.speedup))
            out["mixed_s"] = time.monotonic() - t0
        if not reset_caches([*a, *b]):
            raise RuntimeError("a worker refused POST /reset_prefix_cache")
        with router(a, args.policy, router_args) as ra, router(b, args.policy, router_args) as rb:
            _wait_models(ra.url, len(a))
            _wait_models(rb.url, len(b))
            url_of = {m: (ra.url if m == "model-a" else rb.url) for m in groups}
            out["separate"] = asyncio.run(replay_groups(groups, url_of, args.speedup))
        out["workers_a"], out["workers_b"] = a, b
    out["misrouted"] = misrouted(out, a, b)
    return out


def family_hit_rates(results: dict[str, ModelResult]) -> dict[str, float]:
    """Hit rate per base model, its adapters' requests counted with it."""
    sums: dict[str, list[int]] = {}
    for model, r in results.items():
        family = sums.setdefault("model-a" if model == "model-a" else "model-b", [0, 0])
        family[0] += r.cached_tokens
        family[1] += r.prompt_tokens
    return {m: c / p if p else 0.0 for m, (c, p) in sums.items()}


def misrouted(out: dict, a: Sequence[str], b: Sequence[str]) -> int:
    """Requests (both runs) answered by a worker that does not serve their model."""
    bad = 0
    for run in ("mixed", "separate"):
        for model, result in out[run].items():
            serving = set(a if model == "model-a" else b)
            bad += sum(n for url, n in result.workers.items() if url not in serving)
    return bad


def _wait_models(url: str, n: int, timeout_s: float = 30.0) -> None:
    """Until the router has read every worker's /v1/models."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = httpx.get(url + "/workers", timeout=5).json()
        if len(workers) == n and all(w["models"] for w in workers):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{url}: the workers' models were not read within {timeout_s:.0f} s")


def table(out: dict) -> str:
    lines = [
        "| model | requests | errors mixed / separate | hit rate mixed | hit rate separate "
        "| diff (points) | TTFT p90 mixed / separate (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in sorted(out["mixed"]):
        m, s = out["mixed"][model], out["separate"][model]
        lines.append(
            f"| {model} | {m.requests} | {m.errors} / {s.errors} | {m.hit_rate:.3f} | "
            f"{s.hit_rate:.3f} | {100 * (m.hit_rate - s.hit_rate):+.2f} | "
            f"{m.ttft_p90:.2f} / {s.ttft_p90:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=SAMPLE)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--speedup", type=float, default=10.0)
    p.add_argument("--policy", default="ttft")
    p.add_argument("--workers-a", type=int, default=2)
    p.add_argument("--workers-b", type=int, default=2)
    p.add_argument("--adapters", type=int, default=2)
    p.add_argument("--max-loras", type=int, default=2)
    p.add_argument("--kv-capacity-tokens", type=int, default=262_144)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "model_fleet.json")
    args = p.parse_args(argv)
    out = run(args)
    text = table(out)
    print(f"unknown model: HTTP {out['unknown_model'][0]} {out['unknown_model'][1]}")
    print(f"requests on a worker that does not serve their model: {out['misrouted']}")
    print(text)
    mixed, separate = family_hit_rates(out["mixed"]), family_hit_rates(out["separate"])
    for family in sorted(mixed):
        print(f"{family} (adapters included): hit rate mixed {mixed[family]:.3f}, "
              f"separate {separate[family]:.3f}")  # fmt: skip
    for model, result in sorted(out["mixed"].items()):
        print(f"{model}: mixed run's workers {result.workers}")
    doc = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **{k: out[k] for k in ("groups", "unknown_model", "misrouted")},
        "family_hit_rate": {"mixed": mixed, "separate": separate},
        **{
            run: {m: dataclasses.asdict(r) for m, r in out[run].items()}
            for run in ("mixed", "separate")
        },
    }
    args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
