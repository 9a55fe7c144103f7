"""Does ``mixdiag tune`` predict what really happens? Tune from one run, then really run the others.

On the reference engine (CPU, the tiny model), the workload of ``benchmarks/tune_scenario.toml``
(wall-clock Poisson arrivals, so every setting sees the same traffic):

1. really run chunk size ``--base`` (512) and tune from that run directory over ``--chunks``;
2. really run each other chunk size (``run_scenario`` on the scenario with the budget changed);
3. compare predicted and real P99 ITL and P99 TTFT: median absolute relative error (target <= 10 %,
   Vidur's ~9 % the anchor), and check the setting recommended under ``--slo-ttft-p99`` (default:
   the median predicted P99 TTFT, so the choice is not trivial) really meets that SLO;
4. speed: a 10-setting sweep over ~10 minutes of traffic (the run's requests repeated) timed.

    .venv/bin/python benchmarks/bench_tune.py [--base 512] [--chunks 128,256,512,1024,2048,4096] [--json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

SCENARIO = Path(__file__).with_name("tune_scenario.toml")


def note(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def scenario_with_chunk(tmp: Path, chunk: int) -> Path:
    text = re.sub(r"max_num_batched_tokens = \d+", f"max_num_batched_tokens = {chunk}", SCENARIO.read_text())
    p = tmp / f"tune-{chunk}.toml"
    p.write_text(text)
    return p


def real_run(tmp: Path, chunk: int) -> dict:
    from mixdiag.engine.testbed.session import RunRequest, run_scenario

    t = time.perf_counter()
    res = run_scenario(RunRequest(scenario=str(scenario_with_chunk(tmp, chunk)), out=tmp / f"run-{chunk}"))
    s = res.summary
    note(f"  real chunk_size={chunk}: P99 ITL {s['itl_s']['p99'] * 1e3:.1f} ms, P99 TTFT {s['ttft_s']['p99']:.2f} s "
         f"({time.perf_counter() - t:.0f} s)")
    return {"itl_p99_s": s["itl_s"]["p99"], "ttft_p99_s": s["ttft_s"]["p99"], "out": str(res.out)}


def speed(run_dir: Path, minutes: float = 10.0, settings: int = 10) -> dict:
    """Seconds for a ``settings``-setting sweep over ``minutes`` of the run's traffic, repeated."""
    from mixdiag.schema import Timeline
    from mixdiag.tuning import cost_model, frontier, sweep, traffic

    tl = Timeline.load(run_dir)
    wl = traffic.from_timeline(tl)
    span = wl.span_s + 1.0
    reqs, k = [], 0
    while k * span < minutes * 60:
        reqs += [dataclasses.replace(r, request_id=f"{r.request_id}-{k}", arrival_s=r.arrival_s + k * span)
                 for r in wl.requests]
        k += 1
    rows = cost_model.step_rows(tl.steps)
    base, cache, mml = sweep.base_config(tl, rows, {}, [])
    cost = sweep.fit_cost(tl, wl, rows, base, cache, mml, [], "glm-5.3", "h200")
    chunks = [256 * (i + 1) for i in range(settings)]
    t = time.perf_counter()
    frontier.sweep(reqs, cost, base, cache, mml, [{"chunk_size": c} for c in chunks], jobs=2)
    sec = time.perf_counter() - t
    out = sum(r.output_tokens for r in reqs)
    note(f"speed: {settings} settings x {minutes:.0f} min ({len(reqs)} requests, {out} output tokens) in {sec:.1f} s")
    return {"settings": settings, "traffic_s": minutes * 60, "requests": len(reqs), "output_tokens": out,
            "seconds": sec, "target_s": 30.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=int, default=512)
    ap.add_argument("--chunks", default="128,256,512,1024,2048,4096")
    ap.add_argument("--slo-ttft-p99", type=float, default=None)
    ap.add_argument("--no-speed", action="store_true", help="skip the 10-minute sweep timing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from mixdiag.schema import Timeline
    from mixdiag.tuning import sweep

    chunks = [int(c) for c in args.chunks.split(",")]
    others = [c for c in chunks if c != args.base]
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as d:
        tmp = Path(d)
        note(f"real run of the base setting chunk_size={args.base}")
        base = real_run(tmp, args.base)
        tl = Timeline.load(base["out"])
        res = sweep.run(tl, [("chunk_size", chunks)])
        pred = {r["setting"]["chunk_size"]: r for r in res["settings"]}
        slo = args.slo_ttft_p99 or statistics.median(r["ttft_p99_s"] for r in res["settings"])
        rec = sweep.frontier.recommend(res["settings"], None, slo)[0]
        note(f"tuned in {res['seconds']:.1f} s; cost model R² {res['cost_model']['r2']:.3f}, held-out MAPE "
             f"{100 * res['cost_model']['mape_heldout']:.1f} %; SLO P99 TTFT <= {slo:.2f} s -> "
             f"{rec['label'] if rec else 'none'}")
        real = {c: real_run(tmp, c) for c in others}
        rows, e_itl, e_ttft = [], [], []
        for c in others:
            p, r = pred[c], real[c]
            ei = abs(p["itl_p99_s"] - r["itl_p99_s"]) / r["itl_p99_s"]
            et = abs(p["ttft_p99_s"] - r["ttft_p99_s"]) / r["ttft_p99_s"]
            e_itl.append(ei)
            e_ttft.append(et)
            rows.append({"chunk_size": c, "pred_itl_p99_s": p["itl_p99_s"], "real_itl_p99_s": r["itl_p99_s"],
                         "pred_ttft_p99_s": p["ttft_p99_s"], "real_ttft_p99_s": r["ttft_p99_s"],
                         "err_itl": ei, "err_ttft": et})
        rec_chunk = rec["setting"]["chunk_size"] if rec else None
        rec_real = real.get(rec_chunk) or (base if rec_chunk == args.base else None)
        met = rec_real is not None and rec_real["ttft_p99_s"] <= slo
        sp = None if args.no_speed else speed(Path(base["out"]))
    out = {"base_chunk": args.base, "settings": rows, "median_err_itl_p99": statistics.median(e_itl),
           "median_err_ttft_p99": statistics.median(e_ttft), "target": 0.10,
           "cost_model": res["cost_model"], "slo_ttft_p99_s": slo, "recommended": rec_chunk,
           "recommended_real_ttft_p99_s": rec_real["ttft_p99_s"] if rec_real else None, "slo_met": met,
           "current_pred_vs_measured": {"pred": {k: res["current"][k] for k in ("itl_p99_s", "ttft_p99_s")},
                                        "measured": res["measured_current"]},
           "speed": sp, "loadavg_1m_end": os.getloadavg()[0], "cpu_count": os.cpu_count()}
    for r in rows:
        note(f"chunk {r['chunk_size']:5d}: P99 ITL pred {r['pred_itl_p99_s'] * 1e3:7.1f} real {r['real_itl_p99_s'] * 1e3:7.1f} ms"
             f" ({100 * r['err_itl']:4.1f} %); P99 TTFT pred {r['pred_ttft_p99_s']:.2f} real {r['real_ttft_p99_s']:.2f} s"
             f" ({100 * r['err_ttft']:4.1f} %)")
    note(f"median abs rel error: P99 ITL {100 * out['median_err_itl_p99']:.1f} %, P99 TTFT "
         f"{100 * out['median_err_ttft_p99']:.1f} % (target <= 10 %); recommended chunk_size={rec_chunk} "
         f"really meets P99 TTFT <= {slo:.2f} s: {met}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
