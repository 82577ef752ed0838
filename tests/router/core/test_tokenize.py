"""Tokens for routing: client ids as they are, the approximation, a local HF tokenizer,
and the worker's /tokenize with its bounded cache."""

from __future__ import annotations

import json

import orjson
import pytest

from router.cache.block_hash import hash_blocks, token_bytes
from router.core.errors import BadRequest
from router.core.parse import CHAT, COMPLETION, parse_request
from router.core.tokenize import (
    ApproxTokenizer,
    LocalTokenizer,
    WorkerTokenizer,
    features_of,
    serialize_chat,
    tokens_now,
)

BLOCK = 16  # small blocks: approx blocks are 64 bytes


def req(kind, body, header=None):
    return parse_request(kind, orjson.dumps(body), header)


async def features(kind, body, tokenizer=None):
    tokenizer = tokenizer or ApproxTokenizer(BLOCK)
    request = req(kind, body)  # as the forwarder makes them: awaited only when it must be
    tok = tokens_now(request, tokenizer, BLOCK)
    if tok is None:
        tok = await tokenizer.tokenize(request)
    return features_of(request, tok, BLOCK)


async def test_client_token_ids_are_used_as_they_are():
    ids = list(range(100, 150))
    f = await features(COMPLETION, {"prompt": ids})
    assert f.tokens == token_bytes(ids) and f.input_length == 50
    assert f.blocks == hash_blocks(ids, BLOCK)
    g = await features("generate", {"input_ids": ids})
    assert g.blocks == f.blocks
    with pytest.raises(BadRequest):
        await features(COMPLETION, {"prompt": [1, 2**33]})


async def test_approx_is_prefix_stable_and_about_four_bytes_a_token():
    text = "abcd" * 100  # 400 bytes = 100 approx tokens, 6 full 64-byte blocks
    f = await features(COMPLETION, {"prompt": text})
    assert f.input_length == 100 and len(f.blocks) == 6 and len(f.tokens) == 400
    longer = await features(COMPLETION, {"prompt": text + "efg"})
    assert longer.input_length == 101 and longer.blocks == f.blocks
    other = await features(COMPLETION, {"prompt": "X" + text[1:]})
    assert other.blocks[0] != f.blocks[0]
    batch = await features(COMPLETION, {"prompt": [text, "abcdabcd"]})
    assert batch.blocks == f.blocks and batch.input_length == 102


async def test_chat_turns_extend_each_other():
    turn1 = [
        {"role": "system", "content": "be brief " * 20},
        {"role": "user", "content": "q1 " * 30},
    ]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "a1 " * 30},
        {"role": "user", "content": "q2"},
    ]
    s1 = serialize_chat({"messages": turn1})
    s2 = serialize_chat({"messages": turn2})
    assert s2.startswith(s1)
    f1 = await features(CHAT, {"messages": turn1})
    f2 = await features(CHAT, {"messages": turn2})
    assert f2.blocks[: len(f1.blocks)] == f1.blocks and len(f2.blocks) > len(f1.blocks)
    parts = [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "u"}}]
    with_image = serialize_chat({"messages": [{"role": "user", "content": parts}]})
    assert b"hello" in with_image and b'"image_url"' in with_image
    tools = serialize_chat({"messages": turn1, "tools": [{"type": "function"}]})
    assert tools.startswith(b"\x1etools") and tools.endswith(s1)  # tools come first


def _tiny_model(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    special = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False)
    tok.train_from_iterator(["hello world, the router routes requests"] * 50, trainer)
    tok.save(str(folder / "tokenizer.json"))
    template = (
        "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + "
        "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


async def test_local_tokenizer_and_chat_template(tmp_path):
    tok = _tiny_model(tmp_path)
    local = LocalTokenizer(str(tmp_path), BLOCK)
    messages = [{"role": "user", "content": "hello world"}]
    rendered = local.hf.render_chat({"messages": messages})
    assert rendered == "<s><|user|>\nhello world\n<|assistant|>\n"
    f = await features(CHAT, {"messages": messages}, local)
    expected = tok.encode(rendered, add_special_tokens=False).ids
    assert f.tokens == token_bytes(expected) and f.input_length == len(expected)
    g = await features(COMPLETION, {"prompt": "the router routes"}, local)
    assert g.input_length == len(tok.encode("the router routes").ids)
    # a path to tokenizer.json works too; a missing file is a clear error
    assert LocalTokenizer(str(tmp_path / "tokenizer.json"), BLOCK).hf.chat_template_source
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        LocalTokenizer(str(tmp_path / "nowhere"), BLOCK)
    bad = {"messages": [{"role": "user"}]}  # template reads m['content']: undefined + str
    with pytest.raises(BadRequest):
        await features(CHAT, bad, local)


async def test_worker_tokenizer_caches_and_falls_back():
    calls = []

    async def ask(path, body):
        calls.append((path, orjson.loads(body)))
        if orjson.loads(body).get("prompt") == "down":
            return None
        return orjson.dumps({"count": 3, "tokens": [7, 8, 9] * 10})

    stats = {}
    tokenizer = WorkerTokenizer(ask, "/tokenize", BLOCK, cache_bytes=200, stats=stats)
    body = {"model": "fake-model", "prompt": "hello"}
    f = await features(COMPLETION, body, tokenizer)
    assert f.input_length == 30 and f.tokens == token_bytes([7, 8, 9] * 10)
    await features(COMPLETION, body, tokenizer)
    assert len(calls) == 1 and calls[0] == ("/tokenize", {"model": "fake-model", "prompt": "hello"})
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
    await features(CHAT, chat, tokenizer)
    assert calls[-1][1]["messages"] == chat["messages"]
    assert calls[-1][1]["add_generation_prompt"] is True
    fallback = await features(COMPLETION, {"prompt": "down"}, tokenizer)
    assert fallback.input_length == 1  # approx: 4 bytes
    assert stats == {"worker": 2, "cache_hit": 1, "fallback": 1}
    # the cache holds at most cache_bytes of ids (120 bytes per answer here)
    await features(COMPLETION, {"prompt": "other"}, tokenizer)
    assert tokenizer._cached_bytes <= 200
