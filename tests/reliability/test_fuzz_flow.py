"""Flow control fuzzed: request sequences with random priorities, flows, deadlines, models,
disconnects and worker removals through ``serve`` (real HTTP on 127.0.0.1), the invariants
checked after each sequence.

After every sequence, whatever was drawn:

- every request was answered exactly once (200; 404 for a model nobody serves; 429 or 503
  with ``Retry-After`` and, from the router, an OpenAI-style JSON error; a worker whose
  models the router has not read yet, just re-added, answers an unknown model's 404
  itself), or its client left (we closed its connection);
- ``requests_total`` rose by exactly the number of requests sent (answered or gone);
- nothing is held: no request in flight, the queue empty, its gauges at 0, every booking 0;
- every request that entered flow control ended once: dispatched + rejected rose by as many
  as entered it;
- the label sets whose values come from clients (band, flow) stay within their caps.

Shutdowns with requests queued are fuzzed in :mod:`test_fuzz_shutdown` (a process per case).
With ``CACHE_ROUTER_SLOW=1``, more sequences and a check that the router's memory stays flat.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest
from flow_support import FLOW, flow_prompt
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from reliability_support import all_zero, booked, wait_until

from router.core.flow_labels import BAND_LABELS_MAX, FLOW_LABELS_MAX

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"
EXAMPLES = 60 if SLOW else 12
ADMIN = "fuzz-admin-key"
MODEL = "fake-model"
FLOW_CAP = FLOW_LABELS_MAX + 1  # + "other"
BAND_CAP = BAND_LABELS_MAX + 1

priority = st.one_of(
    st.integers(-3, 3),
    st.integers(-(10**12), 10**12),
    st.sampled_from(["", "abc", "1e3", " 7 ", "99999999999999999999999", "-0", "+2"]),
)
send = st.fixed_dictionaries(
    {
        "priority": st.none() | priority,
        "flow": st.none()
        | st.sampled_from(["a", "b", "c"])
        | st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8),
        "slo_ms": st.none() | st.sampled_from(["50", "2000", "0", "-5", "nan", "x"]),
        "model": st.sampled_from([MODEL] * 6 + ["no-such-model"]),
        "long": st.integers(0, 9).map(lambda n: n == 0),
    }
).map(lambda d: ("send", d))
action = st.one_of(
    *[send] * 6,
    st.integers(0, 30).map(lambda i: ("leave", i)),
    st.integers(0, 1).map(lambda i: ("remove", i)),
    st.just(("restore", None)),
    st.sampled_from([0.0, 0.02, 0.1]).map(lambda s: ("pause", s)),
)


def headers_of(d: dict) -> dict[str, str]:
    out = {}
    if d["priority"] is not None:
        out["x-priority"] = str(d["priority"])
    if d["flow"] is not None:
        out["x-llm-d-inference-fairness-id"] = d["flow"]
    if d["slo_ms"] is not None:
        out["x-llm-d-slo-ttft-ms"] = d["slo_ms"]
    return out


def metrics(url: str) -> dict[str, list]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def total(samples: list, name: str) -> float:
    return sum(s.value for s in samples if s.name == name)


RETRIED = {"connect_error", "reset"}  # an attempt tried again elsewhere: not an answer


def answered(families: dict[str, list]) -> float:
    """Requests counted by endpoint (a series per endpoint and status: none drops out when
    a worker leaves, as ``requests_total``'s worker series do), less retried attempts."""
    return sum(
        s.value
        for s in families["cache_router_endpoint_requests"]
        if s.name.endswith("_total") and s.labels["status"] not in RETRIED
    )


def label_values(families: dict[str, list], label: str) -> set[str]:
    return {
        s.labels[label]
        for name, samples in families.items()
        if name.startswith("cache_router_flow")
        for s in samples
        if label in s.labels
    }


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.fixture
def fleet(fake_workers, router_server):
    workers = fake_workers(2, delay=0.05)
    router = router_server(
        workers=[w.url for w in workers],
        admin_key=ADMIN,
        flow_queue_max=6,
        flow_queue_ttl_s=0.6,
        **FLOW,
    )
    return router, workers


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


async def open_request(port: int, d: dict, i: int) -> tuple[asyncio.StreamWriter, asyncio.Task]:
    """Send one request whole on its own connection (so the router has it before any
    ``leave``); the task reads its answer."""
    body = json.dumps(
        {
            "model": d["model"],
            "prompt": flow_prompt(f"r{i}") * (4 if d["long"] else 1),
            "max_tokens": 2,
        }
    ).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers_of(d).items())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
        % (len(body), head.encode(), body)
    )
    await writer.drain()
    return writer, asyncio.create_task(read_answer(reader))


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    raw = await asyncio.wait_for(reader.read(-1), 15)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return Answer(int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body)


