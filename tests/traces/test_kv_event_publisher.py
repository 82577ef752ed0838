"""The sim worker's KV event publisher over real ZMQ sockets on 127.0.0.1: the framing the
router's consumer decodes, bind / connect, a dropped batch, and the replay socket."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import zmq

from router.cache.kv_index import END_SEQ, decode_batch
from traces.sim_worker.kv_event_publisher import KVEventPublisher, PublisherConfig, config_from_json
from traces.sim_worker.kv_event_wire import FLAVORS

TIMEOUT_MS = 5000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored(key: int) -> list[dict]:
    tokens = list(range(key, key + 4))
    return [
        {
            "type": "BlockStored",
            "block_hashes": [key],
            "parent_block_hash": None,
            "token_ids": tokens,
            "block_size": 4,
            "medium": "GPU",
        }
    ]


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def subscriber(ctx: zmq.Context, endpoint: str, bind: bool) -> zmq.Socket:
    """A SUB socket whose publisher has completed its handshake (no slow-joiner loss)."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.bind(endpoint) if bind else sub.connect(endpoint)
    assert monitor.poll(TIMEOUT_MS), "no publisher connected"
    monitor.recv_multipart()
    sub.disable_monitor()
    monitor.close(0)
    # a socket handles its new connections when the owning thread uses it: polling lets the
    # SUB send its subscription, which the PUB applies before its next send
    sub.poll(300)
    time.sleep(0.2)
    return sub


def replay(ctx: zmq.Context, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    for _ in range(1000):
        _, seq, payload = dealer.recv_multipart()
        n = int.from_bytes(seq, "big", signed=True)
        if n == END_SEQ:
            break
        out.append((n, payload))
    dealer.close(0)
    return out


@pytest.mark.parametrize("flavor", FLAVORS)
def test_bound_publisher_frames_drop_and_replay(ctx: zmq.Context, flavor: str) -> None:
    port, replay_port = free_port(), free_port()
    config = PublisherConfig(
        f"tcp://127.0.0.1:{port}",
        f"tcp://127.0.0.1:{replay_port}",
        topic="kv",
        flavor=flavor,
        bind=True,
        drop=frozenset({1}),
    )
    pub = KVEventPublisher(config)
    try:
        sub = subscriber(ctx, f"tcp://127.0.0.1:{port}", bind=False)
        for key in (10, 20, 30):
            pub.publish(stored(key))
        got = [sub.recv_multipart() for _ in range(2)]
        assert [(t, int.from_bytes(s, "big")) for t, s, _ in got] == [(b"kv", 0), (b"kv", 2)]
        ts, events = decode_batch(got[1][2])
        assert (
            ts > 0
            and events[0]["type"] == "BlockStored"
            and events[0]["token_ids"]
            == [
                30,
                31,
                32,
                33,
            ]
        )
        # the dropped batch is in the replay buffer, as is everything after it
        assert [seq for seq, _ in replay(ctx, config.replay_endpoint, 1)] == [1, 2]
        assert replay(ctx, config.replay_endpoint, 5) == []
        assert pub.published == 3 and pub.dropped == 1 and pub.replays == 2
        sub.close(0)
    finally:
        pub.close()


def test_publisher_connects_to_a_bound_subscriber(ctx: zmq.Context) -> None:
    port = free_port()
    pub = KVEventPublisher(PublisherConfig(f"tcp://127.0.0.1:{port}"))  # a host: connect
    assert not pub.config.binds
    try:
        sub = subscriber(ctx, f"tcp://127.0.0.1:{port}", bind=True)
        pub.publish([{"type": "AllBlocksCleared"}])
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"" and seq == (0).to_bytes(8, "big")
        assert decode_batch(payload)[1] == [{"type": "AllBlocksCleared"}]
        sub.close(0)
    finally:
        pub.close()


def test_config_follows_the_engines_flag() -> None:
    assert PublisherConfig("tcp://*:5557").binds and PublisherConfig("ipc:///tmp/x").binds
    assert not PublisherConfig("tcp://10.0.0.1:5557").binds
    raw = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    config = config_from_json(raw, "sglang", None, [3])
    assert config is not None and config.flavor == "sglang" and config.drop == {3}
    assert config_from_json({**raw, "publisher": "null"}, "vllm", None) is None
    assert config_from_json({**raw, "enable_kv_cache_events": False}, "vllm", None) is None
    with pytest.raises(ValueError, match="unknown"):
        config_from_json({**raw, "endpont": "x"}, "vllm", None)
    with pytest.raises(ValueError, match="flavor"):
        PublisherConfig("tcp://*:1", flavor="trt")
