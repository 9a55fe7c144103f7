"""CLI: ``python -m tests.helpers.foreign_trace --engine vllm --seed 3 --out X.sqlite [--truth X.csv]``."""
from __future__ import annotations

import argparse
import sys

from . import ENGINES, FAULTS, simulate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.helpers.foreign_trace", description=__doc__)
    ap.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--faults", default=None, help=f"comma list from {','.join(FAULTS)}; 'none' for none")
    ap.add_argument("--no-nvtx", action="store_true")
    ap.add_argument("--graph-trace", choices=("graph", "node"), default="graph")
    ap.add_argument("--fmt", choices=("nsys", "kineto"), default="nsys")
    ap.add_argument("--gpu-metrics-hz", type=int, default=0)
    ap.add_argument("--scale", type=int, default=None, help="target kernel rows (benchmarks)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--truth", default=None, help="write the per-step truth as CSV here")
    a = ap.parse_args(argv)
    faults = None if a.faults is None else (() if a.faults == "none" else tuple(a.faults.split(",")))
    try:
        t = simulate(a.engine, a.seed, a.steps, faults, not a.no_nvtx, a.graph_trace, a.fmt, a.out,
                     a.gpu_metrics_hz, a.scale)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.truth:
        t.steps.to_csv(a.truth, index=False)
    print(f"wrote {', '.join(map(str, t.paths))}: {len(t.steps)} step rows, {t.meta['kernel_rows']} kernel rows, "
          f"causes {t.steps['cause'].value_counts().to_dict()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
