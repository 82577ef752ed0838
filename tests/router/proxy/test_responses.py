"""The Responses API and the engines' other endpoints through the router, in front of real
sim workers (each keeps its stored responses in its own memory, as vLLM does).

- a chain of 8 turns with ``previous_response_id`` (streamed and not) all succeeds, on the
  worker that stored the first, whose prefix cache then serves each turn's conversation;
  ``GET /v1/responses/{id}`` and ``.../input_items`` of each reach it too;
- an id nobody stored, an owner removed from the fleet, an owner out of service: the
  router's own OpenAI-style 404 / 404 / 503, and no booking left behind;
- a chain of 24 turns through ``--processes 2``, once both children serve (one connection
  per request, so turns land on both processes: all 23 continuations on their owner's
  process by chance is a 2**-23 event): the owners are shared;
- ``/v1/embeddings`` reaches the workers, spread by load; counters by endpoint;
- a worker that writes its answer in two TCP writes split inside the response id (a body or
  an event stream): the router learns the id all the same, and the GET reaches the worker;
- a huge unknown id (in the path, or as ``previous_response_id``) is not echoed whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import wait_until
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parents[1]))

from scale_support import need, pids_behind

from traces.live.fleet import HOST, Service, free_port, sim_workers, start_service

SIM_ARGS = ["--time-scale", "50", "--log-level", "warning"]
SYSTEM = "You are a careful assistant. " * 60  # a shared prefix of several blocks


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Service]]:
    with sim_workers(3, SIM_ARGS) as started:
        yield started


def _turn(client: httpx.Client, i: int, previous: str | None, stream: bool) -> tuple[str, dict]:
    """One turn; the response id and (for a stream: the completed event's) response body."""
    body = {"model": "sim-model", "instructions": SYSTEM, "max_output_tokens": 4,
            "input": [{"role": "user", "content": f"turn {i}: tell me more " * 20}],
            "stream": stream}  # fmt: skip
    if previous is not None:
        body["previous_response_id"] = previous
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    if not stream:
        data = r.json()
        return r.headers["x-cache-router-worker"], data
    events = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    return r.headers["x-cache-router-worker"], events[-1]["response"]


def _chain(url: str, stream: bool, turns: int = 8, fresh_connections: bool = False) -> list:
    """``turns`` chained turns; (worker, response) each."""
    out = []
    previous = None
    client = httpx.Client(base_url=url, timeout=30)
    try:
        for i in range(turns):
            if fresh_connections:  # a new connection each turn (--processes: any process)
                client.close()
                client = httpx.Client(base_url=url, timeout=30)
            worker, response = _turn(client, i, previous, stream)
            previous = response["id"]
            out.append((worker, response))
    finally:
        client.close()
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_a_chain_of_turns_stays_on_the_worker_that_stored_it(router_server, workers, stream):
    router = router_server(workers=[w.url for w in workers])
    chain = _chain(router.url, stream)
    owners = {worker for worker, _ in chain}
    assert len(owners) == 1  # every continuation went where its previous response lives
    cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for _, r in chain]
    inputs = [r["usage"]["input_tokens"] for _, r in chain]
    assert inputs == sorted(inputs) and inputs[-1] > inputs[0]  # the conversation grows
    assert all(c > 0 for c in cached[1:])  # and is served from the owner's cache
    with httpx.Client(base_url=router.url, timeout=10) as client:
        for _, response in chain:
            got = client.get(f"/v1/responses/{response['id']}")
            assert got.status_code == 200 and got.json()["id"] == response["id"]
            items = client.get(f"/v1/responses/{response['id']}/input_items")
            assert items.status_code == 200 and items.json()["data"][0]["role"] == "user"
        # the router knows each owner; it asked no one else
        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    endpoint = {
        (s.labels["endpoint"], s.labels["status"]): s.value
        for s in families["cache_router_endpoint_requests"].samples
    }
    assert endpoint[("responses", "200")] == 8
    assert endpoint[("response_call", "200")] == 16
    decisions = {s.labels["branch"]: s.value for s in families["cache_router_decisions"].samples}
    assert decisions["response_owner"] == 7 + 16
    assert families["cache_router_response_owners"].samples[0].value == 8
    assert router.call(lambda: sum(w.state.num_requests for w in router.app.pool.workers)) == 0


