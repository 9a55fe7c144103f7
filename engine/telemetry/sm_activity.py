"""SM activity per step: an honest estimate on CPU, an NVML measurement on CUDA.

On CPU there are no SMs, yet the diagnosis wants the article's sawtooth (memory-bound decode
steps leave SMs idle, a step with a prefill chunk pegs them). :class:`SmEstimator` computes it
from the step's arithmetic against a documented :class:`DeviceModel` (a roofline):

    flops  = 2 x active parameters x tokens  +  attention score/value FLOPs  +  LM head
    bytes  = weights read once (dense layers, attention, the experts a step touches, LM head)
             + KV read (tokens held, when the step has decode rows) + KV written (tokens scheduled)
    sm_active_est = t_compute / max(t_compute, t_memory),  t_compute = flops / peak_flops,
                    t_memory = bytes / mem_bw_bytes_s

i.e. the fraction of the roofline-bound step time the tensor cores would be busy. It is written
to ``StepRecord.sm_active`` with ``sm_active_source = "estimated"``; the run's
``meta["signals"][instance]["sm_active"]`` says ``estimated`` and the Prometheus gauge carries
``source="estimated"``. It is never reported as measured.

On CUDA, :class:`NvmlSmSampler` reads NVML through ``mixdiag.gpu_probe.open_sm_probe``: GPM ``SM_UTIL``
on Hopper and newer (``measured``), else device utilization (the share of time any kernel ran,
a weaker signal: ``estimated``, as the NVML collector marks it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mixdiag.errors import UserError


@dataclass(frozen=True)
class DeviceModel:
    """A roofline: peak dense tensor FLOP/s and memory bandwidth (defaults: one H200 SXM, BF16)."""

    name: str = "H200-SXM-bf16"
    peak_flops: float = 989e12       # dense BF16 tensor-core FLOP/s (NVIDIA H100/H200 SXM spec)
    mem_bw_bytes_s: float = 4.8e12   # H200 HBM3e bandwidth
    bytes_per_param: int = 2         # weights and KV as BF16 on the modelled device

    def __post_init__(self):
        if not (self.peak_flops > 0 and self.mem_bw_bytes_s > 0 and self.bytes_per_param > 0):
            raise UserError("DeviceModel needs positive peak_flops, mem_bw_bytes_s and bytes_per_param")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where a kernel turns from memory- to compute-bound."""
        return self.peak_flops / self.mem_bw_bytes_s


@dataclass(frozen=True)
class StepCost:
    """The arithmetic of one step and the estimate derived from it."""

    flops: float
    bytes: float
    sm_active: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf


