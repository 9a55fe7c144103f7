"""A roofline device model: predicted time of a pure-decode step and of a mixed step from the
ledger's bytes and FLOPs, hence the predicted spike height (mixed / decode) that reports show
next to the measured one.

Per GPU of an EP x DP-attention deployment (the article's 8xH200 recipe):
``t = max(flops / peak_flops, bytes / hbm_bw) + moe_comm_bytes / (ep x link_bw)`` (each peak
scaled by an achievable efficiency) where bytes are
the weights the step touches (experts hit by at least one token) plus the decode KV reads, and the
MoE dispatch/combine traffic is spread over the EP ranks' links. A model, not a measurement: it
says how tall a spike *should* be if the prefill chunk is the cause.
"""
from __future__ import annotations

from dataclasses import dataclass

from mixdiag.errors import UserError
from mixdiag.ledger.shapes import BatchShape, LedgerModel


@dataclass(frozen=True)
class DeviceModel:
    """Peak rates of one accelerator and its EP group."""

    name: str
    peak_flops: float      # dense FLOP/s at the weight precision
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # per-GPU one-direction bandwidth of the EP interconnect
    ep_size: int = 8
    # Achievable shares of the peaks: ~50 % MFU for large GEMMs, ~80 % of HBM bandwidth, and
    # DeepEP's measured 153 GB/s intranode EP8 dispatch on H800 (~75 % of its link).
    flops_efficiency: float = 0.5
    hbm_efficiency: float = 0.8
    link_efficiency: float = 0.75

    def __post_init__(self):
        if min(self.peak_flops, self.hbm_bytes_per_s, self.link_bytes_per_s) <= 0 or self.ep_size < 1:
            raise UserError(f"device {self.name}: rates must be positive and ep_size >= 1")
        for f in ("flops_efficiency", "hbm_efficiency", "link_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise UserError(f"device {self.name}: {f} must be in (0, 1]")


DEVICES = {
    # H200 SXM: 1979 TFLOP/s dense FP8, 4.8 TB/s HBM3e, NVLink 900 GB/s (450 GB/s each way).
    "h200": DeviceModel("h200", 1.979e15, 4.8e12, 4.5e11),
    # H100 SXM: 1979 TFLOP/s FP8, 3.35 TB/s, NVLink 450 GB/s each way.
    "h100": DeviceModel("h100", 1.979e15, 3.35e12, 4.5e11),
    # A100 80GB: 312 TFLOP/s BF16 (no FP8), 2.0 TB/s, NVLink 300 GB/s each way.
    "a100": DeviceModel("a100", 3.12e14, 2.0e12, 3.0e11),
}


def device(name: str) -> DeviceModel:
    if name not in DEVICES:
        raise UserError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    return DEVICES[name]


def _step_time(m: LedgerModel, dev: DeviceModel, rows: int, decode_rows: int, prefill: int, shape: BatchShape) -> dict:
    ep = dev.ep_size
    # expected share of experts hit by at least one of rows x top_k assignments
    hit = 1.0 - (1.0 - m.top_k / m.n_routed_experts) ** max(rows, 0) if rows else 0.0
    expert_w = m.moe_layers * m.n_routed_experts * hit * m.expert_params() / ep
    shared_w = m.moe_layers * m.n_shared_experts * m.expert_params()
    attn_w = m.num_layers * m.attn_params_per_layer() + m.first_dense_layers * 3 * m.hidden_size * m.dense_intermediate_size
    weight_bytes = (expert_w + shared_w + attn_w) * m.weight_bytes_per_param
    kv_keys = min(m.index_topk, shape.context_len)
    kv_bytes = m.num_layers * (decode_rows * kv_keys + prefill + shape.prefix_len) * m.kv_bytes_per_token / ep
    mem_s = (weight_bytes + kv_bytes) / (dev.hbm_bytes_per_s * dev.hbm_efficiency)
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    attn_flops = m.num_layers * 2 * m.num_heads * (qk + m.v_head_dim) * (decode_rows * kv_keys + prefill * min(kv_keys, prefill + shape.prefix_len))
    idx_flops = m.indexer_layers * 2 * m.index_n_heads * m.index_head_dim * (
        decode_rows * shape.context_len + prefill * shape.prefix_len + prefill * prefill / 2)
    flops = (2 * m.active_params() * rows + attn_flops + idx_flops) / ep
    comp_s = flops / (dev.peak_flops * dev.flops_efficiency)
    comm_bytes = rows * m.top_k * m.hidden_size * (m.dispatch_bytes_per_elem + m.combine_bytes_per_elem) * m.moe_layers
    comm_s = comm_bytes / (ep * dev.link_bytes_per_s * dev.link_efficiency)
    return {"compute_s": comp_s, "memory_s": mem_s, "comm_s": comm_s, "time_s": max(comp_s, mem_s) + comm_s,
            "bound": "compute" if comp_s >= mem_s else "memory"}


def predict(model: LedgerModel, shape: BatchShape, dev: DeviceModel) -> dict:
    """Predicted pure-decode and mixed step times and the spike height ``mixed / decode``."""
    D = shape.decode_rows
    dec = _step_time(model, dev, D, D, 0, shape)
    mix = _step_time(model, dev, shape.mixed_rows, D, shape.prefill_tokens, shape)
    return {"model": model.name, "device": dev.name, "decode": dec, "mixed": mix,
            "height_x": mix["time_s"] / dec["time_s"] if dec["time_s"] > 0 else None}
