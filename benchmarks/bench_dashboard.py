"""Dashboard responsiveness at 200 000 steps: downsampled figures vs drawing every point.

Builds a Timeline of N steps (8 decoding requests, a chunked prefill mixed in every 50 steps),
diagnoses it once, prepares the Timeline page's data once (what the server caches), then measures
side by side, for the full range and for a zoom on 1 % of it:

* build + JSON-serialise the downsampled figure (what a zoom costs the server), and its payload;
* the same figure with every point (``max_points`` = N), the naive alternative.

Prints the ratios (naive / downsampled) of time and payload bytes. ``--json`` ends with one JSON
line. Target: a zoom re-sample under 1 s and a payload under 1 MB at 200 000 steps.

    .venv/bin/python benchmarks/bench_dashboard.py [--steps 200000] [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd
import plotly.io as pio

from mixdiag.dashboard.figures import timeline_figure
from mixdiag.dashboard.pages.timeline import timeline_view
from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline


def build(n_steps: int, reqs: int = 8, period: int = 50, seed: int = 0) -> Timeline:
    """A decode stream of ``reqs`` requests with a 512-token prefill chunk mixed in every ``period`` steps."""
    rng = np.random.default_rng(seed)
    mixed = (np.arange(n_steps) % period) == period // 2
    dur = np.where(mixed, 0.105, 0.020 * (1 + 0.04 * rng.standard_normal(n_steps)))
    start = np.cumsum(np.r_[0.0, dur[:-1] + 0.001])
    steps = pd.DataFrame({"instance": "engine0", "step": np.arange(n_steps), "t_start_s": start, "t_end_s": start + dur,
                          "granularity": "step", "kind": np.where(mixed, "mixed", "decode"),
                          "prefill_tokens": np.where(mixed, 512.0, 0.0), "prefill_reqs": mixed.astype(float),
                          "decode_reqs": float(reqs), "decode_rows": float(reqs),
                          "graph_mode": np.where(mixed, "PIECEWISE", "FULL"),
                          "sm_active": np.where(mixed, 0.95, np.clip(0.3 + 0.02 * rng.standard_normal(n_steps), 0, 1))})
    t = np.repeat(start + dur, reqs)
    tokens = pd.DataFrame({"instance": "engine0", "request_id": np.tile([f"r{i}" for i in range(reqs)], n_steps),
                           "t_s": t, "n_tokens": 1, "step": np.repeat(np.arange(n_steps), reqs).astype(float)})
    return Timeline(steps, tokens, meta={"source": "bench_dashboard", "signals": {"engine0": {"sm_active": "estimated"}}})


def timed(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--max-points", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    a = ap.parse_args(argv)

    t = time.perf_counter()
    tl = build(a.steps)
    t_build = time.perf_counter() - t
    t_diag, d = timed(lambda: diagnose(tl), repeat=1)
    t_view, view = timed(lambda: timeline_view(tl, d, "engine0"), repeat=1)
    lo, hi = view.x_extent
    zoom = (lo + 0.495 * (hi - lo), lo + 0.505 * (hi - lo))
    rows = {}
    for name, rng in (("full", None), ("zoom 1%", zoom)):
        t_ds, fig = timed(lambda: pio.to_json(timeline_figure(view, x_range=rng, max_points=a.max_points)))
        t_naive, naive = timed(lambda: pio.to_json(timeline_figure(view, x_range=rng, max_points=10 * a.steps)),
                               repeat=1)
        rows[name] = {"downsampled_s": t_ds, "naive_s": t_naive, "downsampled_bytes": len(fig),
                      "naive_bytes": len(naive), "time_ratio": t_naive / t_ds, "bytes_ratio": len(naive) / len(fig)}
    print(f"{a.steps:,} steps, {len(tl.tokens):,} token events, {len(d.spikes):,} spikes "
          f"(build {t_build:.1f} s, diagnose {t_diag:.1f} s, page data {t_view:.1f} s, once per dataset)")
    print(f"{'range':<9} {'downsampled':>12} {'naive':>9} {'ratio':>6}   {'payload':>9} {'naive':>9} {'ratio':>6}")
    for name, r in rows.items():
        print(f"{name:<9} {r['downsampled_s']:>10.3f} s {r['naive_s']:>7.2f} s {r['time_ratio']:>5.1f}x   "
              f"{r['downsampled_bytes'] / 1e6:>7.2f} MB {r['naive_bytes'] / 1e6:>7.1f} MB {r['bytes_ratio']:>5.1f}x")
    ok = all(r["downsampled_s"] < 1.0 and r["downsampled_bytes"] < 1e6 for r in rows.values())
    print("target (re-sample < 1 s, payload < 1 MB):", "met" if ok else "NOT met")
    if a.json:
        print(json.dumps({"steps": a.steps, "tokens": len(tl.tokens), "spikes": len(d.spikes), "diagnose_s": t_diag,
                          "page_data_s": t_view, "ranges": rows, "target_met": ok}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
