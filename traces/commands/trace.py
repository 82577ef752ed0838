"""``cache-router trace {stats,cap,synth,models}``: inspect, cap, generate request traces and
give their sessions models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from router.validation import COUNT, POSITIVE, SECONDS_OR_OFF, SEED, integer, number, refuse
from traces.trace.assign import assign_models, parse_model_weights
from traces.trace.cap import DEFAULT_MAX_TURNS, build_capped_trace
from traces.trace.formats import FORMATS, load_trace
from traces.trace.record import TraceFormatError
from traces.trace.stats import format_stats, trace_stats
from traces.trace.synth import SynthConfig, synthesize
from traces.trace.writer import write_jsonl

_FORMAT_CHOICES = ["auto", *FORMATS]
# synth's sizes: what a generated trace file can hold (10**6 sessions of 10**4 turns of
# 10**7-token contexts is already far past any real trace)
SESSIONS = integer(1, 10**6)
SESSIONS_OR_NONE = integer(0, 10**6)
TURNS = integer(1, 10**4)
CONTEXT = integer(1, 10**7)
CONTEXT_OR_NONE = integer(0, 10**7)
MEAN_TOKENS = number(1, 10**7)
_HELP = argparse.ArgumentDefaultsHelpFormatter


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``trace`` and its sub-commands on the top-level parser."""
    trace = subparsers.add_parser(
        "trace",
        help="inspect, cap and synthesize request traces",
        description="Trace tools. Formats: Mooncake JSONL, Weka kv-cache-tester JSON (file or "
        "directory), Bailian JSONL, generic JSONL (docs/trace-format.md), Azure CSV.",
        formatter_class=_HELP,
    )
    trace.set_defaults(func=lambda _args: _usage(trace))
    sub = trace.add_subparsers(dest="trace_command", metavar="TRACE_COMMAND")

    stats = sub.add_parser(
        "stats",
        help="requests, span, lengths, sessions, infinite-cache hit ceiling",
        description="Summary statistics of a trace (see traces/trace/stats.py for definitions).",
        formatter_class=_HELP,
    )
    stats.add_argument("file", type=Path, help="trace file (or Weka directory)")
    stats.add_argument(
        "--format", choices=_FORMAT_CHOICES, default="auto", dest="fmt", help="trace format"
    )
    stats.add_argument("--json", action="store_true", help="print JSON instead of text")
    stats.set_defaults(func=_stats)

    cap = sub.add_parser(
        "cap",
        help="keep each session's first N turns (seed 002's capped trace)",
        description="Per session keep the first N turns by (turn, timestamp), then restore "
        "wall-clock order; write generic JSONL.",
        formatter_class=_HELP,
    )
    cap.add_argument("input", type=Path, help="trace file (or Weka directory)")
    cap.add_argument("output", help="generic JSONL to write ('-' = stdout)")
    cap.add_argument("--max-turns", type=COUNT, default=DEFAULT_MAX_TURNS, help="turns kept")
    cap.add_argument(
        "--format", choices=_FORMAT_CHOICES, default="auto", dest="fmt", help="input trace format"
    )
    cap.set_defaults(func=_cap)

    synth = sub.add_parser(
        "synth",
        help="generate a seeded multi-turn trace (generic JSONL)",
        description="Multi-turn sessions over shared system prompts, Zipf turns per session, "
        "Poisson session arrivals (see traces/trace/synth.py for the model).",
        formatter_class=_HELP,
    )
    d = SynthConfig()
    # the counts are bounded by what a trace file can hold, not only by 2**53
    synth.add_argument("--sessions", type=SESSIONS, default=d.sessions, help="sessions")
    synth.add_argument("--rate", type=POSITIVE, default=d.rate, help="new sessions per second")
    synth.add_argument(
        "--system-prompts", type=SESSIONS_OR_NONE, default=d.system_prompts,
        help="shared system prompts",
    )  # fmt: skip
    synth.add_argument(
        "--system-prompt-tokens", type=CONTEXT_OR_NONE, default=d.system_prompt_tokens,
        help="their length",
    )  # fmt: skip
    synth.add_argument("--turns-alpha", type=POSITIVE, default=d.turns_alpha, help="Zipf exponent")
    synth.add_argument("--max-turns", type=TURNS, default=d.max_turns, help="turns cap/session")
    synth.add_argument(
        "--user-tokens", type=MEAN_TOKENS, default=d.user_tokens, help="mean user message tokens"
    )
    synth.add_argument(
        "--output-tokens", type=MEAN_TOKENS, default=d.output_tokens, help="mean output tokens"
    )
    synth.add_argument(
        "--think-time", type=SECONDS_OR_OFF, default=d.think_time,
        help="mean seconds between turns",
    )  # fmt: skip
    synth.add_argument(
        "--max-context", type=CONTEXT, default=d.max_context, help="a session ends before this"
    )
    synth.add_argument("--seed", type=SEED, default=d.seed, help="numpy default_rng seed")
    synth.add_argument("--out", default="synthetic_trace.jsonl", help="'-' = stdout")
    synth.set_defaults(func=_synth)

    models = sub.add_parser(
        "models",
        help="give each session a model (base model or LoRA adapter) by a hash of its id",
        description="Each session names one of the models given (NAME or NAME:WEIGHT), "
        "chosen by crc32 of its id, in proportion to the weights; write generic JSONL with "
        "'model' set (replay sends it, simulate runs the non-base ones as LoRA adapters).",
        formatter_class=_HELP,
    )
    models.add_argument("input", type=Path, help="trace file (or Weka directory)")
    models.add_argument("output", help="generic JSONL to write ('-' = stdout)")
    models.add_argument(
        "--model", nargs="+", required=True, metavar="NAME[:WEIGHT]", help="the models"
    )
    models.add_argument(
        "--format", choices=_FORMAT_CHOICES, default="auto", dest="fmt", help="input trace format"
    )
    models.set_defaults(func=_models)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fail(exc: Exception) -> int:
    print(f"cache-router trace: error: {exc}", file=sys.stderr)
    return 1


