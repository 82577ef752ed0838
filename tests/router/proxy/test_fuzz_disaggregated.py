"""Fuzzing both legs of disaggregated serving: every way a worker fails, on either leg, in
either engine's protocol, streamed or not (hypothesis → real HTTP → the router → real
workers on 127.0.0.1).

A fleet per protocol: two prefill and two decode :class:`~pd_support.PdWorker` servers, each
told per example how to answer: as its engine does (``ok``; a vLLM prefill may also give
``null`` params), or by a connection reset or close, a 5xx, a garbage 200 (not JSON, not an
object, params missing or not an object, empty), a hang (the router's read timeout is small
here), headers then close, or half its answer (half an SSE stream) then close. After every
example:

- the client got a whole 200 (the decode worker's answer as it sent it: the text, its
  garbage relayed, or a cut stream ended by an error event and ``[DONE]``) or an
  OpenAI-style JSON error with a 5xx status (never a 4xx: every request is valid; never a
  hang, never a cut body); a 200 with the text wherever a pair of good workers could serve
  it and nothing failed in a way that answers at once (a hang, a stream cut, a garbage
  decode answer);
- every booking was released, once: each worker's load, pinned blocks and locked radix
  tokens, and the router's in-flight gauge back to 0;
- only a failing worker was counted as failing, and a failing worker that was alone to fail
  was counted (a prefill worker's failure is its own, not the client's nor its decode's);
- a request failure never took out the last prefill or decode worker, and ``/health``
  agrees with the healthy workers of each role.

Circuits open at the first failure (``health_failure_threshold`` 1), and every example starts
from a closed one (probes are off: the suite alone decides). Volume:
``CACHE_ROUTER_FUZZ_EXAMPLES`` (default 5,000 with ``CACHE_ROUTER_SLOW=1``, else 600), shared by
the two protocols; ``CACHE_ROUTER_FUZZ_REPORT=FILE`` appends the counts as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import RouterServer, wait_until
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reliability_support import all_zero, booked

from router.config import load_settings

sys.path.insert(0, str(Path(__file__).parent))

from pd_support import (
    CUT_BODY,
    FAILURES,
    GARBAGE,
    HANG,
    MODEL,
    NULL_KV,
    OK,
    TEXT,
    Handoff,
    PdWorker,
    WorkerLoop,
    sse_text,
)

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"
TOTAL = int(os.environ.get("CACHE_ROUTER_FUZZ_EXAMPLES", 5000 if SLOW else 600))
READ_TIMEOUT_S = 0.5
CLIENT_TIMEOUT_S = 10.0  # far past anything the router may take: a timeout here is a hang
ROLES = ("prefill", "prefill", "decode", "decode")


def fuzz_settings(share: float) -> settings:
    return settings(
        max_examples=max(20, int(TOTAL * share)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


pytestmark = pytest.mark.slow  # ~50 s of fuzzed P/D fleets on 2 cores: CACHE_ROUTER_SLOW=1


@dataclass(frozen=True)
class Case:
    behaviours: tuple[str, str, str, str]  # prefill 0, prefill 1, decode 0, decode 1
    path: str
    stream: bool
    usage: bool  # a stream that asks for the usage chunk

    def body(self, salt: int) -> dict:
        body: dict = {"model": MODEL, "max_tokens": 8, "stream": self.stream}
        if self.path == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": f"question {salt}: why? " * 8}]
        else:
            body["prompt"] = f"complete {salt}: " * 8
        if self.usage:
            body["stream_options"] = {"include_usage": True}
        return body


class Fleet:
    """The router (as ``serve`` runs it, in its thread) in front of two prefill and two
    decode workers of ``flavor``, and what the suite counted."""

    def __init__(self, flavor: str) -> None:
        self.flavor = flavor
        self.loop = WorkerLoop()
        self.handoff = Handoff()
        self.workers = [self._worker_of(role, i) for i, role in enumerate(ROLES)]
        prefill_flags: list[str] = []
        for w in self.workers[:2]:
            prefill_flags += [w.url] + ([str(w.bootstrap_port)] if flavor == "sglang" else [])
        self.router = RouterServer(
            load_settings(
                prefill_workers=prefill_flags,
                decode_workers=[w.url for w in self.workers[2:]],
                pd_protocol=flavor,
                policy="round_robin",  # both prefill workers take first legs
                read_timeout_s=READ_TIMEOUT_S,
                connect_timeout_s=1.0,
                health_interval_s=3600.0,  # no probes: the suite opens and closes circuits
                health_failure_threshold=1,
                worker_metrics_interval_s=0,
                log_level="critical",
            )
        )
        self.client = httpx.Client(base_url=self.router.url, timeout=CLIENT_TIMEOUT_S)
        self.examples = 0
        self.statuses: Counter[str] = Counter()
        self.hit: Counter[str] = Counter()  # (role, behaviour) of the workers a request reached
        self.started = time.monotonic()

    def _worker_of(self, role: str, i: int) -> PdWorker:
        """A worker; an SGLang prefill worker's bootstrap port is only a number here (its
        rooms live in the shared Handoff), and a decode waits for a room longer than the
        router waits for it."""
        worker = PdWorker(role, self.flavor, self.handoff, bootstrap_port=19100 + i,
                          kv_wait_s=4 * READ_TIMEOUT_S)  # fmt: skip
        return self.loop.run(worker.start())

    def close(self) -> None:
        self.client.close()
        self.router.stop()
        for worker in self.workers:
            self.loop.loop.call_soon_threadsafe(worker.close)
        self.loop.close()

    # ---- one example -----------------------------------------------------------------------

    def run(self, case: Case) -> None:
        status, headers, body = self._send(case)
        self._check_released()
        stalled = self._ok_worker_blamed(self._failures())
        if stalled or (status == 504 and _must_succeed(self.flavor, case) and _timed_out(body)):
            # an ok worker stalled past the 0.5 s read timeout (a loaded machine, a long GC
            # pause of this process): the router answered as it must, and released what it
            # held; the case is sent again, where a fault of the router's fails the same way
            # (and test_fuzzed_fleets_reached_every_leg bounds how often this happens)
            self.statuses[f"resent: an ok worker's stall ({stalled or 'a 504'})"] += 1
            status, headers, body = self._send(case)
            self._check_released()
        self._check_answer(case, status, headers, body)
        self._check_blame(case)
        self._check_health()

    def _send(self, case: Case) -> tuple[int, httpx.Headers, bytes]:
        self._reset(case)
        self.examples += 1
        try:
            r = self.client.post(case.path, json=case.body(self.examples))
        except httpx.TimeoutException:
            raise AssertionError(f"no answer within {CLIENT_TIMEOUT_S} s") from None
        except httpx.HTTPError as exc:  # a cut body, a closed connection
            raise AssertionError(f"incomplete answer: {exc!r}") from None
        self.statuses[str(r.status_code)] += 1
        for worker, behaviour in zip(self.workers, case.behaviours, strict=True):
            if worker.requests:
                self.hit[f"{worker.role}:{behaviour}"] += 1
        return r.status_code, r.headers, r.content

    def _reset(self, case: Case) -> None:
        """Closed circuits, counters at 0, the example's behaviours set."""

        def close_circuits() -> None:
            for w in self.router.app.pool.workers:
                w.consecutive_failures, w.last_failure_request = 0, False
                w.state.healthy, w.opened_at, w.last_error = True, None, None

        self.router.call(close_circuits)
        self.loop.run(_clear(self.handoff))
        for worker, behaviour in zip(self.workers, case.behaviours, strict=True):
            worker.behaviour, worker.requests = behaviour, 0
            worker.refused.clear()

    # ---- the invariants --------------------------------------------------------------------

    def _check_answer(self, case: Case, status: int, headers, body: bytes) -> None:
        refused = [why for w in self.workers for why in w.refused]
        assert not refused, f"a worker refused a leg the router sent: {refused}"
        if status != 200:
            assert 500 <= status < 600, f"{status}: {body[:300]!r}"
            assert headers.get("content-type", "").startswith("application/json"), body[:300]
            error = orjson.loads(body)["error"]
            assert all(isinstance(error[k], str) for k in ("message", "type", "code")), error
            assert not _must_succeed(self.flavor, case), f"{status} where a pair could: {body!r}"
            return
        decode = self._worker(headers.get("x-cache-router-worker"))
        assert decode is not None and decode.role == "decode", headers
        behaviour = decode.behaviour
        if behaviour in GARBAGE:  # the decode worker's answer is the client's, as it is
            assert body == GARBAGE[behaviour], body[:300]
            self.statuses["of the 200s: a decode's garbage, relayed"] += 1
            return
        if case.stream:
            text, errors, done = sse_text(body)
            assert done, f"a stream without [DONE]: {body[-300:]!r}"
            if errors:
                assert behaviour == CUT_BODY, errors
                assert [e["code"] for e in errors] == ["worker_stream_cut"], errors
                assert TEXT.startswith(text), text
                self.statuses["of the 200s: a stream cut, ended by an error event"] += 1
                return
        else:
            data = orjson.loads(body)
            choice = data["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
        assert behaviour == OK and text == TEXT, (behaviour, body[:300])

    def _check_released(self) -> None:
        app = self.router.app

        def state() -> tuple:
            pool = app.pool
            held = [w.state.held_tokens for w in pool.workers]
            return booked(app), held, pool.stats.in_flight

        def released() -> bool:
            rows, held, in_flight = self.router.call(state)
            return all_zero(rows) and not any(held) and in_flight == 0

        assert wait_until(released, 5.0, 0.005), self.router.call(state)

    def _failures(self) -> dict[str, tuple[int, str | None]]:
        """Per worker URL: the failures the router counted, and the last one's reason."""
        pool = self.router.app.pool
        return self.router.call(
            lambda: {w.url: (w.consecutive_failures, w.last_error) for w in pool.workers}
        )

    def _ok_worker_blamed(self, failures: dict[str, tuple[int, str | None]]) -> str | None:
        """Why the router counted a failure (``failures``: :meth:`_failures`) of a worker that
        answered as its engine does (None: it counted none)."""
        for worker in self.workers:
            count, why = failures[worker.url]
            if count and worker.behaviour in (OK, NULL_KV):
                return f"{worker.role}: {why}"
        return None

    def _check_blame(self, case: Case) -> None:
        counted = self._failures()
        failures = {url: count for url, (count, _) in counted.items()}
        blamed = self._ok_worker_blamed(counted)
        assert blamed is None, f"{blamed}, sent again: {case}"
        failing = [w for w in self.workers if _detected(self.flavor, w.role, w.behaviour)]
        if len(failing) == 1 and failing[0].requests:
            alone = failing[0]
            assert failures[alone.url], f"{alone.role} {alone.behaviour} not counted: {case}"

    def _check_health(self) -> None:
        workers = self.client.get("/workers").json()
        healthy = {w["role"] for w in workers if w["healthy"]}
        states = [(w["role"], w["healthy"], w["last_error"]) for w in workers]
        assert healthy == {"prefill", "decode"}, f"a role's last worker was taken out: {states}"
        health = self.client.get("/health")
        assert health.status_code == 200, health.text
        assert health.json()["healthy_by_role"] == {
            role: sum(w["healthy"] for w in workers if w["role"] == role)
            for role in ("prefill", "decode")
        }

    def _worker(self, url: str | None) -> PdWorker | None:
        return next((w for w in self.workers if w.url == url), None)

    def report(self) -> dict:
        summary = {
            "test": f"pd-{self.flavor}",
            "examples": self.examples,
            "seconds": round(time.monotonic() - self.started, 1),
            "statuses": dict(sorted(self.statuses.items())),
            "workers_reached": dict(sorted(self.hit.items())),
        }
        out = os.environ.get("CACHE_ROUTER_FUZZ_REPORT")
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(summary) + "\n")
        return summary


