"""The peers' routing rules behind the live proxy, as ``serve --policy NAME`` ships them (no
picker parameters), in front of real HTTP workers: every request answered, every pick
counted, nothing left booked."""

from __future__ import annotations

import httpx
import pytest
from conftest import wait_until

PEERS = ("llmd", "llmd_precise", "dynamo", "smg", "aibrix", "vllm_router")


@pytest.mark.parametrize("policy", PEERS)
def test_a_peer_policy_serves_as_shipped(policy, fake_workers, router_server) -> None:
    workers = fake_workers(3)
    router = router_server(workers=[w.url for w in workers], policy=policy)
    prompt = "You are a helpful assistant. " * 300  # several 512-token blocks, shared
    with httpx.Client(base_url=router.url, timeout=10) as client:
        for turn in range(6):
            body = {"model": "fake-model", "prompt": prompt + f"turn {turn}", "max_tokens": 4}
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
    decisions = router.call(lambda: dict(router.app.pool.stats.decisions))
    assert sum(decisions.values()) == 6
    assert wait_until(
        lambda: router.call(lambda: sum(w.state.num_requests for w in router.app.pool.workers)) == 0
    )
