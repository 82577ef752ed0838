"""The sim worker's ``priority`` field, as vLLM takes it: ordered under the priority
scheduling policy, a 400 under the default first-come-first-served one."""

from __future__ import annotations

import httpx
import pytest

from traces.sim.worker_model import WorkerModelConfig
from traces.sim_worker.server import SimWorkerConfig

BODY = {"model": "sim-model", "prompt": "hello " * 100, "max_tokens": 2}


@pytest.mark.parametrize("path", ["/v1/completions", "/generate"])
def test_a_priority_is_a_400_unless_the_engine_schedules_by_priority(sim_worker_in_thread, path):
    body = dict(BODY, priority=7)
    if path == "/generate":
        body = {"text": BODY["prompt"], "sampling_params": {"max_new_tokens": 2}, "priority": 7}
    for policy, status in (("fcfs", 400), ("priority", 200)):
        config = SimWorkerConfig(WorkerModelConfig(scheduling_policy=policy), time_scale=50)
        with sim_worker_in_thread(config) as url:
            r = httpx.post(url + path, json=body, timeout=10)
            assert r.status_code == status, r.text
            if status == 400:
                assert "Priority scheduling is not enabled" in r.json()["error"]["message"]
            plain = httpx.post(url + path, json={**body, "priority": 0}, timeout=10)
            assert plain.status_code == 200  # priority 0 is every engine's default


def test_a_priority_that_is_no_integer_is_a_400(sim_worker_in_thread):
    config = SimWorkerConfig(WorkerModelConfig(scheduling_policy="priority"), time_scale=50)
    with sim_worker_in_thread(config) as url:
        r = httpx.post(url + "/v1/completions", json=dict(BODY, priority="high"), timeout=10)
        assert r.status_code == 400
        assert "priority" in r.json()["error"]["message"]
