"""Engine configuration: frozen, validated dataclasses (model, KV cache, scheduler, engine).

Invalid values raise :class:`ConfigError` (a :class:`~mixdiag.errors.UserError`), so a bad scenario
file ends in a one-line ``error: ...`` from the CLI.

An engine-level module: core, model, testbed, telemetry and serving all read it, so it sits beside
them rather than in one of them, and imports none of them. May import: the standard library, mixdiag.errors.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from mixdiag.errors import UserError

POLICIES = ("token_budget", "mix_running", "prefill_first")
CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "NONE")
DTYPES = ("float32", "float64", "bfloat16", "float16")


class ConfigError(UserError, ValueError):
    """A configuration value is out of range or inconsistent."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _positive(obj, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        _check(isinstance(v, int) and not isinstance(v, bool) and v > 0,
               f"{type(obj).__name__}.{n} must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Decoder shape: ``first_k_dense`` dense layers, then MoE layers (router + top-k experts)."""

    vocab_size: int = 1024
    hidden_size: int = 256
    num_layers: int = 4
    first_k_dense: int = 1
    num_heads: int = 4                    # q width 128 < hidden: keeps long-context chunks cheap on CPU
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 512          # dense SwiGLU MLP
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 256
    shared_expert_intermediate_size: int = 0  # 0 = no shared expert
    max_model_len: int = 16384
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    eos_token_id: int = 1
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    seed: int = 0                         # weights are drawn from this seed

    def __post_init__(self):
        _positive(self, "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "max_model_len")
        _check(0 <= self.first_k_dense <= self.num_layers,
               f"ModelConfig.first_k_dense must be in [0, num_layers={self.num_layers}], got {self.first_k_dense}")
        _check(self.num_heads % self.num_kv_heads == 0,
               f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        _check(self.head_dim % 2 == 0, f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_moe_layers:
            _positive(self, "num_experts", "num_experts_per_tok", "moe_intermediate_size")
            _check(self.num_experts_per_tok <= self.num_experts,
                   f"ModelConfig.num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts "
                   f"({self.num_experts})")
        _check(self.shared_expert_intermediate_size >= 0, "ModelConfig.shared_expert_intermediate_size must be >= 0")
        _check(0 <= self.eos_token_id < self.vocab_size,
               f"ModelConfig.eos_token_id must be in [0, vocab_size), got {self.eos_token_id}")
        _check(self.dtype in DTYPES, f"ModelConfig.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _check(self.rope_theta > 0 and self.rms_norm_eps > 0, "ModelConfig.rope_theta and rms_norm_eps must be > 0")

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _itemsize(self.dtype)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        """A named shape (``tiny``: the CPU default; ``small``: GPU-sized) with optional overrides."""
        if name not in MODEL_PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
        return dataclasses.replace(MODEL_PRESETS[name], **overrides)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}[dtype]


MODEL_PRESETS: dict[str, ModelConfig] = {
    # CPU default: a 512-token prefill chunk is compute-bound and several times dearer than a
    # 32-request decode step, so mixed steps stand out (benchmarks/bench_mixing.py measures it).
    "tiny": ModelConfig(),
    # GPU-sized: still random weights, large enough that decode is memory-bound on an H100/H200.
    "small": ModelConfig(vocab_size=32000, hidden_size=1024, num_layers=8, first_k_dense=2, num_heads=16,
                         num_kv_heads=4, head_dim=64, intermediate_size=2816, num_experts=16,
                         num_experts_per_tok=2, moe_intermediate_size=704, shared_expert_intermediate_size=704,
                         max_model_len=32768, dtype="bfloat16"),
}


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV pool: ``num_blocks`` blocks of ``block_size`` tokens (small values force preemption)."""

    block_size: int = 16
    num_blocks: int = 4096
    enable_prefix_caching: bool = False     # full blocks keyed by a chain hash, reused across requests
    allow_inflight_prefix_hits: bool = False  # vLLM: hit blocks still being written this step (else refused)

    def __post_init__(self):
        _positive(self, "block_size", "num_blocks")

    @property
    def num_slots(self) -> int:
        return self.block_size * self.num_blocks


def default_capture_sizes(max_size: int = 512) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, then of 16."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    return tuple(s for s in sizes if s <= max_size)


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler policy and its knobs (vLLM and SGLang names where they exist)."""

    policy: str = "token_budget"
    max_num_seqs: int = 256                 # running requests at most
    max_num_batched_tokens: int = 512       # vLLM token budget per step (token_budget, prefill_first)
    long_prefill_token_threshold: int = 0   # vLLM: cut one request's chunk to this (0 = off)
    chunked_prefill_size: int = 512         # SGLang: prefill tokens per step (mix_running)
    enable_mixed_chunk: bool = True         # SGLang: decodes join the prefill batch as 1-token extends
    num_spec_tokens: int = 0                # speculative draft tokens per decode (uniform decode = 1 + k)
    cudagraph_capture_sizes: tuple[int, ...] = field(default_factory=default_capture_sizes)
    enforce_eager: bool = False             # plan NONE for every step
    #: which graphs exist: FULL_AND_PIECEWISE (vLLM's default), FULL (uniform decode only),
    #: PIECEWISE (no FULL graphs: uniform decode replays piecewise), NONE (eager, = enforce_eager)
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    draft_slots: int = 0                    # vLLM: input slots per request for parallel drafting
    enable_microbatching: bool = False      # gate a two-micro-batch split per step (decision recorded)
    microbatch_min_tokens: int = 32         # steps below this are not worth splitting

    def __post_init__(self):
        _check(self.policy in POLICIES, f"SchedulerConfig.policy must be one of {', '.join(POLICIES)}, "
                                        f"got {self.policy!r}")
        _positive(self, "max_num_seqs", "max_num_batched_tokens", "chunked_prefill_size")
        _check(self.long_prefill_token_threshold >= 0, "SchedulerConfig.long_prefill_token_threshold must be >= 0")
        _check(self.num_spec_tokens >= 0, "SchedulerConfig.num_spec_tokens must be >= 0")
        _check(self.cudagraph_mode in CUDAGRAPH_MODES, f"SchedulerConfig.cudagraph_mode must be one of "
                                                       f"{', '.join(CUDAGRAPH_MODES)}, got {self.cudagraph_mode!r}")
        _check(self.draft_slots >= 0, "SchedulerConfig.draft_slots must be >= 0")
        _check(self.draft_slots < self.max_num_batched_tokens,
               "SchedulerConfig.draft_slots must be below max_num_batched_tokens")
        _check(self.microbatch_min_tokens >= 2, "SchedulerConfig.microbatch_min_tokens must be >= 2")
        sizes = tuple(self.cudagraph_capture_sizes)
        _check(all(isinstance(s, int) and s > 0 for s in sizes),
               f"SchedulerConfig.cudagraph_capture_sizes must be positive integers, got {sizes!r}")
        # Normalise to a sorted, de-duplicated tuple (frozen: assign through object.__setattr__).
        object.__setattr__(self, "cudagraph_capture_sizes", tuple(sorted(set(sizes))))

    @property
    def uniform_decode_query_len(self) -> int:
        return 1 + self.num_spec_tokens


@dataclass(frozen=True)
class EngineConfig:
    """Everything an :class:`~mixdiag.engine.core.engine.Engine` needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int = 0                 # sampling seed (requests without their own seed derive one from it)
    instance: str = "engine0"
    device: str = "cpu"
    num_threads: int = 0          # torch intra-op threads; 0 = min(cpu count, 8)

    def __post_init__(self):
        _check(self.num_threads >= 0, "EngineConfig.num_threads must be >= 0")
        _check(bool(self.instance), "EngineConfig.instance must be a non-empty name")

    @property
    def threads(self) -> int:
        return self.num_threads or max(1, min(os.cpu_count() or 1, 8))
