"""Every label a client can choose stays bounded: ``/metrics`` (each family the router
exports), ``/workers/flow`` and ``/dashboard/data`` hold no more series or entries after
hundreds of distinct client-chosen values than after the first few hundred.

One router with flow control in front of one fake worker (real HTTP on 127.0.0.1), three
rounds with the same shape and fresh values each: priorities (``x-priority``, the body's
``priority``), fairness ids, API keys (their tenants are flows), objective names, SLO
headers, sessions, model names, paths; queued then answered 200, shed (429), 404 (no such
model, no such path). The first round fills the caps, the second the ``other`` series; the
third must add nothing: a label that follows the client's values would grow with them."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import httpx
from conftest import wait_until
from flow_support import FLOW, flow_prompt
from prometheus_client.parser import text_string_to_metric_families

from router.core.flow_labels import BAND_LABELS_MAX, FLOW_LABELS_MAX

# a round's requests: queued then answered, shed, and each other kind. The first round has
# more priorities queued than the band cap (32) and more flows shed than the flow cap (100)
FILL = (40, 110, 10)
SMALL = (5, 6, 3)  # (the caps are full then: every later value is "other")
FAIRNESS = "x-llm-d-inference-fairness-id"


def series(router) -> dict[str, set]:
    """Each family's series (its samples' names and labels) in ``/metrics``."""
    text = httpx.get(router.url + "/metrics", timeout=10).text
    out: dict[str, set] = defaultdict(set)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[family.name].add((sample.name, tuple(sorted(sample.labels.items()))))
    return out


def label_values(table: dict[str, set]) -> dict[str, set]:
    values: dict[str, set] = defaultdict(set)
    for samples in table.values():
        for _, labels in samples:
            for name, value in labels:
                values[name].add(value)
    return values


async def posts(url: str, requests: list[tuple[str, dict, dict]]) -> list[httpx.Response]:
    """``requests`` (path, body, headers) at once, on a client of their own (a pool that
    served a crowd is slow to start the next one)."""
    limits = httpx.Limits(max_connections=len(requests))
    async with httpx.AsyncClient(base_url=url, timeout=20, limits=limits) as client:
        return await asyncio.gather(*(client.post(p, json=b, headers=h) for p, b, h in requests))


async def one_round(router, r: int, queued_n: int, shed_n: int, each: int) -> dict:
    """One round of distinct values (``r`` makes them new): ``queued_n`` requests queued
    then answered, ``shed_n`` shed, ``each`` of the other kinds; the views read while the
    queue holds the queued ones."""
    flow, url = router.app.core.flow, router.url
    small = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
    long = {**small, "prompt": flow_prompt(f"blocker{r}") * 8}  # 16 s of the router's model
    base = 1 + r * 1000
    async with httpx.AsyncClient(base_url=url, timeout=20) as alone:
        blocker = asyncio.create_task(  # it saturates the fleet until its client leaves
            alone.post("/v1/completions", json=long, headers={"x-fake-hang": "1"})
        )
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(
            posts(
                url,
                [
                    (
                        "/v1/completions",
                        {**small, "prompt": f"q{r}-{i}"},
                        {"x-priority": str(base + i), FAIRNESS: f"tenant-{r}-{i}"},
                    )
                    for i in range(queued_n)
                ],
            )
        )
        for _ in range(1000):  # all of them queued (bounded wait, on this loop)
            if len(flow.queue) == queued_n:
                break
            await asyncio.sleep(0.01)
        assert len(flow.queue) == queued_n
        views = {
            "flow": (await alone.get("/workers/flow")).json(),
            "dashboard": (await alone.get("/dashboard/data")).json()["flow"],
        }
        shed = [
            (
                "/v1/completions",
                {**small, "prompt": f"s{r}-{i}"},
                {
                    "x-priority": str(-base - i),
                    "x-llm-d-inference-objective": f"objective-{r}-{i}",
                    # a flow each: its fairness id, or its API key's tenant
                    **(
                        {FAIRNESS: f"shed-{r}-{i}"}
                        if i % 2
                        else {"authorization": f"Bearer sk-{r}-{i}"}
                    ),
                },
            )
            for i in range(shed_n)
        ]
        models = [
            ("/v1/completions", {**small, "model": f"model-{r}-{i}"}, {}) for i in range(each)
        ]
        paths = [(f"/v1/unknown-{r}-{i}", small, {}) for i in range(each)]
        answers = await posts(url, shed + models + paths)
        assert [a.status_code for a in answers] == [429] * shed_n + [404] * (2 * each)
        blocker.cancel()  # its client leaves: the worker is free, the queue goes to it
    assert [a.status_code for a in await queued] == [200] * queued_n
    # then answered on the idle fleet: a body priority, an SLO and a session each
    served = [
        (
            "/v1/completions",
            {**small, "priority": base + i, "user": f"u{r}-{i}"},
            {"x-llm-d-slo-ttft-ms": str(base + i), "x-session-id": f"session-{r}-{i}"},
        )
        for i in range(each)
    ]
    assert [a.status_code for a in await posts(url, served)] == [200] * each
    return views


async def test_no_label_or_view_grows_with_the_values_clients_send(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], **FLOW)
    assert wait_until(lambda: all(w.models for w in router.app.pool.workers))
    settled = lambda: router.app.pool.stats.in_flight == 0  # noqa: E731
    views, seen = [], []
    for r, sizes in enumerate((FILL, SMALL, SMALL)):
        views.append(await one_round(router, r, *sizes))
        assert wait_until(settled)
        seen.append(series(router))
    first, second = seen[1:]
    for family, samples in second.items():  # every family: the third round added nothing
        assert samples == first.get(family, set()), family
    values = label_values(second)
    assert len(values["band"]) <= BAND_LABELS_MAX + 1 and "other" in values["band"]
    assert len(values["flow"]) <= FLOW_LABELS_MAX + 1 and "other" in values["flow"]
    assert not any("-2-" in v for name in ("flow", "model") for v in values[name])
    for family in (
        "cache_router_flow_dispatched",
        "cache_router_flow_rejected",
        "cache_router_flow_wait_seconds",
        "cache_router_flow_queued",
        "cache_router_requests",
        "cache_router_endpoint_requests",
        "cache_router_model_requests",
    ):
        assert second[family], family  # driven, not absent
    for view, (queued, _, _) in zip(views, (FILL, SMALL, SMALL), strict=True):
        for listing in (view["flow"], view["dashboard"]):  # at most the caps, then "other"
            assert listing["queued"] == queued
            assert len(listing["bands"]) <= BAND_LABELS_MAX + 1 and "other" in listing["bands"]
            assert sum(b["queued"] for b in listing["bands"].values()) == queued
            assert all(len(b["flows"]) <= FLOW_LABELS_MAX + 1 for b in listing["bands"].values())
            assert len(listing["dispatched"]) <= BAND_LABELS_MAX + 1