async def _clear(handoff: Handoff) -> None:
    handoff.clear()


def _detected(flavor: str, role: str, behaviour: str) -> bool:
    """Whether the router can see ``behaviour`` as a failure: not a good answer, nor one whose
    body it relays (a decode's garbage) or never reads (an SGLang prefill's)."""
    if behaviour in (OK, NULL_KV):
        return False
    if behaviour in GARBAGE:
        return role == "prefill" and flavor == "vllm"
    return True


def _must_succeed(flavor: str, case: Case) -> bool:
    """Whether the request must get the text: a good prefill and a good decode worker, and no
    failure that answers at once (a hang, a garbage decode answer, a stream cut)."""
    prefill, decode = case.behaviours[:2], case.behaviours[2:]
    if HANG in case.behaviours or any(b in GARBAGE for b in decode):
        return False
    if case.stream and CUT_BODY in decode:
        return False
    good_prefill = (OK, NULL_KV, *(GARBAGE if flavor == "sglang" else ()))
    return any(b in good_prefill for b in prefill) and OK in decode


# ---- strategies ------------------------------------------------------------------------


def behaviour(flavor: str, role: str) -> st.SearchStrategy[str]:
    """``ok`` about half the time, else any failure (a vLLM prefill may give null params)."""
    good = [OK] * len(FAILURES)
    if flavor == "vllm" and role == "prefill":
        good[-3:] = [NULL_KV] * 3
    return st.sampled_from(good + list(FAILURES))


