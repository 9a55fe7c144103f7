"""Mixing's stall removal: the same workload under prefill_first, token_budget and mix_running.

Workload (step-time arrivals, so every policy sees the same requests; the tiny model):
``--decodes`` chat requests (prompts 64-256 tokens, ``--output`` tokens each) arrive at step 0 and
decode; ``--long`` prompts of 2k-4k tokens arrive every ``--every`` steps from step 20. Budget:
512 tokens per step (``chunked_prefill_size`` 512 for mix_running).

Prints, per policy: ITL P50/P99/max, TTFT P50/P99, output tokens/s, steps by kind, and the ratios
against prefill_first. Target (Sarathi-Serve's headline): mixing's P99 ITL <= 0.35x
prefill_first's with output throughput within 10%. ``--json`` ends with one JSON line.

    .venv/bin/python benchmarks/bench_mixing.py [--decodes 32] [--long 3] [--output 120] [--json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.testbed.runner import run_workload, summarize
from mixdiag.engine.testbed.workload import LengthDist, RequestGroup, Workload, generate

POLICIES = ("prefill_first", "token_budget", "mix_running")
ITL_TARGET = 0.35
THROUGHPUT_TOLERANCE = 0.10


def note(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def workload(args) -> Workload:
    return Workload(groups=(
        RequestGroup(name="chat", count=args.decodes, arrival="burst", start=0,
                     prompt_len=LengthDist("uniform", low=64, high=256),
                     output_len=LengthDist("uniform", low=args.output, high=args.output + 20)),
        RequestGroup(name="long", count=args.long, arrival="fixed", start=20, interval=args.every,
                     prompt_len=LengthDist("uniform", low=2048, high=4096), output_len=LengthDist(value=8)),
    ))


def cpu_clock(res, step_cpu: list[float], submitted_at: dict[str, int]) -> dict:
    """ITL/TTFT/throughput on a clock that advances by each step's thread CPU time.

    Other processes on a shared machine stretch wall-clock steps at random; a step's CPU time
    (torch on the calling thread, ``--threads 1``) does not, so the policies compare fairly.
    """
    ends = np.cumsum(step_cpu)
    starts = ends - np.asarray(step_cpu)
    events: dict[str, list[float]] = {}
    for i, r in enumerate(res.records):
        for e in r.token_events:
            events.setdefault(e.request_id, []).append(ends[i])
    itl = np.concatenate([np.diff(v) for v in events.values() if len(v) > 1])
    ttft = [v[0] - starts[submitted_at[rid]] for rid, v in events.items()]
    return {"itl_s": {"p50": float(np.quantile(itl, 0.5)), "p99": float(np.quantile(itl, 0.99)),
                      "max": float(itl.max())},
            "ttft_s": {"p50": float(np.quantile(ttft, 0.5)), "p99": float(np.quantile(ttft, 0.99))},
            "output_tokens_per_s": sum(r.output_tokens for r in res.records) / float(ends[-1])}


def run_policy(policy: str, args) -> dict:
    cfg = EngineConfig(model=ModelConfig.preset("tiny"), cache=CacheConfig(num_blocks=4096),
                       scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=512, chunked_prefill_size=512),
                       seed=args.seed, num_threads=args.threads)
    eng = Engine(cfg)
    items = generate(workload(args), args.seed, cfg.model.vocab_size, cfg.model.max_model_len)
    step_cpu: list[float] = []
    submitted_at: dict[str, int] = {}
    step = eng.step

    def timed_step():
        c = time.thread_time()
        rec = step()
        step_cpu.append(time.thread_time() - c)
        return rec

    def submit(prompt, params, **kw):
        submitted_at[kw["request_id"]] = eng.step_no
        return eng.add_request(prompt, params, **kw)

    eng.step = timed_step
    res = run_workload(eng, items, max_steps=100_000, submit=submit)
    s = summarize(eng, res, eng.timeline(res.records))
    out = {k: s[k] for k in ("itl_s", "ttft_s", "output_tokens", "output_tokens_per_s", "steps", "steps_by_kind",
                             "decode_stall_steps", "wall_s")}
    out["cpu_clock"] = cpu_clock(res, step_cpu, submitted_at)
    return out


def step_cost_ratio(threads: int, repeats: int = 7) -> dict:
    """Median forward time of a 512-token prefill chunk over that of a 32-request decode step (tiny model)."""
    from mixdiag.engine.core.request import SamplingParams

    eng = Engine(EngineConfig(num_threads=threads))
    for i in range(32):
        eng.add_request([1 + (i * 13 + j) % 1000 for j in range(128)], SamplingParams(max_tokens=10_000, ignore_eos=True))
    while not (r := eng.step()).kind == "decode":
        pass
    decode = sorted(eng.step().forward_s for _ in range(repeats))[repeats // 2]
    chunk = []
    for i in range(repeats):
        e = Engine(EngineConfig(num_threads=threads), model=eng.model)
        e.add_request([1 + (i + j) % 1000 for j in range(512)], SamplingParams(max_tokens=1, ignore_eos=True))
        chunk.append(e.step().forward_s)
    prefill = sorted(chunk)[repeats // 2]
    return {"decode32_forward_s": decode, "prefill512_forward_s": prefill, "ratio": prefill / decode}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decodes", type=int, default=32)
    ap.add_argument("--long", type=int, default=3)
    ap.add_argument("--output", type=int, default=120, help="chat output tokens (min; +0..20)")
    ap.add_argument("--every", type=int, default=30, help="steps between long prompts")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: the CPU clock then counts all of a step's compute)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)
    results = {}
    for p in POLICIES:
        note(f"running {p} ...")
        results[p] = run_policy(p, args)
    cost = step_cost_ratio(args.threads)
    base = results["prefill_first"]
    rows = []
    for p in POLICIES:
        r = results[p]
        for clock, d, b in (("wall", r, base), ("cpu", r["cpu_clock"], base["cpu_clock"])):
            d["itl_p99_ratio"] = d["itl_s"]["p99"] / b["itl_s"]["p99"]
            d["throughput_ratio"] = d["output_tokens_per_s"] / b["output_tokens_per_s"]
            rows.append(f"{p:<14} {clock:<4} ITL p50 {d['itl_s']['p50'] * 1e3:7.1f} ms  p99 {d['itl_s']['p99'] * 1e3:7.1f} ms  "
                        f"max {d['itl_s']['max'] * 1e3:7.1f} ms | TTFT p50 {d['ttft_s']['p50'] * 1e3:7.1f} ms  "
                        f"p99 {d['ttft_s']['p99'] * 1e3:7.1f} ms | {d['output_tokens_per_s']:6.1f} tok/s | "
                        f"P99 ITL x{d['itl_p99_ratio']:.2f}  throughput x{d['throughput_ratio']:.2f}")
        rows.append(f"{'':<14} steps {r['steps_by_kind']}, decode stall steps {r['decode_stall_steps']}")
    # Judged on the CPU clock (robust to other processes); the wall-clock rows are shown beside it.
    ok = {p: results[p]["cpu_clock"]["itl_p99_ratio"] <= ITL_TARGET
          and results[p]["cpu_clock"]["throughput_ratio"] >= 1 - THROUGHPUT_TOLERANCE
          for p in ("token_budget", "mix_running")}
    print("\n".join(rows))
    print(f"step cost (tiny): 512-token prefill chunk {cost['prefill512_forward_s'] * 1e3:.1f} ms vs 32-request decode "
          f"{cost['decode32_forward_s'] * 1e3:.1f} ms: x{cost['ratio']:.1f}")
    print(f"target (cpu clock): P99 ITL <= {ITL_TARGET}x prefill_first, throughput >= {1 - THROUGHPUT_TOLERANCE:.2f}x: "
          + ", ".join(f"{p} {'met' if v else 'MISSED'}" for p, v in ok.items()))
    if args.json:
        print(json.dumps({"benchmark": "mixing", "config": dataclasses.asdict(args) if dataclasses.is_dataclass(args)
                          else vars(args), "results": results, "step_cost": cost, "target_itl_p99_ratio": ITL_TARGET,
                          "throughput_tolerance": THROUGHPUT_TOLERANCE, "met": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
