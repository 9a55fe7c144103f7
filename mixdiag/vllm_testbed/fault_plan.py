"""The fault schedule of one run, drawn from its seed: which server knobs change, when each timed
fault starts, how long it lasts and how strong it is. Nothing is a fixed schedule; faults of
different kinds are drawn independently, so they may overlap (as they do on real servers).

Timed faults (offsets from the start of the traffic):

* ``host_stall``: SIGSTOP of the EngineCore for 100-500 ms, a Poisson process (mean gap 4-8 s) - a
  stall the engine cannot see (a cgroup throttle, a stopped process);
* ``gc_pause``: full garbage collections of the EngineCore's heap for 100-500 ms (at least one
  collection), a Poisson process (mean gap 4-8 s), with vLLM's GC debugger on (``VLLM_GC_DEBUG=1``):
  a stall the engine measures and logs (truth cause ``host_stall``);
* ``cpu_hog``: 1-2 busy-looping processes on the server's cores for 2-6 s, about one per 30 s;
* ``saturation``: a burst of extra streams well above what the server sustains, 5-12 s, about one per 60 s.

Whole-run faults (server knobs): ``small_kv`` (a KV cache of 6-9 blocks of 128 tokens, so
running requests are preempted), ``batch_limits`` (``--max-num-batched-tokens`` and
``--max-num-seqs`` drawn from small sets). ``long_prompts`` is a second load: 1500-6000-token
prompts, Poisson with a mean gap of 8-20 s, chunked at ``--max-num-batched-tokens``.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from mixdiag.vllm_testbed.config import ServerConfig, TestbedConfig

#: vLLM's CPU KV block (tokens); ``small_kv`` sizes the cache in these blocks.
CPU_BLOCK_TOKENS = 128
_WARMUP_S = 3.0   # no timed fault before the base load has built its decode batch


@dataclass(frozen=True)
class TimedFault:
    """One timed fault: ``kind`` at ``at_s`` (offset from traffic start) for ``duration_s``."""

    kind: str
    at_s: float
    duration_s: float
    magnitude: float   # host_stall: unused (1); cpu_hog: processes; saturation: requests/s of the burst


@dataclass(frozen=True)
class LongPrompts:
    """The long-prompt load: Poisson at ``rate``, prompt lengths ``uniform:lo:hi``."""

    rate: float
    lo: int
    hi: int
    output_len: int

    @property
    def prompt_len(self) -> str:
        return f"uniform:{self.lo}:{self.hi}"


@dataclass(frozen=True)
class FaultPlan:
    """Everything drawn for a run: the server config in force, the long prompts, the timed faults."""

    server: ServerConfig
    long_prompts: LongPrompts | None
    timed: tuple[TimedFault, ...]
    whole_run: tuple[tuple[str, str], ...]   # (cause, detail) rows that hold for the whole run

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _poisson(rng: random.Random, mean_gap: float, start: float, end: float) -> list[float]:
    out, t = [], start
    while True:
        t += rng.expovariate(1.0 / mean_gap)
        if t >= end:
            return out
        out.append(t)


def draw(cfg: TestbedConfig) -> FaultPlan:
    """The plan for ``cfg``: a pure function of ``cfg`` (its seed and fault list)."""
    rng = random.Random(f"mixdiag-vllm-testbed:{cfg.seed}")
    server = cfg.server
    whole: list[tuple[str, str]] = []
    # Each fault draws from its own stream: adding a fault to the list leaves the others' schedules alone.
    sub = {f: random.Random(f"{rng.random()}:{f}") for f in ("batch_limits", "small_kv", "long_prompts",
                                                               "host_stall", "cpu_hog", "saturation")}
    # drawn after the others' streams: adding it changed no earlier schedule of a seed
    sub["gc_pause"] = random.Random(f"{rng.random()}:gc_pause")
    if "batch_limits" in cfg.faults:
        r = sub["batch_limits"]
        server = dataclasses.replace(server, max_num_batched_tokens=r.choice((256, 512, 1024, 2048)),
                                     max_num_seqs=r.choice((4, 8, 16, 32)))
        whole.append(("config", f"max_num_batched_tokens={server.max_num_batched_tokens} "
                                f"max_num_seqs={server.max_num_seqs}"))
    if "small_kv" in cfg.faults:
        blocks = sub["small_kv"].randint(6, 9)
        # vLLM refuses a max_model_len the cache cannot hold once; it keeps one block back
        # (measured: 13 blocks -> "estimated maximum model length is 1536")
        server = dataclasses.replace(server, num_kv_blocks=blocks,
                                     max_model_len=min(server.max_model_len, (blocks - 1) * CPU_BLOCK_TOKENS))
        whole.append(("kv_pressure", f"num_kv_blocks={blocks} ({blocks * CPU_BLOCK_TOKENS} tokens)"))
    long_prompts = None
    if "long_prompts" in cfg.faults:
        r = sub["long_prompts"]
        out_len = r.randint(4, 16)
        cap = server.max_model_len - out_len - 8
        hi = min(r.randint(4000, 6000), cap)
        lo = min(r.randint(1500, 2500), hi)
        gap = r.uniform(8.0, 20.0)   # drawn even when overridden: the stream stays the same
        long_prompts = LongPrompts(rate=1.0 / (cfg.long_prompt_gap_s or gap), lo=lo, hi=hi, output_len=out_len)
    end = cfg.duration_s - 1.0
    timed: list[TimedFault] = []
    if "host_stall" in cfg.faults:
        r = sub["host_stall"]
        times = _poisson(r, r.uniform(4.0, 8.0), _WARMUP_S, end) or [r.uniform(_WARMUP_S, max(_WARMUP_S, end))]
        timed += [TimedFault("host_stall", t, r.uniform(0.1, 0.5), 1.0) for t in times]
    if "gc_pause" in cfg.faults:
        r = sub["gc_pause"]
        server = dataclasses.replace(server, gc_debug=True)
        times = _poisson(r, r.uniform(4.0, 8.0), _WARMUP_S, end) or [r.uniform(_WARMUP_S, max(_WARMUP_S, end))]
        timed += [TimedFault("gc_pause", t, r.uniform(0.1, 0.5), 1.0) for t in times]
    if "cpu_hog" in cfg.faults:
        r = sub["cpu_hog"]
        n = max(1, round(cfg.duration_s / 30.0))
        for _ in range(n):
            d = r.uniform(2.0, 6.0)
            timed.append(TimedFault("cpu_hog", r.uniform(_WARMUP_S, max(_WARMUP_S, end - d)), d, r.randint(1, 2)))
    if "saturation" in cfg.faults:
        r = sub["saturation"]
        n = max(1, round(cfg.duration_s / 60.0))
        for _ in range(n):
            d = r.uniform(5.0, 12.0)
            rate = cfg.traffic.rate * r.uniform(4.0, 8.0)
            timed.append(TimedFault("saturation", r.uniform(_WARMUP_S, max(_WARMUP_S, end - d)), d, rate))
    timed.sort(key=lambda f: f.at_s)
    return FaultPlan(server=server, long_prompts=long_prompts, timed=tuple(timed), whole_run=tuple(whole))
