"""The worker pool: membership, picker rebuilt on removal, exclusion of tried workers,
health thresholds and the shadow reset of a worker that comes back; the health checker."""

from __future__ import annotations

import pytest

from policies.base import NoHealthyWorker, RequestFeatures
from router.cache.block_hash import hash_blocks, token_bytes
from router.config import load_settings
from router.fleet.health import HealthChecker
from router.fleet.pool import WorkerPool


def features(tokens, session=None):
    buf = token_bytes(tokens)
    return RequestFeatures(hash_blocks(buf, 512), len(tokens), session, buf)


def pool(**kw):
    return WorkerPool(load_settings(workers=["a:1", "b:2"], kv_capacity_tokens=8192, **kw))


def test_membership_and_sizes():
    p = pool(worker_kv_capacity_tokens={"http://b:2": 4096})
    assert [w.url for w in p.workers] == ["http://a:1", "http://b:2"]
    assert p.workers[0].state.blocks.capacity_blocks == 16
    assert p.workers[1].state.radix.capacity_tokens == 4096
    with pytest.raises(ValueError, match="already"):
        p.add("http://a:1/")
    c = p.add("c:3", kv_capacity_tokens=1024)
    assert p.states[-1] is c.state and c.capacity_blocks == 2
    with pytest.raises(KeyError):
        p.remove("http://nope:1")


def test_removal_rebuilds_the_picker_and_in_flight_bookings_still_release():
    p = pool(policy="sticky")
    req = features(list(range(1000)), session="s")
    first, _ = p.pick(req)
    booking = first.state.book(req)
    old_picker = p.picker
    removed = p.remove(first.url)
    assert p.picker is not old_picker and removed.removed and first not in p.workers
    other, _ = p.pick(req)
    assert other is not first  # the session is routed again among what is left
    booking.finish()  # releases on the removed worker's own state
    assert removed.state.num_requests == 0 and removed.state.blocks.pinned_blocks == 0


def test_tried_workers_are_excluded_then_none_is_left():
    p = pool()
    req = features([1, 2, 3])
    a, _ = p.pick(req)
    b, _ = p.pick(req, [a])
    assert b is not a
    with pytest.raises(NoHealthyWorker):
        p.pick(req, [a, b])


def test_failures_take_a_worker_out_and_success_resets_its_shadow():
    p = pool(health_failure_threshold=2, circuit_open_s=0)  # (cooldown: test_circuit.py)
    w = p.workers[0]
    w.state.book(features(list(range(2048)))).finish()
    w.state.blocks.resize(3)
    assert len(w.state.blocks) == 3
    p.record_failure(w, "connect refused")
    assert w.healthy
    p.record_failure(w, "connect refused")
    assert not w.healthy and w.last_error == "connect refused"
    assert p.pick(features([1]))[0] is p.workers[1]
    p.record_success(w)
    assert w.healthy and w.consecutive_failures == 0
    assert len(w.state.blocks) == 0 and w.state.blocks.capacity_blocks == 16  # restarted
    assert w.state.radix.total_tokens == 0


async def test_health_checker_probes(fake_workers):
    up, down = fake_workers(2)
    settings = load_settings(
        workers=[up.url, down.url], health_failure_threshold=1, circuit_open_s=0
    )
    p = WorkerPool(settings)
    down.healthy = False  # answers 503
    checker = HealthChecker(p)
    await checker.probe_all()
    assert p.workers[0].healthy and not p.workers[1].healthy
    assert p.workers[1].last_error == "health probe: HTTP 503"
    down.healthy = True
    await checker.probe_all()
    assert p.workers[1].healthy
    down.kill()
    assert not await checker.probe(p.workers[1])
    assert "connect" in p.workers[1].last_error
    p.close()
