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

from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.engine import Engine
from mixdiag.engine.runner import run_workload, summarize
from mixdiag.engine.workload import LengthDist, RequestGroup, Workload, generate

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


def run_policy(policy: str, args) -> dict:
    cfg = EngineConfig(model=ModelConfig.preset("tiny"), cache=CacheConfig(num_blocks=4096),
                       scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=512, chunked_prefill_size=512),
                       seed=args.seed, num_threads=args.threads)
    eng = Engine(cfg)
    items = generate(workload(args), args.seed, cfg.model.vocab_size, cfg.model.max_model_len)
    res = run_workload(eng, items, max_steps=100_000)
    s = summarize(eng, res, eng.timeline(res.records))
    return {k: s[k] for k in ("itl_s", "ttft_s", "output_tokens", "output_tokens_per_s", "steps", "steps_by_kind",
                              "decode_stall_steps", "wall_s")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decodes", type=int, default=32)
    ap.add_argument("--long", type=int, default=3)
    ap.add_argument("--output", type=int, default=120, help="chat output tokens (min; +0..20)")
    ap.add_argument("--every", type=int, default=30, help="steps between long prompts")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = engine default)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)
    results = {}
    for p in POLICIES:
        note(f"running {p} ...")
        results[p] = run_policy(p, args)
    base = results["prefill_first"]
    rows = []
    for p in POLICIES:
        r = results[p]
        r["itl_p99_ratio"] = r["itl_s"]["p99"] / base["itl_s"]["p99"]
        r["throughput_ratio"] = r["output_tokens_per_s"] / base["output_tokens_per_s"]
        rows.append(f"{p:<14} ITL p50 {r['itl_s']['p50'] * 1e3:7.1f} ms  p99 {r['itl_s']['p99'] * 1e3:7.1f} ms  "
                    f"max {r['itl_s']['max'] * 1e3:7.1f} ms | TTFT p50 {r['ttft_s']['p50'] * 1e3:7.1f} ms  "
                    f"p99 {r['ttft_s']['p99'] * 1e3:7.1f} ms | {r['output_tokens_per_s']:6.1f} tok/s | "
                    f"P99 ITL x{r['itl_p99_ratio']:.2f}  throughput x{r['throughput_ratio']:.2f} | "
                    f"steps {r['steps_by_kind']}")
    ok = {p: results[p]["itl_p99_ratio"] <= ITL_TARGET and results[p]["throughput_ratio"] >= 1 - THROUGHPUT_TOLERANCE
          for p in ("token_budget", "mix_running")}
    print("\n".join(rows))
    print(f"target: P99 ITL <= {ITL_TARGET}x prefill_first, throughput >= {1 - THROUGHPUT_TOLERANCE:.2f}x: "
          + ", ".join(f"{p} {'met' if v else 'MISSED'}" for p, v in ok.items()))
    if args.json:
        print(json.dumps({"benchmark": "mixing", "config": dataclasses.asdict(args) if dataclasses.is_dataclass(args)
                          else vars(args), "results": results, "target_itl_p99_ratio": ITL_TARGET,
                          "throughput_tolerance": THROUGHPUT_TOLERANCE, "met": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