def test_a_worker_alone_refuses_an_id_it_did_not_store(workers) -> None:
    """The rule the router follows: another worker answers 404 (vLLM does the same)."""
    a, b = workers[0].url, workers[1].url
    with httpx.Client(timeout=10) as client:
        body = {"input": "hello", "max_output_tokens": 2}
        first = client.post(f"{a}/v1/responses", json=body).json()["id"]
        again = client.post(f"{b}/v1/responses", json={**body, "previous_response_id": first})
        assert again.status_code == 404
        assert client.get(f"{b}/v1/responses/{first}").status_code == 404
        assert client.get(f"{a}/v1/responses/{first}").status_code == 200


def test_unknown_ids_and_a_removed_owner_get_the_routers_own_errors(router_server, workers):
    router = router_server(workers=[w.url for w in workers])
    with httpx.Client(base_url=router.url, timeout=10) as client:
        body = {"input": "hello", "max_output_tokens": 2}
        for r in (
            client.post("/v1/responses", json={**body, "previous_response_id": "resp_nobody"}),
            client.get("/v1/responses/resp_nobody"),
            client.post("/v1/responses/resp_nobody/cancel"),
        ):
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "response_not_found"
            assert "x-cache-router-worker" not in r.headers
        first = client.post("/v1/responses", json=body)
        owner = first.headers["x-cache-router-worker"]
        response_id = first.json()["id"]
        assert client.request("DELETE", f"/workers?url={owner}").status_code == 200
        r = client.post("/v1/responses", json={**body, "previous_response_id": response_id})
        assert r.status_code == 404
        error = r.json()["error"]
        assert error["code"] == "response_owner_gone" and owner in error["message"]
        assert client.get(f"/v1/responses/{response_id}").json()["error"]["code"] == (
            "response_owner_gone"
        )
        # a new conversation still goes anywhere else
        assert client.post("/v1/responses", json=body).status_code == 200
        assert client.post("/v1/responses", json={"max_output_tokens": 2}).status_code == 400


def test_an_owner_out_of_service_is_a_503_not_another_worker() -> None:
    with sim_workers(2, SIM_ARGS) as started:
        port = free_port()
        args = ["serve", "--port", str(port), "--log-level", "warning", "--health-interval-s",
                "0.2", "--worker", *(w.url for w in started)]  # fmt: skip
        router = start_service("router", args, port)
        try:
            with httpx.Client(base_url=router.url, timeout=10) as client:
                first = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2})
                owner = first.headers["x-cache-router-worker"]
                next(w for w in started if w.url == owner).stop()

                def marked_down() -> bool:
                    workers = client.get("/workers").json()
                    return any(w["url"] == owner and not w["healthy"] for w in workers)

                assert wait_until(marked_down, 10)
                body = {"input": "again", "previous_response_id": first.json()["id"]}
                r = client.post("/v1/responses", json=body)
                assert r.status_code == 503 and r.headers["retry-after"]
                assert r.json()["error"]["code"] == "response_owner_unavailable"
        finally:
            router.stop()


def test_processes_share_the_owners(workers) -> None:
    need("redis-server")
    port = free_port()
    args = ["serve", "--host", HOST, "--port", str(port), "--log-level", "warning",
            "--processes", "2", "--worker", *(w.url for w in workers)]  # fmt: skip
    router = start_service("router", args, port, timeout_s=60)
    try:
        assert len(pids_behind(router.url, 2)) == 2  # both children serve before the chain
        chain = _chain(router.url, stream=False, turns=24, fresh_connections=True)
        assert len({worker for worker, _ in chain}) == 1
        text = httpx.get(router.url + "/metrics", timeout=10).text
        lookups = {}
        for family in text_string_to_metric_families(text):
            if family.name == "cache_router_response_owner_lookups":
                for s in family.samples:
                    result = s.labels["result"]
                    lookups[result] = lookups.get(result, 0) + s.value
        assert lookups.get("unknown", 0) == 0
        assert lookups.get("shared", 0) >= 1  # some turn landed on the other process
    finally:
        router.stop()