@st.composite
def cases(draw, flavor: str) -> Case:
    behaviours = tuple(draw(behaviour(flavor, role)) for role in ROLES)
    stream = draw(st.booleans())
    return Case(
        behaviours=behaviours,  # type: ignore[arg-type]
        path=draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"])),
        stream=stream,
        usage=stream and draw(st.booleans()),
    )


def _timed_out(body: bytes) -> bool:
    """The router's answer says a worker sent nothing within its read timeout."""
    try:
        return orjson.loads(body)["error"]["code"] == "upstream_timeout"
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False


# ---- tests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleets() -> Iterator[dict[str, Fleet]]:
    made: dict[str, Fleet] = {}
    yield made
    for fleet in made.values():
        fleet.close()


def _fleet(fleets: dict[str, Fleet], flavor: str) -> Fleet:
    if flavor not in fleets:
        fleets[flavor] = Fleet(flavor)
    return fleets[flavor]


@fuzz_settings(0.5)
@given(case=cases("vllm"))
def test_fuzz_vllm_legs(fleets, case: Case) -> None:
    _fleet(fleets, "vllm").run(case)


@fuzz_settings(0.5)
@given(case=cases("sglang"))
@example(  # CI: an ok prefill counted as failing (a stall past the read timeout)
    case=Case(
        behaviours=("ok", "ok", "garbage:not_object", "status:502"),
        path="/v1/chat/completions",
        stream=True,
        usage=True,
    )
)
def test_fuzz_sglang_legs(fleets, case: Case) -> None:
    _fleet(fleets, "sglang").run(case)


def test_fuzzed_fleets_reached_every_leg(fleets) -> None:
    """Runs after the two above (file order): the counts, and that the volume reached each
    role in each way it can fail."""
    for flavor in ("vllm", "sglang"):
        summary = _fleet(fleets, flavor).report()
        print(f"\n{summary}")
        assert summary["examples"] >= 20
        # a stall now and then is the machine's; a router that blames good workers often is not
        resent = sum(n for k, n in summary["statuses"].items() if k.startswith("resent:"))
        assert resent <= max(3, summary["examples"] // 100), summary
        reached = summary["workers_reached"]
        assert {k.split(":")[0] for k in reached} == {"prefill", "decode"}, reached
        assert reached.get("prefill:ok", 0) and reached.get("decode:ok", 0), reached
