"""The EPP learns a stored response's owner from the answer's body however Envoy cuts it into
``response_body`` messages (the id split between two, or one byte each), so the later
``GET /v1/responses/{id}`` goes to that worker; a request naming the empty model gets
``serve``'s 404 ``model_not_found``, and a huge model name is not echoed whole. Through the
real gRPC service on 127.0.0.1, the router core in front of sim workers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ext_proc_support import (
    Picker,
    booked,
    request_body,
    request_headers,
    response_body,
    response_headers,
    routed_to,
    router_app,
)

from traces.live.fleet import Service, sim_workers

RESPONSE_ID = "resp_split2"
BODY = b'{"id":"resp_split2","object":"response","status":"completed","output":[]}'
STREAM = (
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_split2",'
    b'"status":"in_progress"}}\n\nevent: response.output_text.delta\n'
    b'data: {"type":"response.output_text.delta","delta":"hi"}\n\ndata: [DONE]\n\n'
)  # the id once, in the first event


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Service]]:
    with sim_workers(2, ["--time-scale", "50", "--log-level", "warning"]) as started:
        yield started


def pieces(data: bytes, cuts: list[int]) -> list:
    """``data`` as the ``response_body`` messages Envoy sends, cut at ``cuts``."""
    edges = [0, *cuts, len(data)]
    return [response_body(data[a:b], end=b == len(data)) for a, b in pairwise(edges)]


@pytest.mark.parametrize("answer", [BODY, STREAM], ids=["body", "stream"])
@pytest.mark.parametrize("how", ["in_the_id", "byte_by_byte"])
async def test_an_id_split_across_body_messages_is_learned(workers, answer, how) -> None:
    middle = answer.index(RESPONSE_ID.encode()) + 7  # '..."resp_sp' | 'lit2"...'
    cuts = [middle] if how == "in_the_id" else list(range(1, len(answer)))
    request = {"model": "sim-model", "input": "hi", "stream": answer is STREAM}
    async with router_app([w.url for w in workers]) as app, Picker(app) as picker:
        answers = await picker.exchange([
            request_headers("POST", "/v1/responses"),
            request_body(orjson.dumps(request)),
            response_headers(b"200"),
            *pieces(answer, cuts),
        ])  # fmt: skip
        owner = routed_to(answers[1])
        assert owner is not None
        assert booked(app) == 0
        for path in (f"/v1/responses/{RESPONSE_ID}", f"/v1/responses/{RESPONSE_ID}/input_items"):
            (got,) = await picker.exchange([request_headers("GET", path, end=True)])
            assert routed_to(got) == owner, got  # not the router's 404 response_not_found
        assert app.owners.learned == 1


async def test_the_empty_model_is_not_found(workers) -> None:
    async with router_app([w.url for w in workers]) as app, Picker(app) as picker:
        for path, body in [
            ("/v1/completions", {"model": "", "prompt": "hi"}),
            ("/v1/responses", {"model": "", "input": "hi"}),
            ("/v1/embeddings", {"model": "", "input": "hi"}),
        ]:
            answers = await picker.exchange(
                [request_headers("POST", path), request_body(orjson.dumps(body))]
            )
            immediate = answers[-1].immediate_response
            assert immediate.status.code == 404, path
            assert orjson.loads(immediate.body)["error"]["code"] == "model_not_found"
        assert booked(app) == 0


async def test_a_huge_model_name_is_not_echoed_whole(workers) -> None:
    huge = {"model": "g" * (1 << 20), "prompt": "hi"}
    async with router_app([w.url for w in workers]) as app, Picker(app) as picker:
        answers = await picker.exchange(
            [request_headers("POST", "/v1/completions"), request_body(orjson.dumps(huge))]
        )
    immediate = answers[-1].immediate_response
    assert immediate.status.code == 404 and len(immediate.body) < 1024
    assert f"… ({1 << 20} characters)" in orjson.loads(immediate.body)["error"]["message"]
