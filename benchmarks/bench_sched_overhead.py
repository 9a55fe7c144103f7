"""Host overhead of a step: (schedule + prepare_inputs time) / forward time at 256 running requests.

One engine (tiny model), ``--reqs`` requests with ``--prompt``-token prompts, prefilled, then
``--steps`` pure decode steps of all of them are timed. Prints the medians of schedule, prepare and
forward time per step and the ratio of (schedule + prepare) to forward, both as a ratio of medians
and as the median of per-step ratios. Target <= 0.10. ``--json`` ends with one JSON line.

    .venv/bin/python benchmarks/bench_sched_overhead.py [--reqs 256] [--steps 30] [--policy token_budget] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from mixdiag.engine.config import EngineConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.core.request import SamplingParams

TARGET = 0.10


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reqs", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--policy", default="token_budget", choices=("token_budget", "mix_running", "prefill_first"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)
    eng = Engine(EngineConfig(scheduler=SchedulerConfig(policy=args.policy, max_num_seqs=args.reqs,
                                                        max_num_batched_tokens=max(512, args.reqs),
                                                        chunked_prefill_size=max(512, 2 * args.reqs)),
                              num_threads=args.threads))
    for i in range(args.reqs):
        eng.add_request([1 + (i * 31 + j) % 1000 for j in range(args.prompt)],
                        SamplingParams(max_tokens=10_000, ignore_eos=True))   # never finishes during the run
    while True:
        r = eng.step()
        if r.kind == "decode" and r.decode_reqs == args.reqs:
            break
    recs = [eng.step() for _ in range(args.steps)]
    assert all(r.kind == "decode" and r.decode_reqs == args.reqs for r in recs)
    sched = statistics.median(r.schedule_s for r in recs)
    prep = statistics.median(r.prepare_s for r in recs)
    fwd = statistics.median(r.forward_s for r in recs)
    ratio = (sched + prep) / fwd
    per_step = statistics.median((r.schedule_s + r.prepare_s) / r.forward_s for r in recs)
    print(f"{args.reqs} running requests ({args.policy}), {args.steps} decode steps: schedule {sched * 1e3:.2f} ms, "
          f"prepare {prep * 1e3:.2f} ms, forward {fwd * 1e3:.2f} ms (medians)")
    print(f"(schedule + prepare) / forward = {ratio:.3f} (median of per-step ratios {per_step:.3f}); "
          f"target <= {TARGET}: {'met' if ratio <= TARGET else 'MISSED'}")
    if args.json:
        print(json.dumps({"benchmark": "sched_overhead", "config": vars(args), "schedule_s": sched, "prepare_s": prep,
                          "forward_s": fwd, "ratio": ratio, "ratio_per_step_median": per_step, "target": TARGET,
                          "met": ratio <= TARGET}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