def _stats(args: argparse.Namespace) -> int:
    try:
        requests = load_trace(args.file, args.fmt)
    except (OSError, TraceFormatError) as exc:
        return _fail(exc)
    stats = trace_stats(requests)
    if args.json:
        print(json.dumps({"file": str(args.file), **stats}, indent=1))
    else:
        print(format_stats(stats, title=str(args.file)))
    return 0


def _cap(args: argparse.Namespace) -> int:
    try:
        requests = load_trace(args.input, args.fmt)
        kept = build_capped_trace(requests, args.max_turns)
        write_jsonl(kept, args.output)
    except (OSError, TraceFormatError) as exc:
        return _fail(exc)
    sessions = len({r.session_id for r in requests})
    tokens = sum(r.input_length for r in requests)
    share = sum(r.input_length for r in kept) / tokens if tokens else 0.0
    print(
        f"kept {len(kept):,} of {len(requests):,} requests ({sessions:,} sessions, "
        f"{share:.1%} of input tokens) -> {args.output}",
        file=sys.stderr,
    )
    return 0


def _models(args: argparse.Namespace) -> int:
    try:
        weights = parse_model_weights(args.model)
        requests = assign_models(load_trace(args.input, args.fmt), weights)
        write_jsonl(requests, args.output)
    except (OSError, ValueError) as exc:
        return _fail(exc)
    counts: dict[str, int] = {}
    for req in requests:
        counts[req.model] = counts.get(req.model, 0) + 1
    print(", ".join(f"{m}: {n:,}" for m, n in counts.items()), file=sys.stderr)
    return 0


def synth_config(args: argparse.Namespace) -> SynthConfig:
    """``trace synth``'s options as a config; ValueError when they do not fit together."""
    cfg = SynthConfig(
        sessions=args.sessions,
        rate=args.rate,
        system_prompts=args.system_prompts,
        system_prompt_tokens=args.system_prompt_tokens,
        turns_alpha=args.turns_alpha,
        max_turns=args.max_turns,
        user_tokens=args.user_tokens,
        output_tokens=args.output_tokens,
        think_time=args.think_time,
        max_context=args.max_context,
        seed=args.seed,
    )
    cfg.validate()
    return cfg


def _synth(args: argparse.Namespace) -> int:
    try:
        cfg = synth_config(args)
    except ValueError as exc:
        return refuse("trace synth", exc)
    try:
        requests = synthesize(cfg)
        write_jsonl(requests, args.out)
    except (OSError, ValueError) as exc:
        return _fail(exc)
    print(format_stats(trace_stats(requests), title=f"wrote {args.out}"), file=sys.stderr)
    return 0
