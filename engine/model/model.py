"""The decoder: embedding, ``first_k_dense`` dense layers then MoE layers, RMSNorm, RoPE, GQA attention.

Weights are random but deterministic (drawn from ``ModelConfig.seed``), or loaded from a local
Llama/Qwen2-style checkpoint (:mod:`.checkpoint`). The forward pass runs over the flat token
stream of one step (:class:`~.input_batch.ForwardBatch`); per layer it writes the step's K/V into the
paged cache *before* attention reads it, then calls ``model.attn_backend`` (the PyTorch reference
:func:`~.attention.paged_attention_ref` unless replaced by a kernel with the same signature).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from mixdiag.engine.model.attention import paged_attention_ref
from mixdiag.engine.config import ModelConfig
from mixdiag.engine.hooks import NULL_TRACER, Tracer
from mixdiag.engine.model.moe import MoE, SwiGLU
from mixdiag.wire import ATTN, MOE, layer_range


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


class Rotary(nn.Module):
    """Rotate-half RoPE (Llama/Qwen2 layout); cos/sin tables for every position up to max_model_len."""

    def __init__(self, head_dim: int, max_len: int, theta: float):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        ang = torch.arange(max_len + 1, dtype=torch.float64)[:, None] * inv[None, :]  # [P, D/2]
        self.register_buffer("cos", torch.cos(ang), persistent=False)
        self.register_buffer("sin", torch.sin(ang), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, H, D] rotated by each token's position."""
        cos = self.cos.index_select(0, positions).to(x.dtype)[:, None, :]  # [T, 1, D/2]
        sin = self.sin.index_select(0, positions).to(x.dtype)[:, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool = False):
        super().__init__()
        self.hq, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.hq + 2 * self.hkv) * self.d, bias=qkv_bias)
        self.o = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(self.d)

    def forward(self, x, batch, kv_layer: torch.Tensor, rotary: Rotary, backend: Callable) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = rotary(q.view(t, self.hq, self.d), batch.positions)
        k = rotary(k.view(t, self.hkv, self.d), batch.positions)
        v = v.view(t, self.hkv, self.d)
        k_cache, v_cache = kv_layer[0], kv_layer[1]             # [num_blocks, block_size, Hkv, D]
        # Every K/V write of this step lands before any attention read of this step.
        k_cache.view(-1, self.hkv, self.d).index_copy_(0, batch.slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, self.hkv, self.d).index_copy_(0, batch.slot_mapping, v.to(v_cache.dtype))
        o = backend(q, k_cache, v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, self.scale)
        return self.o(o.reshape(t, self.hq * self.d))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, qkv_bias: bool = False):
        super().__init__()
        self.index = index
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, qkv_bias)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.is_moe = index >= cfg.first_k_dense
        self.mlp = MoE(cfg) if self.is_moe else SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self._attn_name, self._moe_name = layer_range(ATTN, index), layer_range(MOE, index)

    def forward(self, x, batch, kv_layer, rotary, backend, tracer: Tracer) -> torch.Tensor:
        with tracer.range(ATTN, self._attn_name):
            x = x + self.attn(self.input_norm(x), batch, kv_layer, rotary, backend)
        if self.is_moe:
            with tracer.range(MOE, self._moe_name):
                return x + self.mlp(self.post_norm(x))
        return x + self.mlp(self.post_norm(x))


class Model(nn.Module):
    """The whole decoder. ``forward(batch, kv_cache)`` returns logits [len(logits_indices), vocab]."""

    def __init__(self, cfg: ModelConfig, qkv_bias: bool = False):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, qkv_bias) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rotary = Rotary(cfg.head_dim, cfg.max_model_len, cfg.rope_theta)
        self.attn_backend: Callable = paged_attention_ref
        self.tracer: Tracer = NULL_TRACER

    @property
    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.layers if layer.is_moe]

    def init_random(self, seed: int) -> "Model":
        """Deterministic random weights: N(0, 1/fan_in) matrices, unit norms, from ``seed``."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    fan_in = p.shape[-1] if not name.startswith("embed") else 1
                    w = torch.randn(p.shape, generator=g, dtype=torch.float32) / math.sqrt(fan_in)
                    p.copy_(w.to(p.dtype))
        return self

    def forward(self, batch, kv_cache: torch.Tensor) -> torch.Tensor:
        """Run the step's flat stream; ``kv_cache`` is [layers, 2, num_blocks, block_size, Hkv, D]."""
        x = self.embed(batch.input_ids)
        backend, tracer = self.attn_backend, self.tracer
        for i, layer in enumerate(self.layers):
            x = layer(x, batch, kv_cache[i], self.rotary, backend, tracer)
        x = x.index_select(0, batch.logits_indices)   # only rows that sample a token
        return self.lm_head(self.norm(x))


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu", qkv_bias: bool = False) -> Model:
    """A model with deterministic random weights from ``cfg.seed``, in ``cfg.dtype`` on ``device``."""
    model = Model(cfg, qkv_bias)
    model.init_random(cfg.seed)
    return model.to(device=device, dtype=getattr(torch, cfg.dtype)).eval()
