"""Tier (d2): the diagnosis on Nsight exports of the second trace generator (tests/helpers/trace_gen2),
scored per step and per episode against the generator's truth (benchmarks/step_scoring.py).

Seeds: ``tune`` (0-4) may be looked at while rules change; ``heldout`` (1000-1004) is run ONCE, by
the integrator, after the last rule change, and the commit is written into docs/analyze.md.

    .venv/bin/python benchmarks/tier_d2.py [--seeds tune|heldout|0,1] [--shapes graph-trace,...]
        [--steps 800] [--cache benchmarks/.cache] [--json]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers.trace_gen2 import SHAPES, GenConfig, draw_schedule, generate  # noqa: E402
from helpers.trace_gen2.schedule import ScheduleConfig  # noqa: E402
from step_scoring import place_spikes, score_episodes, score_steps, step_truth  # noqa: E402

SEED_SETS = {"tune": (0, 1, 2, 3, 4), "heldout": (1000, 1001, 1002, 1003, 1004)}
#: issue 24 acceptance: macro-F1 >= 0.85, EP and PD F1 >= 0.7, mixing false positives < 2 %
TARGETS = {"macro_f1": 0.85, "ep_hotspot": 0.7, "pd_transfer": 0.7, "mixing_fp_rate": 0.02}


def ensure_export(cache: Path, shape: str, seed: int, n_steps: int):
    """(export path, truth frame, utc offset s, schedule): generated once, then read from the cache."""
    d = cache / "gen2"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{shape}__seed{seed}__steps{n_steps}.sqlite"
    tpath = path.with_suffix(".truth.csv")
    cfg = GenConfig(shape, seed, n_steps)
    if not (path.exists() and tpath.exists()):
        g = generate(cfg, path.with_name(path.name + ".part"))
        g.path.rename(path)
        g.truth.assign(utc_offset_s=g.utc_offset_s).to_csv(tpath, index=False)
    truth = pd.read_csv(tpath, keep_default_na=False)
    key = seed * 16 + list(SHAPES).index(shape)   # generate()'s schedule key
    sched = draw_schedule(key, ScheduleConfig(n_steps=n_steps, causes=cfg.causes()), SHAPES[shape].n_ranks)
    return path, truth.drop(columns=["utc_offset_s"]), float(truth["utc_offset_s"].iloc[0]), sched


def run_case(cache: Path, shape: str, seed: int, n_steps: int):
    from mixdiag.collectors import load
    from mixdiag.diagnosis import diagnose
    path, truth, off, sched = ensure_export(cache, shape, seed, n_steps)
    tv = step_truth(truth, off)
    d = diagnose(load(str(path)))
    placed = place_spikes(d.spikes[d.spikes["granularity"] == "step"], tv)
    return placed, tv, d.regimes.episodes, sched


def evaluate(shapes, seeds, cache: Path, n_steps: int) -> dict:
    out = {}
    for shape in shapes:
        causes = GenConfig(shape, 0, n_steps).causes()
        placed_all, truth_all, ep_scores, failed = [], [], [], {}
        t0 = time.monotonic()
        for k, seed in enumerate(seeds):
            try:
                placed, tv, eps, sched = run_case(cache, shape, seed, n_steps)
            except Exception as e:  # one failing input is reported, the rest still scored
                failed[seed] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                continue
            ep_scores.append(score_episodes(eps, sched.episodes, tv, causes))
            # pool seeds: ranks of different traces must not collide
            placed_all.append(placed.assign(rank=placed["rank"] + 100 * k))
            truth_all.append(tv.assign(rank=tv["rank"] + 100 * k))
        if not placed_all:
            out[shape] = {"evaluated": False, "failed": failed}
            continue
        r = score_steps(pd.concat(placed_all, ignore_index=True), pd.concat(truth_all, ignore_index=True), causes)
        st = {c: [sum(e["stretches"][c]["found"] for e in ep_scores), sum(e["stretches"][c]["of"] for e in ep_scores)]
              for c in causes}
        named = sum(e["named_episodes"] for e in ep_scores)
        okp = sum((e["precision"] or 0) * e["named_episodes"] for e in ep_scores)
        r.update({"evaluated": True, "causes": list(causes), "failed": failed, "wall_s": round(time.monotonic() - t0, 1),
                  "episodes": {"by_cause": st, "recall": (sum(v[0] for v in st.values()) / sum(v[1] for v in st.values())
                                                          if sum(v[1] for v in st.values()) else None),
                               "named": named, "precision": okp / named if named else None}})
        out[shape] = r
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown(res: dict, causes=("mixing", "ep_hotspot", "pd_transfer", "graph_fallback", "host_stall")) -> str:
    head = ("| shape | " + " | ".join(f"{c} P/R/F1" for c in causes) +
            " | macro-F1 | mixing FP | spikes (unknown) | episodes found | episode precision |")
    lines = [head, "|" + "---|" * (len(causes) + 6)]
    for shape, r in res.items():
        if not r["evaluated"]:
            lines.append(f"| {shape} | not evaluated: {r['failed']} |")
            continue
        cells = []
        for c in causes:
            v = r["per_cause"].get(c)
            cells.append("n/a" if v is None else f"{_f(v['precision'])}/{_f(v['recall'])}/**{_f(v['f1'])}** "
                         f"({v['called']}, {v['truth_visible']})")
        ep = r["episodes"]
        found = ", ".join(f"{c} {a}/{b}" for c, (a, b) in ep["by_cause"].items() if b)
        lines.append(f"| {shape} | " + " | ".join(cells) + f" | **{_f(r['macro_f1'])}** | {r['mixing_fp_rate']:.1%} "
                     f"({r['mixing_fp']}/{r['non_mixing_spikes']}) | {r['spikes']} ({r['unknown']}) | "
                     f"{found or '-'} | {_f(ep['precision'])} ({ep['named']}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="tune")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--cache", default=str(ROOT / "benchmarks" / ".cache"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    seeds = SEED_SETS.get(a.seeds) or tuple(int(s) for s in a.seeds.split(",") if s)
    shapes = [s for s in a.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        ap.error(f"unknown shape(s) {bad}; choose from {', '.join(SHAPES)}")
    t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    res = evaluate(shapes, seeds, Path(a.cache), a.steps)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"tier (d2) seeds {list(seeds)} ({a.seeds}), {a.steps} steps per trace")
    print(markdown(res))
    print(f"wall {time.monotonic() - t0:.1f} s, CPU {cpu:.1f} s (user+sys)")
    if a.json:
        print(json.dumps({"seeds": list(seeds), "steps": a.steps, "shapes": res}, default=lambda o: None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
