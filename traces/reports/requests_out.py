"""``simulate --requests-out FILE``: every request's outcome, one JSON line per request and policy.

The tables report percentiles; comparing two policies, or the simulator against a live run
(replay) or a measured GPU, needs each request's own figures, keyed by the request's position
in the trace given to ``simulate`` (``index``, from 0; ``capped``'s requests keep the full
trace's indices, since its trace is a subset of the same requests). Lines come policy by
policy, each policy's in trace order.

Fields: ``policy``, ``index``, ``request_id``, ``session_id``, ``turn``, ``status`` ("ok", or
"rejected" by flow control: no first token), ``arrival_s`` (when the client sent it: session
pacing can hold a turn past its recorded arrival), ``ttft_s``, ``e2e_s`` (null when
rejected), ``input_length``, ``output_length``, ``cached_tokens`` (the worker's true hit,
both tiers), ``estimated_tokens`` (the router's estimate at booking), ``worker`` (its index;
a disaggregated fleet's prefill worker), ``predicted_ttft_s`` (the router's predicted TTFT:
its cost model at booking plus what the request had waited before; null where none), plus
``cpu_cached_tokens`` with a CPU tier and
``decode_worker`` / ``transfer_s`` in a disaggregated fleet.

``replay`` and ``sweep`` write the same lines for a live run (:func:`write_live_requests`),
times in the modelled deployment's seconds as their tables read them: ``status`` is "ok" or
the router's HTTP status ("429", ...; "error" where none came), ``worker`` indexes the
workers by URL and ``worker_url`` names it; the client cannot see the router's estimate, so
``estimated_tokens`` is null and ``predicted_ttft_s`` absent (the router exports its
prediction error as a metric).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from traces.trace.record import TraceRequest
from traces.trace.run import PolicyRun


class LiveRun(Protocol):
    """What a live run's lines need (``traces.live.replay.ReplayOutcome`` has it)."""

    run: PolicyRun
    trace: Sequence[TraceRequest]  # the trace replayed
    answered: np.ndarray  # positions in ``trace`` of ``run``'s rows
    status: np.ndarray  # per request of ``trace``: the router's HTTP status (0: none)
    served_by: list[str]  # ``run.worker``'s index -> the worker's URL


def request_lines(
    run: PolicyRun, trace: Sequence[TraceRequest], index: Sequence[int]
) -> Iterator[dict[str, Any]]:
    """One record per request of ``run`` (which ran ``trace``), ``index`` each one's
    position in the trace given to ``simulate``."""
    rejected = run.rejected
    for i, req in enumerate(trace):
        ok = rejected is None or not rejected[i]
        arrival = float(run.arrival[i])
        line: dict[str, Any] = {
            "policy": run.name,
            "index": int(index[i]),
            "request_id": req.request_id,
            "session_id": req.session_id,
            "turn": req.turn,
            "status": "ok" if ok else "rejected",
            "arrival_s": round(arrival, 6),
            "ttft_s": round(float(run.first_token[i]) - arrival, 6) if ok else None,
            "e2e_s": round(float(run.finish[i]) - arrival, 6) if ok else None,
            "input_length": int(run.input_length[i]),
            "output_length": int(run.output_length[i]),
            "cached_tokens": int(run.cached[i]),
            "estimated_tokens": _number(run.estimated[i]),
            "worker": int(run.worker[i]),
        }
        if run.predicted_ttft is not None:
            line["predicted_ttft_s"] = _number(run.predicted_ttft[i]) if ok else None
        if run.cpu_cached is not None:
            line["cpu_cached_tokens"] = int(run.cpu_cached[i])
        if run.decode_worker is not None:
            line["decode_worker"] = int(run.decode_worker[i])
        if run.transfer_s is not None:
            line["transfer_s"] = _number(run.transfer_s[i])
        yield line


def _number(value: float) -> float | None:
    value = float(value)
    return round(value, 6) if math.isfinite(value) else None


def write_requests(
    path: Path,
    trace: Sequence[TraceRequest],
    runs: Sequence[PolicyRun],
    traces: Mapping[str, Sequence[TraceRequest]],
) -> int:
    """Every run's requests to ``path`` (JSON lines; ``traces[run.name]`` the trace it ran,
    its requests found in ``trace`` by identity); the number of lines written."""
    position = {id(r): i for i, r in enumerate(trace)}
    return _dump(
        path,
        chain.from_iterable(
            request_lines(run, traces[run.name], [position[id(r)] for r in traces[run.name]])
            for run in runs
        ),
    )


def live_request_lines(outcome: LiveRun, index: Sequence[int]) -> Iterator[dict[str, Any]]:
    """One record per request of a live run's trace (``outcome.trace``), ``index`` each one's
    position in the trace given to the command; the unanswered ones with their status."""
    run = outcome.run
    answered = dict(
        zip(
            outcome.answered.tolist(),
            request_lines(
                run,
                [outcome.trace[k] for k in outcome.answered],
                [index[k] for k in outcome.answered],
            ),
            strict=True,
        )
    )
    for k, req in enumerate(outcome.trace):
        line = answered.get(k)
        if line is not None:
            line["estimated_tokens"] = None
            line["worker_url"] = outcome.served_by[line["worker"]]
            yield line
            continue
        code = int(outcome.status[k])
        yield {
            "policy": run.name,
            "index": int(index[k]),
            "request_id": req.request_id,
            "session_id": req.session_id,
            "turn": req.turn,
            "status": str(code) if code and code != 200 else "error",
            "arrival_s": None,
            "ttft_s": None,
            "e2e_s": None,
            "input_length": req.input_length,
            "output_length": req.output_length,
            "cached_tokens": None,
            "estimated_tokens": None,
            "worker": None,
            "worker_url": None,
        }


def write_live_requests(
    path: Path, trace: Sequence[TraceRequest], outcomes: Sequence[LiveRun]
) -> int:
    """Every live run's requests to ``path``, as :func:`write_requests` does offline (each
    outcome's trace found in ``trace`` by identity); the number of lines written."""
    position = {id(r): i for i, r in enumerate(trace)}
    return _dump(
        path,
        chain.from_iterable(
            live_request_lines(o, [position[id(r)] for r in o.trace]) for o in outcomes
        ),
    )


def _dump(path: Path, lines: Iterable[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w") as out:
        for line in lines:
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            n += 1
    return n
