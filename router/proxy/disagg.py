"""Disaggregated serving: what the two engines' prefill/decode protocols put in a request.

A request the picker sends to a prefill worker (:data:`router.fleet.pool.PREFILL`) is served
by two workers, each leg as its engine defines it:

- **vLLM** (a KV connector such as NixlConnector; vLLM's own proxy,
  ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, does the same): the
  prefill worker gets the request with ``max_tokens`` 1, no stream and
  ``kv_transfer_params`` asking for a remote decode; the ``kv_transfer_params`` of its answer
  (where its KV waits: engine id, block ids, host, port) go with the original request to a
  decode worker, which pulls the KV and answers the client. A connector that finds the KV
  by the prompt itself (vLLM's ExampleConnector, LMCache) returns none: the decode leg then
  gets the original request, as vLLM's proxy does. The legs run one after the
  other, so a decode worker that fails before its first byte is retried on another one
  with the same parameters (the prefill worker holds the KV until it is pulled or times
  out).
- **SGLang** (PD mode, as its mini load balancer): one prefill and one decode worker are
  chosen together; the request gets ``bootstrap_host`` / ``bootstrap_port`` (the prefill
  worker's bootstrap server) and a fresh ``bootstrap_room``, and goes to both at once; the
  decode worker's answer is the client's. A retry needs both legs again, in a new room.

Both legs of a pair carry the same ``X-Request-Id``, which the engines use to match them.
"""

from __future__ import annotations

import random
import uuid
from typing import Any
from urllib.parse import urlsplit

import orjson

from router.config import Settings
from router.fleet.pool import Worker
from router.proxy.parse import CHAT, COMPLETION, GENERATE

VLLM, SGLANG = "vllm", "sglang"
PROTOCOLS = (VLLM, SGLANG)

# the endpoints each protocol disaggregates (others go to the chosen worker as they are)
DISAGGREGATED = {
    VLLM: frozenset({CHAT, COMPLETION}),
    SGLANG: frozenset({CHAT, COMPLETION, GENERATE}),
}

REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def protocol_of(settings: Settings, prefill: Worker) -> str:
    """The protocol for a request prefilled on ``prefill``: ``--pd-protocol``, or with
    ``auto`` SGLang's when the worker's /metrics are SGLang's, else vLLM's."""
    if settings.pd_protocol != "auto":
        return settings.pd_protocol
    return SGLANG if prefill.truth.engine == "sglang" else VLLM


def with_request_id(headers: bytes, attempt: int) -> bytes:
    """The forwarded header lines with one ``x-request-id`` for both legs of a pair: the
    client's, else a new one; a retried pair's gets the attempt's number (an engine keeps a
    request id while the request lives)."""
    lower = headers.lower()
    at = lower.find(b"x-request-id: ")
    if at >= 0 and (at == 0 or lower[at - 1 : at] == b"\n"):
        end = headers.index(b"\r\n", at) + 2
        rid = headers[at + len(b"x-request-id: ") : end - 2]
        headers = headers[:at] + headers[end:]
    else:
        rid = uuid.uuid4().hex.encode()
    if attempt:
        rid += b"-%d" % attempt
    return headers + b"x-request-id: " + rid + b"\r\n"


def vllm_prefill_body(body: dict[str, Any]) -> bytes:
    """The prefill leg's body: one token, not streamed, its KV kept for a remote decode."""
    out = {**body, "kv_transfer_params": REMOTE_DECODE, "stream": False, "max_tokens": 1}
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return orjson.dumps(out)


def kv_transfer_params(answer: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a vLLM prefill worker's answer (None: it gave none)."""
    try:
        params = orjson.loads(answer).get("kv_transfer_params")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return params if isinstance(params, dict) and params else None


def with_fields(body: dict[str, Any], **fields: Any) -> bytes:
    """``body`` with ``fields`` added: the vLLM decode leg (``kv_transfer_params``) or the
    SGLang legs (the bootstrap fields)."""
    return orjson.dumps({**body, **fields})


def bootstrap_fields(prefill: Worker) -> dict[str, Any]:
    """The SGLang bootstrap fields for a pair whose prefill worker is ``prefill``: its host,
    its bootstrap port and a fresh room (SGLang's mini_lb draws it the same way)."""
    return {
        "bootstrap_host": urlsplit(prefill.url).hostname,
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
