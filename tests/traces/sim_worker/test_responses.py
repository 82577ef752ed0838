"""The sim worker's Responses API and embeddings, read with OpenAI's own client: stored
responses live in this server only (vLLM's rule), a continuation's prompt is the stored
conversation plus the new input (so it hits the worker's cache), streams follow OpenAI's
event sequence."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from traces.sim.worker_model import WorkerModelConfig
from traces.sim_worker.server import SimWorkerConfig

SYSTEM = "Answer in one word. " * 120  # several 512-token blocks


@pytest.fixture(scope="module")
def url(sim_worker_in_thread) -> Iterator[str]:
    config = SimWorkerConfig(WorkerModelConfig(kv_capacity_tokens=1 << 17), time_scale=50.0)
    with sim_worker_in_thread(config) as url:
        yield url


@pytest.fixture
def client(url) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
        yield c


def test_a_conversation_is_stored_continued_and_cached(client) -> None:
    first = client.responses.create(
        model="sim-model", instructions=SYSTEM, input="first question", max_output_tokens=3
    )
    assert first.id.startswith("resp_") and first.status == "completed"
    assert first.output_text == " tok0 tok1 tok2"
    assert first.usage.input_tokens_details.cached_tokens == 0
    second = client.responses.create(
        model="sim-model",
        instructions=SYSTEM,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "and then?"}]}],
        previous_response_id=first.id,
        max_output_tokens=2,
    )
    assert second.previous_response_id == first.id
    # the conversation so far is this turn's prompt prefix: cached, and longer
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= 512
    assert client.responses.retrieve(second.id).id == second.id
    items = client.responses.input_items.list(second.id)
    assert [i.role for i in items.data] == ["user"]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(input="x", previous_response_id="resp_elsewhere")


def test_a_stream_is_openais_event_sequence(client) -> None:
    events = list(client.responses.create(input="stream it", max_output_tokens=4, stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", *["response.output_text.delta"] * 4, "response.completed"]
    done = events[-1].response
    assert done.id == events[0].response.id and done.output_text == " tok0 tok1 tok2 tok3"
    assert [e.sequence_number for e in events] == list(range(1, 7))
    assert client.responses.retrieve(done.id).status == "completed"


def test_store_false_keeps_nothing_and_cancel_needs_a_running_response(client, url) -> None:
    kept = client.responses.create(input="keep nothing", store=False, max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    done = client.responses.create(input="finished", max_output_tokens=1)
    r = httpx.post(f"{url}/v1/responses/{done.id}/cancel", timeout=10)
    assert r.status_code == 400 and "not running" in r.json()["error"]["message"]


def test_embeddings(client) -> None:
    out = client.embeddings.create(model="sim-model", input=["a b c", "d e f"])
    assert [d.index for d in out.data] == [0, 1] and len(out.data[0].embedding) == 8
    assert out.data[0].embedding != out.data[1].embedding and out.usage.prompt_tokens == 4
    again = client.embeddings.create(model="sim-model", input="a b c")
    assert again.data[0].embedding == out.data[0].embedding  # deterministic
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="x")


def test_an_adapter_serves_responses_and_embeddings(sim_worker_in_thread) -> None:
    """A worker with LoRA adapters (--lora) answers for them on these endpoints too."""
    config = SimWorkerConfig(
        WorkerModelConfig(kv_capacity_tokens=1 << 16), time_scale=50.0, loras=("tone",)
    )
    with (
        sim_worker_in_thread(config) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client,
    ):
        answer = client.responses.create(model="tone", input="hi", max_output_tokens=2)
        assert answer.model == "tone" and answer.status == "completed"
        assert client.embeddings.create(model="tone", input="x").model == "tone"
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="other", input="hi")