async def run_sequence(router, workers, actions) -> tuple[list, int]:
    """Play ``actions``; returns each request's outcome (an :class:`Answer`, or "gone")
    and how many requests were sent."""
    admin = {"x-admin-key": ADMIN}
    removed: set[str] = set()
    sent: list[tuple[asyncio.StreamWriter, asyncio.Task]] = []
    async with httpx.AsyncClient(base_url=router.url, timeout=15) as client:
        for i, (kind, arg) in enumerate(actions):
            if kind == "send":
                sent.append(await open_request(router.port, arg, i))
            elif kind == "leave" and sent:
                writer, task = sent[arg % len(sent)]
                task.cancel()
                writer.close()
            elif kind == "remove":
                url = workers[arg].url
                if url not in removed:
                    r = await client.request("DELETE", "/workers", json={"url": url}, headers=admin)
                    assert r.status_code == 200, r.text
                    removed.add(url)
            elif kind == "restore":
                for url in sorted(removed):
                    r = await client.post("/workers", json={"url": url}, headers=admin)
                    assert r.status_code == 201, r.text
                removed.clear()
            elif kind == "pause":
                await asyncio.sleep(arg)
            await asyncio.sleep(0)
        for url in sorted(removed):
            r = await client.post("/workers", json={"url": url}, headers=admin)
            assert r.status_code == 201, r.text
        done = await asyncio.gather(*(task for _, task in sent), return_exceptions=True)
        for writer, _ in sent:
            writer.close()
    outcomes = ["gone" if isinstance(d, asyncio.CancelledError) else d for d in done]
    return outcomes, len(sent)


def check_answer(outcome) -> int | None:
    if outcome == "gone":
        return None
    assert isinstance(outcome, Answer), repr(outcome)
    status = outcome.status
    assert status in (200, 404, 429, 503), (status, outcome.body[:300])
    if status != 200 and "x-cache-router-worker" not in outcome.headers:  # the router's own
        assert outcome.headers["content-type"].startswith("application/json")
        error = outcome.json()["error"]
        assert isinstance(error["message"], str) and isinstance(error["code"], str)
    if status in (429, 503):
        assert int(outcome.headers["retry-after"]) >= 1
    return status


def settled(router) -> bool:
    flow = router.app.core.flow
    return router.app.pool.stats.in_flight == 0 and len(flow.queue) == 0


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],  # a failing sequence as drawn: shrinking
)  # a sequence of timed requests takes minutes and finds nothing simpler
@given(actions=st.lists(action, min_size=6, max_size=30))
def test_fuzzed_flow_control_answers_once_and_holds_nothing(fleet, actions) -> None:
    router, workers = fleet
    before = metrics(router.url)
    outcomes, sent = asyncio.run(run_sequence(router, workers, actions))
    statuses = Counter(check_answer(o) for o in outcomes)
    assert wait_until(lambda: settled(router), timeout=10), router.call(
        lambda: router.app.core.flow.describe()
    )
    after = metrics(router.url)
    # every request counted once, answered or gone
    counted = answered(after) - answered(before)
    assert counted == sent, (counted, sent, statuses)
    # nothing held: gauges at 0, bookings 0
    assert total(after["cache_router_flow_queued"], "cache_router_flow_queued") == 0
    assert total(after["cache_router_flow_queued_bytes"], "cache_router_flow_queued_bytes") == 0
    assert total(after["cache_router_in_flight"], "cache_router_in_flight") == 0
    assert all_zero(router.call(lambda: booked(router.app)))
    # every request that entered flow control ended there once: each one answered, and at
    # most those whose client left too (one that left before its body was read never entered)
    ended = sum(
        total(after[f], f + "_total") - total(before.get(f, []), f + "_total")
        for f in ("cache_router_flow_dispatched", "cache_router_flow_rejected")
    )
    answered_all = sum(o != "gone" for o in outcomes)
    assert answered_all <= ended <= sent, (ended, answered_all, statuses)
    # client-chosen label values stay bounded
    assert len(label_values(after, "band")) <= BAND_CAP
    assert len(label_values(after, "flow")) <= FLOW_CAP
    report(sent=sent, statuses={str(k): v for k, v in statuses.items()}, actions=len(actions))


def report(**summary) -> None:
    """One line per sequence to ``CACHE_ROUTER_FUZZ_REPORT`` (bench/RESULTS.md's counts)."""
    out = os.environ.get("CACHE_ROUTER_FUZZ_REPORT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"test": "flow", **summary}) + "\n")


@pytest.mark.slow
def test_fuzzed_flow_control_memory_stays_flat(fleet) -> None:
    """Thousands of distinct priorities and flows, in rounds: the router's peak memory
    after the first rounds grows by less than a few MB over the rest."""
    router, workers = fleet
    rng = __import__("random").Random(7)

    def round_of(n: int) -> list:
        return [
            (
                "send",
                {
                    "priority": rng.randint(-(10**9), 10**9),
                    "flow": f"f{rng.randrange(10**9)}",
                    "slo_ms": None,
                    "model": MODEL,
                    "long": False,
                },
            )
            for _ in range(n)
        ]

    for _ in range(3):
        asyncio.run(run_sequence(router, workers, round_of(200)))
    warm = rss_mb()
    for _ in range(10):
        asyncio.run(run_sequence(router, workers, round_of(200)))
    assert wait_until(lambda: settled(router), timeout=10)
    families = metrics(router.url)
    assert len(label_values(families, "band")) <= BAND_CAP
    assert len(label_values(families, "flow")) <= FLOW_CAP
    assert rss_mb() - warm < 24, (warm, rss_mb())
