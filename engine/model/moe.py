"""Mixture-of-experts layer: router (+ ``router_bias``), top-k, experts, optional shared expert.

``experts_impl(x[T,H], topk_ids[T,k], topk_weights[T,k]) -> y[T,H]`` is a seam: :meth:`MoE.local_experts`
runs every expert in this process; an expert-parallel implementation (experts spread over ranks,
tokens dispatched and combined) replaces it without touching the router.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mixdiag.engine.config import ModelConfig


class SwiGLU(nn.Module):
    """Dense gated MLP: down(silu(gate(x)) * up(x)), with gate and up fused into one weight."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class MoE(nn.Module):
    """Top-k routed experts over the step's tokens (prefill and decode rows alike)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.num_experts, self.top_k = e, cfg.num_experts_per_tok
        self.router = nn.Linear(h, e, bias=False)
        # Added to the router logits before top-k; zeros unless a fault skews routing (EP hotspot).
        self.register_buffer("router_bias", torch.zeros(e))
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h))   # per expert: gate and up, fused
        self.w2 = nn.Parameter(torch.empty(e, h, i))        # per expert: down
        self.shared = SwiGLU(h, cfg.shared_expert_intermediate_size) if cfg.shared_expert_intermediate_size else None
        self.experts_impl = self.local_experts
        self.last_topk_ids: torch.Tensor | None = None      # [T, k] of the latest call, for load statistics

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """topk_ids [T,k] (int64) and normalised topk_weights [T,k] for tokens ``x`` [T,H]."""
        logits = self.router(x) + self.router_bias.to(x.dtype)
        probs = torch.softmax(logits, dim=-1)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        return ids, w / w.sum(dim=-1, keepdim=True)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` applied to rows ``x`` [n,H] -> [n,H]."""
        g, u = F.linear(x, self.w13[e]).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, self.w2[e])

    def local_experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """All experts in this process: group the (token, slot) pairs by expert, one matmul each."""
        t, k = topk_ids.shape
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)            # pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        xs = x.index_select(0, order // k)                  # token row of each pair, [T*k, H]
        ys = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                ys[start:start + n] = self.expert(e, xs[start:start + n])
                start += n
        pairs = torch.empty_like(ys)
        pairs[order] = ys                                   # back to (token, slot) order, [T*k, H]
        w = topk_weights.to(x.dtype).unsqueeze(-1)          # [T, k, 1]
        return (pairs.view(t, k, -1) * w).sum(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, w = self.route(x)
        self.last_topk_ids = ids
        y = self.experts_impl(x, ids, w)
        if self.shared is not None:
            y = y + self.shared(x)
        return y
