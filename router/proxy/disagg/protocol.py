"""What the two engines' prefill/decode protocols put in a request and read in an answer.

A request the picker sends to a prefill worker (:data:`router.fleet.pool.PREFILL`) is served
by two workers, each leg as its engine defines it:

- **vLLM** (a KV connector such as NixlConnector; vLLM's own proxy,
  ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, does the same): the
  prefill worker gets the request with ``max_tokens`` 1, no stream and
  ``kv_transfer_params`` asking for a remote decode; the ``kv_transfer_params`` of its answer
  (where its KV waits: engine id, block ids, host, port) go with the original request to a
  decode worker, which pulls the KV and answers the client. A connector that finds the KV
  by the prompt itself (vLLM's ExampleConnector, LMCache) returns none, as NixlConnector
  does for a prefill that stopped at its first token: the field is ``null`` (vLLM's answer
  always carries it) and the decode leg gets the original request, as vLLM's proxy does.
  Anything else in a 200 (a body that is not a JSON object, no such field, a field that is
  neither an object nor null) is no prefill answer: :class:`BadPrefillAnswer`, the prefill
  worker's failure (a 502 ``bad_prefill_response`` where no other prefill worker serves
  it), never a decode leg without the KV. The legs run one after the
  other, so a decode worker that fails before its first byte is retried on another one
  with the same parameters (the prefill worker holds the KV until it is pulled or times
  out).
- **SGLang** (PD mode, as its mini load balancer): one prefill and one decode worker are
  chosen together; the request gets ``bootstrap_host`` / ``bootstrap_port`` (the prefill
  worker's bootstrap server) and a fresh ``bootstrap_room``, and goes to both at once; the
  decode worker's answer is the client's (the prefill's body is not read: SGLang's own
  balancer drops it too). A retry needs both legs again, in a new room. The decode leg
  waits for the prefill's KV, so while the prefill leg has not answered, a decode that
  times out waits for that leg's end (a 504 either way): a prefill that fails is blamed,
  one that answers leaves the timeout to the decode; one that fails otherwise waits a
  moment for that leg: if it fails too, the prefill worker is blamed and replaced, not the
  decode. A prefill leg cancelled because its decode failed is never counted as failing.

Both legs of a pair carry the same ``X-Request-Id``, which the engines use to match them.
"""

from __future__ import annotations

import random
import uuid
from typing import Any
from urllib.parse import urlsplit

import orjson

from router.config import Settings
from router.core.parse import CHAT, COMPLETION, GENERATE
from router.fleet.pool import Worker

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


class BadPrefillAnswer(ValueError):
    """A vLLM prefill worker's 200 that is not its protocol's answer (the message says why)."""


def protocol_of(settings: Settings, prefill: Worker) -> str:
    """The protocol for a request prefilled on ``prefill``: ``--pd-protocol``, or with
    ``auto`` SGLang's when the worker's /metrics are SGLang's, else vLLM's (also before
    they are read)."""
    if settings.pd_protocol != "auto":
        return settings.pd_protocol
    reading = prefill.truth.reading
    return SGLANG if reading is not None and reading.engine == SGLANG else VLLM


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
    """The ``kv_transfer_params`` of a vLLM prefill worker's 200 (None: ``null`` or empty,
    a connector that needs none). vLLM dumps its response models whole, so the field is
    always there: a body that is not a JSON object, lacks it or holds anything but an
    object or null is :class:`BadPrefillAnswer` (a decode leg without the KV it needs
    would fail as if the client's request were wrong)."""
    try:
        data = orjson.loads(answer)
    except orjson.JSONDecodeError:
        raise BadPrefillAnswer("its body is not JSON") from None
    if not isinstance(data, dict):
        raise BadPrefillAnswer("its body is not a JSON object")
    if "kv_transfer_params" not in data:
        raise BadPrefillAnswer("it has no kv_transfer_params")
    params = data["kv_transfer_params"]
    if params is not None and not isinstance(params, dict):
        raise BadPrefillAnswer("its kv_transfer_params are not an object")
    return params or None


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