class SmEstimator:
    """Estimates ``sm_active`` of step records from a model config (``engine.config.ModelConfig``).

    ``kv_capacity_tokens`` (KV pool slots) turns ``kv_usage`` into the tokens attention reads.
    Use as an observer *before* the others, so they see the filled ``sm_active``.
    """

    source = "estimated"
    note: str | None = None  # why an estimate stands in for a measurement (CUDA without NVML)

    def __init__(self, model: Any, device: DeviceModel = DeviceModel(), kv_capacity_tokens: int | None = None):
        self.model = model
        self.device = device
        self.kv_capacity_tokens = kv_capacity_tokens
        m = model
        h, hd = m.hidden_size, m.head_dim
        self._attn_params = h * (m.num_heads * hd + 2 * m.num_kv_heads * hd) + m.num_heads * hd * h
        self._dense_mlp = 3 * h * m.intermediate_size
        self._expert = 3 * h * m.moe_intermediate_size if m.num_moe_layers else 0
        self._shared = 3 * h * getattr(m, "shared_expert_intermediate_size", 0)
        self._router = h * m.num_experts if m.num_moe_layers else 0
        self._lm_head = h * m.vocab_size
        self._kv_token_bytes = 2 * m.num_layers * m.num_kv_heads * hd * device.bytes_per_param

    def cost(self, prefill_tokens: float, decode_rows: float, logits_rows: float, kv_tokens_held: float) -> StepCost:
        """FLOPs, bytes and the estimate for a step of that shape."""
        m, dev = self.model, self.device
        t = float(prefill_tokens + decode_rows)
        if t <= 0:
            return StepCost(0.0, 0.0, 0.0)
        dense, moe = m.first_k_dense, m.num_moe_layers
        k, e = m.num_experts_per_tok if moe else 0, m.num_experts if moe else 0
        # Matmul FLOPs: 2 per multiply-add, per token, over the parameters each token uses.
        per_token = (m.num_layers * self._attn_params + dense * self._dense_mlp
                     + moe * (k * self._expert + self._shared + self._router))
        flops = 2.0 * per_token * t + 2.0 * self._lm_head * logits_rows
        # Attention: QK^T and PV, 2 x 2 x heads x head_dim per (query, key) pair per layer.
        pair = 4.0 * m.num_heads * m.head_dim * m.num_layers
        # Decode rows together read every token held (their contexts); a chunk is ~causal over itself.
        flops += pair * ((kv_tokens_held if decode_rows else 0.0) + prefill_tokens * prefill_tokens / 2.0)
        # Weights are read once per step; a MoE layer reads only the experts some token picked
        # (expected distinct experts of t*k uniform picks out of e).
        touched = e * (1.0 - (1.0 - 1.0 / e) ** (t * k)) if e else 0.0
        params = (m.num_layers * self._attn_params + dense * self._dense_mlp
                  + moe * (touched * self._expert + self._shared + self._router) + self._lm_head)
        # KV: decode rows read the contexts held; every scheduled token writes its K/V.
        nbytes = params * dev.bytes_per_param + ((kv_tokens_held if decode_rows else 0.0) + t) * self._kv_token_bytes
        t_c, t_m = flops / dev.peak_flops, nbytes / dev.mem_bw_bytes_s
        return StepCost(flops, nbytes, t_c / max(t_c, t_m))

    def estimate(self, record: Any) -> float:
        """The estimate for one step record (0 for an idle step)."""
        if getattr(record, "kind", None) == "idle":
            return 0.0
        prefill = float(getattr(record, "prefill_tokens", 0) or 0)
        decode = float(getattr(record, "decode_rows", 0) or 0)
        logits = float(getattr(record, "decode_reqs", 0) or 0) + float(getattr(record, "prefill_reqs", 0) or 0)
        usage = getattr(record, "kv_usage", None)
        held = 0.0
        if usage is not None and not math.isnan(float(usage)) and self.kv_capacity_tokens:
            held = float(usage) * self.kv_capacity_tokens
        return self.cost(prefill, decode, logits, held).sm_active

    def __call__(self, record: Any) -> None:
        record.sm_active = self.estimate(record)
        record.sm_active_source = self.source


class NvmlSmSampler:
    """SM activity from NVML between consecutive step ends (CUDA only), via the base-layer probe
    (:func:`mixdiag.gpu_probe.open_sm_probe`), never a collector.

    GPM ``SM_UTIL`` (Hopper+): quality ``measured``. Otherwise ``nvmlDeviceGetUtilizationRates``
    (the share of time any kernel ran, not SM activity): quality ``estimated``, as the NVML
    collector marks it, so the Prometheus gauge says ``source="estimated"`` too.
    """

    def __init__(self, device_index: int = 0, nvml: Any = None):
        from mixdiag.gpu_probe import open_sm_probe

        self._probe = open_sm_probe(device_index, nvml=nvml)
        self.source = self._probe.quality

    def read(self) -> float:
        """SM activity 0..1 since the previous read (GPM) or NVML's last utilization window."""
        return self._probe.read()

    def __call__(self, record: Any) -> None:
        record.sm_active = self.read()
        record.sm_active_source = self.source

    def close(self) -> None:
        self._probe.close()


def make_sm_source(device: str, model: Any, kv_capacity_tokens: int | None = None,
                   device_model: DeviceModel = DeviceModel(), *, require_nvml: bool = False):
    """The SM-activity observer for an engine on ``device`` ('cpu' -> estimate, 'cuda[:i]' -> NVML).

    On CUDA without a usable NVML (no nvidia-ml-py, no driver access) it falls back to the
    estimate, labelled ``estimated`` with the reason in ``.note``, unless ``require_nvml``.
    """
    if str(device).startswith("cuda"):
        index = int(str(device).split(":")[1]) if ":" in str(device) else 0
        try:
            return NvmlSmSampler(index)
        except UserError as e:
            if require_nvml:
                raise
            est = SmEstimator(model, device_model, kv_capacity_tokens)
            est.note = f"SM activity estimated, not measured: {e}"
            return est
    return SmEstimator(model, device_model, kv_capacity_tokens)