def test_embeddings_reach_the_workers_spread_by_load(router_server, workers) -> None:
    router = router_server(workers=[w.url for w in workers])
    text = "the quick brown fox " * 400  # a prefill long enough to overlap at time scale 50

    def embed(i: int) -> tuple[int, str, dict]:
        body = {"model": "sim-model", "input": [f"{i} {text}"]}
        r = httpx.post(router.url + "/v1/embeddings", json=body, timeout=30)
        return r.status_code, r.headers.get("x-cache-router-worker", ""), r.json()

    with ThreadPoolExecutor(9) as pool:
        results = list(pool.map(embed, range(18)))
    assert all(status == 200 for status, _, _ in results)
    assert all(len(body["data"][0]["embedding"]) == 8 for _, _, body in results)
    assert len({worker for _, worker, _ in results}) >= 2
    r = httpx.post(router.url + "/v1/embeddings", json={"model": 3, "input": "x"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_type"
    assert router.call(lambda: sum(w.state.num_requests for w in router.app.pool.workers)) == 0


def _form(model: str, audio: bytes, boundary: str = "b0undary") -> tuple[bytes, bytes, str]:
    """A multipart form as OpenAI's client sends it: the fields, then the file."""
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    return (
        head,
        audio + f"\r\n--{boundary}--\r\n".encode(),
        f"multipart/form-data; boundary={boundary}",
    )


@pytest.mark.parametrize("chunked", [False, True])
def test_an_upload_streams_through_not_held_whole(router_server, workers, chunked) -> None:
    """The worker has the upload's first bytes while the client is still sending it, and
    the whole of it, intact, at the end; chunked or with a length."""
    router = router_server(workers=[w.url for w in workers])
    audio = bytes(range(256)) * (3 * 4096)  # 3 MiB
    head, tail, content_type = _form("sim-model", audio)
    body = head + tail
    sent_last = 0.0

    def pieces():
        nonlocal sent_last
        yield head + tail[: 128 << 10]  # more than the router peeks at
        for i in range(128 << 10, len(tail), 512 << 10):
            time.sleep(0.1)  # a slow client: the worker must see bytes before the end
            sent_last = time.time()
            yield tail[i : i + (512 << 10)]

    headers = {"content-type": content_type}
    if not chunked:
        headers["content-length"] = str(len(body))
    r = httpx.post(router.url + "/v1/audio/transcriptions", content=pieces(), headers=headers,
                   timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["bytes"] == len(body) and got["sha256"] == hashlib.sha256(body).hexdigest()
    assert got["first_byte_at"] < sent_last - 0.2  # it arrived while the client still sent
    # the form's model is read from the first bytes: a model nobody serves is the router's 404
    assert wait_until(lambda: router.call(lambda: all(w.models for w in router.app.pool.workers)))
    head, tail, content_type = _form("whisper-nobody", b"x" * 100)
    r = httpx.post(router.url + "/v1/audio/transcriptions", content=head + tail,
                   headers={"content-type": content_type}, timeout=10)  # fmt: skip
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert router.call(lambda: sum(w.state.num_requests for w in router.app.pool.workers)) == 0


def test_a_client_gone_mid_upload_releases_everything(router_server, workers) -> None:
    router = router_server(workers=[w.url for w in workers])
    head, tail, content_type = _form("sim-model", b"z" * (4 << 20))
    request = (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(head) + len(tail)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(request + head + tail[: 1 << 20])  # a quarter, then gone

        def booked() -> int:
            return router.call(lambda: sum(w.state.num_requests for w in router.app.pool.workers))

        assert wait_until(lambda: booked() == 1, 5)  # the upload is on its way to a worker
    assert wait_until(lambda: booked() == 0, 5)
    text = httpx.get(router.url + "/metrics", timeout=5).text
    statuses = {
        s.labels["status"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "cache_router_endpoint_requests"
        for s in f.samples
        if s.labels["endpoint"] == "audio"
    }
    assert statuses == {"client_disconnect": 1}
    # and the router serves on
    head, tail, content_type = _form("sim-model", b"ok")
    r = httpx.post(router.url + "/v1/audio/transcriptions", content=head + tail,
                   headers={"content-type": content_type}, timeout=10)  # fmt: skip
    assert r.status_code == 200


class SplitWorker:
    """A worker whose answer to ``POST /v1/responses`` comes in two TCP writes, cut inside
    its id; it answers ``GET /v1/responses/{id}`` and ``/v1/models``, on 127.0.0.1."""

    def __init__(self, answer: bytes, content_type: bytes, cut: int) -> None:
        self.answer, self.content_type, self.cut = answer, content_type, cut
        self.gets: list[str] = []
        self.connections: set[asyncio.Task] = set()
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            while True:
                await self._answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.connections.discard(task)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        length = next((int(h.split(":")[1]) for h in head
                       if h.lower().startswith("content-length:")), 0)  # fmt: skip
        await reader.readexactly(length)
        if method == "POST" and path == "/v1/responses":
            await self._split(writer)
            return
        if path.startswith("/v1/responses/"):
            self.gets.append(path.rsplit("/", 1)[1])
            out = json.dumps({"id": self.gets[-1], "object": "response"}).encode()
        elif path == "/v1/models":
            out = b'{"object":"list","data":[{"id":"m","object":"model"}]}'
        else:
            out = b"{}"
        writer.write(self._head(b"application/json", len(out)) + out)
        await writer.drain()

    async def _split(self, writer: asyncio.StreamWriter) -> None:
        answer, cut = self.answer, self.cut
        writer.write(self._head(self.content_type, len(answer)) + answer[:cut])
        await writer.drain()
        await asyncio.sleep(0.2)  # the router reads the first part alone
        writer.write(answer[cut:])
        await writer.drain()

    @staticmethod
    def _head(content_type: bytes, length: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
            content_type, length,
        )  # fmt: skip

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            connections = list(self.connections)  # the router's kept-alive connections
            for task in connections:
                task.cancel()
            await asyncio.gather(*connections, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


_SPLIT_BODY = b'{"id":"resp_split3","object":"response","status":"completed","output":[]}'
_SPLIT_STREAM = (
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_split3",'
    b'"status":"in_progress"}}\n\nevent: response.output_text.delta\n'
    b'data: {"type":"response.output_text.delta","delta":"hi"}\n\n'
)  # the id once, in the first event


@pytest.mark.parametrize(
    ("answer", "content_type", "stream"),
    [(_SPLIT_BODY, b"application/json", False), (_SPLIT_STREAM, b"text/event-stream", True)],
    ids=["body", "stream"],
)
def test_an_id_split_across_two_reads_is_learned(router_server, answer, content_type, stream):
    worker = SplitWorker(answer, content_type, answer.index(b"resp_split3") + 7)  # "resp_sp|"
    try:
        router = router_server(workers=[worker.url])
        assert wait_until(lambda: router.call(lambda: router.app.pool.workers[0].models))
        with httpx.Client(base_url=router.url, timeout=10) as client:
            body = {"model": "m", "input": "x", "stream": stream}
            created = client.post("/v1/responses", json=body)
            assert created.status_code == 200 and created.content == answer
            got = client.get("/v1/responses/resp_split3")
            assert got.status_code == 200, got.text
            assert got.headers["x-cache-router-worker"] == worker.url
        assert worker.gets == ["resp_split3"]
    finally:
        worker.close()


def test_a_huge_unknown_id_is_not_echoed_whole(router_server, fake_workers) -> None:
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url])
    long_id, huge_id = "resp_" + "a" * 8000, "resp_" + "b" * (1 << 20)
    with httpx.Client(base_url=router.url, timeout=10) as client:
        for r, said in [
            (client.get(f"/v1/responses/{long_id}"), "a" * 251 + "… (8005 characters)"),
            (client.post("/v1/responses", json={"input": "x", "previous_response_id": huge_id}),
             "b" * 251 + f"… ({len(huge_id)} characters)"),
        ]:  # fmt: skip
            assert r.status_code == 404 and len(r.content) < 1024
            error = r.json()["error"]
            assert error["code"] == "response_not_found"
            assert error["message"].startswith(f"Response with id 'resp_{said}' not found")
