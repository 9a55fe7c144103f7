"""Load a local Llama/Qwen2-style dense checkpoint (``config.json`` + ``*.safetensors``). No downloads.

Hugging Face names map onto the engine's fused weights: q/k/v projections concatenate into
``attn.qkv`` (with biases for Qwen2), gate/up into ``mlp.gate_up``. Every layer is dense
(``first_k_dense = num_layers``). RoPE scaling variants are refused rather than silently ignored.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from mixdiag.errors import UserError

from mixdiag.engine.config import ConfigError, ModelConfig
from mixdiag.engine.model.model import Model

SUPPORTED = ("llama", "qwen2", "mistral")


def read_config(path: str | Path, dtype: str | None = None) -> tuple[ModelConfig, bool]:
    """(ModelConfig, qkv_bias) from ``path/config.json``."""
    p = Path(path) / "config.json"
    if not p.is_file():
        raise UserError(f"no config.json in checkpoint directory {Path(path)}")
    try:
        hf = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    mt = hf.get("model_type")
    if mt not in SUPPORTED:
        raise UserError(f"{p}: model_type {mt!r} is not supported (supported: {', '.join(SUPPORTED)})")
    if hf.get("rope_scaling"):
        raise UserError(f"{p}: rope_scaling {hf['rope_scaling']!r} is not supported")
    try:
        heads = hf["num_attention_heads"]
        layers = hf["num_hidden_layers"]
        cfg = ModelConfig(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=layers, first_k_dense=layers,
            num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, intermediate_size=hf["intermediate_size"],
            max_model_len=min(hf.get("max_position_embeddings", 4096), 1 << 17),
            rope_theta=float(hf.get("rope_theta", 10000.0)), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            eos_token_id=_first(hf.get("eos_token_id"), 0), tie_word_embeddings=bool(hf.get("tie_word_embeddings")),
            dtype=dtype or {"bfloat16": "bfloat16", "float16": "float16"}.get(hf.get("torch_dtype"), "float32"))
    except KeyError as e:
        raise UserError(f"{p}: missing field {e.args[0]!r}") from None
    except ConfigError as e:
        raise UserError(f"{p}: {e}") from None
    qkv_bias = mt == "qwen2" or bool(hf.get("attention_bias"))
    return cfg, qkv_bias


def _first(v, default):
    if isinstance(v, list):
        return v[0] if v else default
    return default if v is None else v


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(f"no *.safetensors files in checkpoint directory {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", dtype: str | None = None) -> Model:
    """A :class:`Model` with the checkpoint's weights; ``model.config`` is the derived ModelConfig."""
    path = Path(path)
    cfg, qkv_bias = read_config(path, dtype)
    t = _read_tensors(path)

    def take(name: str) -> torch.Tensor:
        try:
            return t.pop(name)
        except KeyError:
            raise UserError(f"checkpoint {path} lacks tensor {name!r}") from None

    sd = {"embed.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    for i in range(cfg.num_layers):
        hf, me = f"model.layers.{i}.", f"layers.{i}."
        sd[me + "input_norm.weight"] = take(hf + "input_layernorm.weight")
        sd[me + "post_norm.weight"] = take(hf + "post_attention_layernorm.weight")
        sd[me + "attn.qkv.weight"] = torch.cat([take(hf + f"self_attn.{x}_proj.weight") for x in "qkv"])
        if qkv_bias:
            sd[me + "attn.qkv.bias"] = torch.cat([take(hf + f"self_attn.{x}_proj.bias") for x in "qkv"])
        sd[me + "attn.o.weight"] = take(hf + "self_attn.o_proj.weight")
        sd[me + "mlp.gate_up.weight"] = torch.cat([take(hf + "mlp.gate_proj.weight"), take(hf + "mlp.up_proj.weight")])
        sd[me + "mlp.down.weight"] = take(hf + "mlp.down_proj.weight")
    if cfg.tie_word_embeddings:
        t.pop("lm_head.weight", None)
        sd["lm_head.weight"] = sd["embed.weight"]
    else:
        sd["lm_head.weight"] = take("lm_head.weight")
    model = Model(cfg, qkv_bias)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or missing:
        raise UserError(f"checkpoint {path}: tensors do not fit the model (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]})")
    return model.to(device=device, dtype=getattr(torch, cfg.dtype)).eval()
