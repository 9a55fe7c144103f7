"""Build the testbed's small Llama offline: a HF config, random weights from a fixed seed, and a
byte-level BPE tokenizer trained on local text. Nothing is downloaded.

Run with the vLLM environment's Python (it needs torch, transformers and tokenizers, which the
project's own .venv need not have)::

    .venv-vllm/bin/python mixdiag/vllm_testbed/model_build.py --out .venv-vllm/models/tiny-llama

This file imports nothing of mixdiag, so it runs by path from either environment.

Why these sizes: the testbed must make a 512-token prefill chunk cost many decode steps (>= 8x)
on a 2-core CPU, so mixing is visible in step times, while the server stays fast enough that a
12-stream decode batch runs at ~100 steps/s. Hidden 384 and 4 layers (about 20 M parameters, most
of them in the 16 k-entry embedding and LM head, which a prefill touches only for its last token)
gives that.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

# Bump when the build changes, so a stale model in a cache directory is rebuilt.
BUILD_VERSION = 1


@dataclass(frozen=True)
class ModelSpec:
    """The model's shape and the tokenizer's size; validated on construction."""

    hidden_size: int = 384
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 6
    intermediate_size: int = 1024
    vocab_size: int = 16384
    max_position_embeddings: int = 16384
    seed: int = 0
    corpus_bytes: int = 6_000_000

    def __post_init__(self):
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size {self.hidden_size} / heads {self.num_heads} / kv heads "
                             f"{self.num_kv_heads} do not divide")
        if self.vocab_size < 1024:
            raise ValueError(f"vocab_size must be >= 1024 (byte alphabet plus merges), got {self.vocab_size}")


def _corpus(limit: int) -> list[str]:
    """Local text to train the tokenizer on: the Python standard library's sources, in a fixed
    order, so two builds on one machine produce the same vocabulary."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts or "test" in p.parts:
            continue
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(t)
        total += len(t)
        if total >= limit:
            break
    if total < 100_000:
        raise SystemExit(f"error: too little local text under {root} to train a tokenizer ({total} chars)")
    return texts


def build_tokenizer(spec: ModelSpec, out: Path):
    """Byte-level BPE with <s>=0 and </s>=1, so ids 2..257 are the 256 byte tokens (what
    ``mixdiag load`` sends as random prompts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(spec.corpus_bytes), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   model_max_length=spec.max_position_embeddings)
    fast.save_pretrained(out)
    return fast


def build(spec: ModelSpec, out: Path) -> dict:
    """Write config, weights (bf16 safetensors) and tokenizer into ``out``; returns the summary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(spec, out)
    vocab = len(tok)   # the trainer may stop short of vocab_size on a small corpus
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                      num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                      num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position_embeddings,
                      bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, torch_dtype="bfloat16")
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    summary = {"build_version": BUILD_VERSION, "spec": asdict(spec), "vocab_size": vocab, "parameters": params}
    (out / "mixdiag_model.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def is_built(out: Path) -> bool:
    """True when ``out`` holds a finished build of this version."""
    try:
        meta = json.loads((Path(out) / "mixdiag_model.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("build_version") == BUILD_VERSION and (Path(out) / "config.json").exists()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="build the vLLM testbed's small Llama offline")
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--force", action="store_true", help="rebuild even if a finished build is there")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if is_built(out) and not args.force:
        print(f"model already built in {out}")
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    summary = build(ModelSpec(), out)
    print(f"built {out}: {summary['parameters'] / 1e6:.1f} M parameters, vocab {summary['vocab_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
