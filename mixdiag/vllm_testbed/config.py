"""What one testbed run is: duration, seed, the faults to inject, the traffic and the server knobs.

Frozen and validated on construction (bad values raise :class:`~mixdiag.errors.UserError`, one
line). The fault *schedule* is not here: :mod:`.fault_plan` draws it from ``seed``.
"""
from __future__ import annotations

from dataclasses import dataclass

from mixdiag.errors import UserError

#: Faults the testbed can inject (``--faults``); docs/testbed-vllm.md says what each does.
FAULTS = ("long_prompts", "small_kv", "host_stall", "gc_pause", "cpu_hog", "saturation", "batch_limits")


def parse_faults(text: str) -> tuple[str, ...]:
    """``"long_prompts,host_stall"`` -> a tuple; ``""`` or ``"none"`` -> no faults (a control run)."""
    text = (text or "").strip()
    if text in ("", "none"):
        return ()
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [n for n in names if n not in FAULTS]
    if bad:
        raise UserError(f"unknown fault {bad[0]!r}; choose from {', '.join(FAULTS)} (or none)")
    return names


@dataclass(frozen=True)
class TrafficConfig:
    """The steady base load: short prompts, streaming, a fixed number of open streams at most."""

    # ~2.5 req/s of ~130-token answers at 15-30 ms a step (8-12 running, 2 busy cores) keeps a
    # decode batch of 6-12 without outrunning the server (measured: 5 req/s of 250-token answers
    # left two thirds of the requests unsent behind the 12 open streams)
    rate: float = 2.5               # requests per second (Poisson)
    prompt_len: str = "uniform:32:128"
    output_len: str = "uniform:64:192"
    max_concurrency: int = 12        # open streams at most (the decode batch the base load builds)

    def __post_init__(self):
        if not self.rate > 0:
            raise UserError(f"traffic rate must be > 0 requests/s, got {self.rate}")
        if self.max_concurrency < 1:
            raise UserError(f"traffic max_concurrency must be >= 1, got {self.max_concurrency}")


@dataclass(frozen=True)
class ServerConfig:
    """Knobs of ``vllm serve`` the testbed sets (``batch_limits`` and ``small_kv`` override some)."""

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    max_model_len: int = 8192
    kv_cache_space_gib: int = 1       # VLLM_CPU_KVCACHE_SPACE; a whole number of GiB on CPU
    num_kv_blocks: int | None = None  # --num-gpu-blocks-override (small_kv sets it)
    dtype: str = "bfloat16"
    iteration_details: bool = True    # truth; routed away from the operator log
    # VLLM_GC_DEBUG=1: vLLM logs every garbage collection's time (an operator's choice; gc_pause sets it)
    gc_debug: bool = False
    ready_timeout_s: float = 600.0

    def __post_init__(self):
        if self.max_num_batched_tokens < 16:
            raise UserError(f"max_num_batched_tokens must be >= 16, got {self.max_num_batched_tokens}")
        if self.max_num_seqs < 1:
            raise UserError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len < 128:
            raise UserError(f"max_model_len must be >= 128, got {self.max_model_len}")
        if self.kv_cache_space_gib < 1:
            raise UserError(f"kv_cache_space_gib must be >= 1, got {self.kv_cache_space_gib}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 4:
            raise UserError(f"num_kv_blocks must be >= 4, got {self.num_kv_blocks}")
        if self.dtype not in ("bfloat16", "float32", "float16"):
            raise UserError(f"dtype must be bfloat16, float16 or float32, got {self.dtype!r}")


@dataclass(frozen=True)
class TestbedConfig:
    """One run: ``duration_s`` of traffic with ``faults`` drawn from ``seed``."""

    __test__ = False   # not a pytest test class despite the name

    duration_s: float
    seed: int = 0
    faults: tuple[str, ...] = ()
    scrape_interval_s: float = 1.0
    traffic: TrafficConfig = TrafficConfig()
    server: ServerConfig = ServerConfig()
    drain_s: float = 60.0             # after the sending window: how long requests may still finish
    live_analyze: bool = False        # run `mixdiag analyze <url>/metrics` beside the load (tier g5)
    long_prompt_gap_s: float | None = None  # mean gap of the long-prompt load; None: drawn from 8-20 s

    def __post_init__(self):
        if not self.duration_s >= 5:
            raise UserError(f"--duration must be >= 5 seconds, got {self.duration_s}")
        if not 0.05 <= self.scrape_interval_s <= 60:
            raise UserError(f"scrape interval must be in [0.05, 60] s, got {self.scrape_interval_s}")
        bad = [f for f in self.faults if f not in FAULTS]
        if bad:
            raise UserError(f"unknown fault {bad[0]!r}; choose from {', '.join(FAULTS)}")
        if self.long_prompt_gap_s is not None and not self.long_prompt_gap_s > 0:
            raise UserError(f"long-prompt gap must be > 0 s, got {self.long_prompt_gap_s}")
        if self.drain_s < 0:
            raise UserError(f"drain_s must be >= 0, got {self.drain_s}")
