"""Attribution accuracy, measured on inputs that look like a deployment's, against ground truth
the diagnosis never reads. Inputs are generated per seed and cached (benchmarks/attribution_sources.py).

Tiers (what the diagnosis reads; the causes its macro-F1 is taken over - those its sources can show):
  (a) the reference engine's own per-step records (steps/tokens of the vLLM-dialect runs): all 7;
  (b) its profiler trace only (``trace.json``; run set ``mixdiag``: --profile all --profile-light):
      all but kv_pressure (a trace cannot see the preempted requests' wait);
  (c) its own-dialect 1 s scrapes + vLLM log lines (run set ``mixdiag``): all 7;
  (d) foreign-engine Nsight exports from the foreign-trace simulator - vLLM-like at graph and node
      level with and without NVTX, SGLang-like, 2-rank EP - read via mixdiag.collectors.load; no
      reference-engine ranges (seed s of variant i is simulator seed 10 s + i): mixing, prefill_stall, ep_hotspot, pd_transfer, graph_fallback,
      host_stall (kv_pressure is not simulated);
  (e) the fault scenarios run with --metrics-dialect vllm --log-format vllm --scrape-interval 1; the
      diagnosis reads only scrapes/ and engine.log: mixing, prefill_stall, pd_transfer (NIXL
      series), kv_pressure (vllm:num_preemptions) - vLLM exposes no graph mode per step, no expert
      balance and no device idle time;
  (f) the same with --metrics-dialect sglang --log-format sglang: mixing, prefill_stall, ep_hotspot
      (eplb_balancedness), pd_transfer (kv_transfer_*), graph_fallback (``cuda graph:`` flag,
      cuda_graph_passes_total), kv_pressure (num_retracted_requests) - no device idle time;
  (d2) the second trace generator's Nsight exports (tests/helpers/trace_gen2: graph-trace,
      node-trace, SGLang-overlap, 2-rank, 4-rank, PD-NIXL, PD-copy), fault schedules drawn from the
      seed, scored strictly per step and per episode - benchmarks/tier_d2.py (``--tier d2`` runs it
      on the tuning seeds 0-4; its held-out set 1000-1004 is run once, by the integrator);
  (g) a real vLLM 0.32 (the testbed): views g1-g5, scored by a strict rule against the engine's own
      records - benchmarks/tier_g.py (``--tier g`` runs it; its own flags there).

Seeds: ``--seeds tune`` (0-4) is what rules and thresholds may be tuned on; ``--seeds heldout``
(100-104) is for the reported table only. Matching (mixdiag/diagnosis/evaluation.py): tiers a-d
match a spike to its own step only (tier d since issue 24: its fault set is drawn from the seed,
attribution_sources.sim_faults, and the collector's steps are mapped onto truth's by time); e-f
also to the step either side (a spike is right when its cause is the truth cause of its step or of
a neighbour); tier f's log rows (no step number, whole-second stamps) cover the steps ending in their second. Per tier: precision/recall/F1 per cause, macro-F1 vs target (a 0.95, b 0.90, c/e/f 0.80,
d 0.90), share of non-mixing spikes called mixing (target < 2 %), confusion (truth x called);
calibration over all tiers run: confidence bins [0,0.5) [0.5,0.8) [0.8,1] with count and accuracy
(target: the >= 0.8 bin right >= 90 %).

    .venv/bin/python benchmarks/bench_attribution.py [--tier a,d,e,f] [--seeds tune|heldout|0,1]
        [--confusion-out DIR] [--no-generate] [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution_sources import (FAULT_SCENARIOS, SIM_VARIANTS, TIER_RUN_SET, ensure_ref_run,  # noqa: E402
                                 ensure_sim_trace, load_sources, note, nsys_unix_offset_s, sim_faults,
                                 tier_inputs)

from mixdiag.diagnosis import diagnose  # noqa: E402
from mixdiag.diagnosis.evaluation import (MISSED, SCORED, calibration, foreign_truth, judge,  # noqa: E402
                                          map_to_truth_steps, score_judged, visible_truth)
from mixdiag.schema import Timeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEED_SETS = {"tune": (0, 1, 2, 3, 4), "heldout": (100, 101, 102, 103, 104)}
TARGETS = {"a": 0.95, "b": 0.90, "c": 0.80, "d": 0.90, "e": 0.80, "f": 0.80}
ALL7 = tuple(FAULT_SCENARIOS.values())
TIER_CAUSES = {
    "a": ALL7, "c": ALL7,
    "b": tuple(c for c in ALL7 if c != "kv_pressure"),
    "d": ("mixing", "prefill_stall", "ep_hotspot", "pd_transfer", "graph_fallback", "host_stall"),
    "e": ("mixing", "prefill_stall", "pd_transfer", "kv_pressure"),
    "f": ("mixing", "prefill_stall", "ep_hotspot", "pd_transfer", "graph_fallback", "kv_pressure"),
}
TOLERANCE = {"a": 0, "b": 0, "c": 0, "d": 0, "e": 1, "f": 1}
#: SGLang's log lines carry no step number and whole-second stamps: its step rows are matched to
#: the truth steps ending within their log second
STEP_WINDOW_S = {"f": 1.0}
TIER_NAMES = {"a": "per-step records", "b": "profiler trace only", "c": "own-dialect 1 s scrapes + log",
              "d": "foreign-engine Nsight exports", "e": "vLLM /metrics (1 s) + vLLM log",
              "f": "SGLang /metrics (1 s) + SGLang log"}
MIX_TARGET = 0.02


def align_instances(tl: Timeline, truth: pd.DataFrame) -> Timeline:
    """Name a tier's instances as views of truth's engines (``engine0@<source>``) when a collector
    named them after the input (``engine``, ``scrapes``, ``EngineCore_DP1``)."""
    want = sorted(set(truth["instance"]))
    mapping = {}
    for i in tl.instances:
        if i.split("@", 1)[0] in want:
            continue
        m = re.search(r"(?:dp|engine|rank)[_ ]?(\d+)", i, re.IGNORECASE) or re.search(r"(\d+)$", i)
        target = f"engine{m.group(1)}" if m and f"engine{m.group(1)}" in want else (want[0] if len(want) == 1 else None)
        if target is not None:
            mapping[i] = f"{target}@{i}"
    if not mapping:
        return tl
    from mixdiag.collectors import rename_instances
    return rename_instances(tl, mapping)


def within(tv: pd.DataFrame, tl: Timeline, by_step_range: bool) -> pd.DataFrame:
    """Truth rows inside what a tier saw: its step range per engine (a profiler window; only where
    the tier numbers steps as the engine does), else its time span."""
    st = tl.steps
    keep = pd.Series(False, index=tv.index)
    for inst, g in st.groupby(st["instance"].str.split("@").str[0]):
        m = tv["instance"] == inst
        rows = g[g["granularity"] == "step"]
        if len(rows) and by_step_range:
            keep |= m & tv["step"].between(int(rows["step"].min()), int(rows["step"].max()))
        else:
            keep |= m & tv["t_end_s"].between(float(g["t_start_s"].min()), float(g["t_end_s"].max()))
    return tv[keep]


def _prefix(df: pd.DataFrame, key: str) -> pd.DataFrame:
    return df.assign(instance=key + "/" + df["instance"].astype(str))


def ref_case(tier: str, run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spikes, visible truth) of one reference run at a tier (a: records; b, c, e, f: the files
    tier_inputs names, nothing else)."""
    truth = pd.read_csv(run / "truth.csv")
    ref = Timeline.load(run)
    tv = visible_truth(ref.steps, truth, tokens=ref.tokens)
    if tier == "a":
        return diagnose(ref).spikes, tv
    paths, why = tier_inputs(tier, run)
    if paths is None:
        raise FileNotFoundError(why)
    tl = align_instances(load_sources(paths), truth)
    return diagnose(tl).spikes, within(tv, tl, by_step_range=tier not in STEP_WINDOW_S)


def sim_case(path: Path, sim_truth: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spikes renumbered in truth's steps, foreign truth) of one simulated export."""
    tv = foreign_truth(sim_truth, nsys_unix_offset_s(path))
    sp = diagnose(load_sources([str(path)])).spikes
    return map_to_truth_steps(sp, tv), tv


def cases(tier: str, seeds, cache: Path, n_steps: int, scenarios, variants, generate: bool, timeout_s: float):
    """Yield (key, expected cause or None, thunk -> (spikes, truth)) or (key, None, reason str)."""
    if tier == "d":
        for v in variants:
            for s in seeds:
                # each export shape gets its own workload (seed 3 -> simulator seeds 30..35), so
                # the four vLLM shapes are four deployments, and tune/heldout stay disjoint
                sim_seed = 10 * s + list(SIM_VARIANTS).index(v)
                faults = sim_faults(v, sim_seed)   # drawn from the seed, not fixed per variant
                key = f"{v}/seed{sim_seed}/{'+'.join(faults)}"
                path, st = ensure_sim_trace(cache, v, sim_seed, n_steps, faults)
                yield key, None, (lambda p=path, t=st: sim_case(p, t))
        return
    for scn in scenarios:
        for s in seeds:
            key = f"{scn}/seed{s}"
            run, why = ensure_ref_run(cache, scn, s, TIER_RUN_SET[tier], n_steps, timeout_s, generate)
            yield key, FAULT_SCENARIOS.get(scn), (why if why else (lambda r=run: ref_case(tier, r)))


def pregenerate(tiers, seeds, cache: Path, n_steps: int, scenarios, timeout_s: float, jobs: int) -> None:
    """Generate the missing reference runs of ``tiers``, ``jobs`` at a time (each run is one busy
    process; failures are reported again, per case, when the tier is scored)."""
    from concurrent.futures import ThreadPoolExecutor
    todo = sorted({(scn, s, TIER_RUN_SET[t]) for t in tiers if t in TIER_RUN_SET for scn in scenarios for s in seeds})
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        list(ex.map(lambda a: ensure_ref_run(cache, a[0], a[1], a[2], n_steps, timeout_s), todo))


def evaluate_tier(tier: str, seeds, cache: Path, n_steps: int, scenarios, variants, generate: bool,
                  timeout_s: float) -> tuple[dict, pd.DataFrame]:
    judged, truths, per_case, not_eval = [], [], {}, {}
    t0 = time.monotonic()
    for key, expected, job in cases(tier, seeds, cache, n_steps, scenarios, variants, generate, timeout_s):
        if isinstance(job, str):
            not_eval[key] = job
            continue
        t1 = time.monotonic()
        try:
            sp, tv = job()
        except Exception as e:  # a collector or rule failing on one input: report it, keep going
            not_eval[key] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            continue
        sp, tv = _prefix(sp, key), _prefix(tv, key)
        j = judge(sp, tv, by_step=True, tolerance=TOLERANCE[tier], step_window_s=STEP_WINDOW_S.get(tier))
        judged.append(j)
        truths.append(tv)
        by = j["cause"].value_counts().to_dict()
        per_case[key] = {"spikes": len(j), "by_cause": by, "right": int(j["right"].sum()), "expected": expected,
                         "expected_named": (expected in by) if expected else None,
                         "seconds": round(time.monotonic() - t1, 2)}
    if not judged:
        return {"evaluated": False, "reason": "; ".join(f"{k}: {v}" for k, v in not_eval.items()) or "no input",
                "not_evaluated": not_eval}, pd.DataFrame()
    jall = pd.concat(judged, ignore_index=True)
    r = score_judged(jall, pd.concat(truths, ignore_index=True), TIER_CAUSES[tier])
    r.update({"evaluated": True, "causes": list(TIER_CAUSES[tier]), "tolerance_steps": TOLERANCE[tier],
              "target_macro_f1": TARGETS[tier], "calibration": calibration(jall), "cases": per_case,
              "not_evaluated": not_eval, "wall_s": round(time.monotonic() - t0, 1),
              "meets_target": r["macro_f1"] is not None and r["macro_f1"] >= TARGETS[tier],
              "meets_mixing_target": r["mixing_false_alarm_rate"] < MIX_TARGET})
    return r, jall


def _f(v) -> str:
    return "   -" if v is None else f"{v:.2f}"


def render_confusion(conf: dict) -> list[str]:
    cols = [c for c in (*SCORED, "unknown", MISSED) if any(c in row for row in conf.values())]
    rows = [c for c in (*SCORED, "none") if c in conf]
    head = "truth \\ called"
    out = [f"  {head:<16}" + "".join(f"{c[:10]:>11}" for c in cols)]
    for t in rows:
        out.append(f"  {t:<16}" + "".join(f"{conf[t].get(c, 0):>11}" for c in cols))
    return out


def render_calibration(cal: list[dict]) -> list[str]:
    return [f"  {b['bin']:<10} count {b['count']:>6}  accuracy {_f(b['accuracy'])}" for b in cal]


def render(res: dict) -> str:
    out = [f"seeds {res['seeds']} ({res['seed_set']}), {res['n_steps']} steps"]
    for tier, r in res["tiers"].items():
        out.append(f"\ntier ({tier}) {TIER_NAMES[tier]}:")
        if not r["evaluated"]:
            out.append(f"  NOT EVALUATED: {r['reason']}")
            continue
        out.append(f"  {'cause':<16} {'prec':>5} {'rec':>5} {'F1':>5} {'pred':>6} {'truth':>6}")
        for c in SCORED:
            v = r["per_cause"][c]
            if v["predicted"] or v["truth_visible"]:
                mark = "" if c in r["causes"] else "  (not in this tier's macro-F1)"
                out.append(f"  {c:<16} {_f(v['precision']):>5} {_f(v['recall']):>5} {_f(v['f1']):>5} "
                           f"{v['predicted']:>6} {v['truth_visible']:>6}{mark}")
        ok = "meets" if r["meets_target"] else "BELOW"
        out.append(f"  macro-F1 {_f(r['macro_f1'])} over {', '.join(r['macro_f1_causes'])} "
                   f"(target {r['target_macro_f1']:.2f}: {ok}); non-mixing spikes called mixing "
                   f"{r['mixing_false_alarm_rate']:.1%} of {r['non_mixing_spikes']} (target < 2%)")
        out.append(f"  spikes {r['spikes']} (unknown {r['unknown_predicted']}, on cause-free steps "
                   f"{r['spikes_without_truth']}); visible truth steps detected {r['visible_truth_detected']}/"
                   f"{r['visible_truth_steps']}; {len(r['cases'])} inputs in {r['wall_s']} s")
        out += render_confusion(r["confusion"]) + render_calibration(r["calibration"])
        for key, why in r["not_evaluated"].items():
            out.append(f"    {key:<28} not evaluated: {why}")
    out.append("\ncalibration over all tiers run (non-unknown spikes):")
    out += render_calibration(res["calibration"])
    out.append(f"\nwall time {res['wall_s']} s")
    return "\n".join(out)


def markdown(res: dict) -> str:
    """The docs' tables: F1 per cause and tier (causes outside a tier's macro-F1 in parentheses),
    macro-F1 vs target, mixing false alarms; calibration over all tiers."""
    head = "| tier | " + " | ".join(SCORED) + " | macro-F1 (target) | non-mixing called mixing | spikes (unknown) |"
    out = [head, "|" + "---|" * (len(SCORED) + 4)]
    for tier, r in res["tiers"].items():
        if not r["evaluated"]:
            out.append(f"| ({tier}) | not evaluated: {r['reason']} |")
            continue
        cells = []
        for c in SCORED:
            f1 = r["per_cause"][c]["f1"]
            cells.append("-" if f1 is None else (f"{f1:.2f}" if c in r["causes"] else f"({f1:.2f})"))
        out.append(f"| ({tier}) {TIER_NAMES[tier]} | " + " | ".join(cells) +
                   f" | **{_f(r['macro_f1'])}** ({r['target_macro_f1']:.2f}) | {r['mixing_false_alarm_rate']:.1%}"
                   f" | {r['spikes']} ({r['unknown_predicted']}) |")
    out += ["", "| confidence | spikes | right |", "|---|---|---|"]
    out += [f"| {b['bin']} | {b['count']} | {_f(b['accuracy'])} |" for b in res["calibration"]]
    return "\n".join(out)


def parse_seeds(spec: str) -> tuple[str, tuple[int, ...]]:
    if spec in SEED_SETS:
        return spec, SEED_SETS[spec]
    try:
        return "explicit", tuple(int(s) for s in spec.split(",") if s)
    except ValueError:
        raise SystemExit(f"--seeds: 'tune', 'heldout' or a comma list of integers, not {spec!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", "--tiers", dest="tiers", default="a,d,e,f",
                    help="tiers to evaluate, comma-separated (default a,d,e,f; b,c need the profiled run set)")
    ap.add_argument("--seeds", default="tune", help="tune (0-4), heldout (100-104) or a comma list")
    ap.add_argument("--cache", default=str(ROOT / "benchmarks" / ".cache"), help="cache of generated inputs")
    ap.add_argument("--steps", type=int, default=300, help="steps per run/trace (default 300)")
    ap.add_argument("--scenarios", help=f"comma list (default: {','.join(FAULT_SCENARIOS)})")
    ap.add_argument("--variants", help=f"tier d exports, comma list (default: {','.join(SIM_VARIANTS)})")
    ap.add_argument("--no-generate", action="store_true", help="score only what is cached")
    ap.add_argument("--jobs", type=int, default=2, help="engine runs generated at once (default 2)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per engine run (default 600)")
    ap.add_argument("--confusion-out", help="directory to write confusion_<tier>_<seeds>.txt and results JSON to")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("--markdown", action="store_true", help="also print the docs' markdown tables")
    a = ap.parse_args(argv)
    tiers = [t for t in a.tiers.split(",") if t]
    if "d2" in tiers:
        # tier (d2) has its own generator, seed sets and strict per-step/episode scoring
        import tier_d2
        seeds_d2 = a.seeds if a.seeds in tier_d2.SEED_SETS or a.seeds[:1].isdigit() else "tune"
        tier_d2.main(["--seeds", seeds_d2, "--cache", a.cache] + (["--json"] if a.json else []))
        tiers = [t for t in tiers if t != "d2"]
        if not tiers:
            return 0
    if "g" in tiers:
        # tier (g) has its own runs (a real server, one at a time) and scoring rule: its own module
        import tier_g
        rc = tier_g.main(["--no-generate"] if a.no_generate else [])
        tiers = [t for t in tiers if t != "g"]
        if not tiers:
            return rc
    bad = [t for t in tiers if t not in TARGETS]
    if bad:
        ap.error(f"unknown tier(s) {bad}; choose from {', '.join(TARGETS)}")
    seed_set, seeds = parse_seeds(a.seeds)
    scenarios = [s for s in (a.scenarios or ",".join(FAULT_SCENARIOS)).split(",") if s]
    variants = [v for v in (a.variants or ",".join(SIM_VARIANTS)).split(",") if v]
    unknown = [v for v in variants if v not in SIM_VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {', '.join(SIM_VARIANTS)}")
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    res = {"seed_set": seed_set, "seeds": list(seeds), "n_steps": a.steps, "tiers": {}}
    judged = []
    if not a.no_generate:
        pregenerate(tiers, seeds, cache, a.steps, scenarios, a.timeout, a.jobs)
    for tier in tiers:
        note(f"tier ({tier}) ...")
        r, j = evaluate_tier(tier, seeds, cache, a.steps, scenarios, variants, not a.no_generate, a.timeout)
        res["tiers"][tier] = r
        if len(j):
            judged.append(j)
    res["calibration"] = calibration(pd.concat(judged, ignore_index=True)) if judged else []
    res["wall_s"] = round(time.monotonic() - t0, 1)
    text = render(res) + ("\n\n" + markdown(res) if a.markdown else "")
    print(text)
    if a.confusion_out:
        d = Path(a.confusion_out)
        d.mkdir(parents=True, exist_ok=True)
        for tier, r in res["tiers"].items():
            if r["evaluated"]:
                (d / f"confusion_{tier}_{seed_set}.txt").write_text(
                    f"tier ({tier}) {TIER_NAMES[tier]}, seeds {list(seeds)}: truth cause (rows) x called cause\n"
                    + "\n".join(render_confusion(r["confusion"])) + "\n\nper input: spikes, right, called causes\n"
                    + "".join(f"  {k:<32} {c['spikes']:>5} {c['right']:>5}  {c['by_cause']}\n"
                              for k, c in r["cases"].items()))
        (d / f"results_{seed_set}.txt").write_text(text + "\n")
        (d / f"results_{seed_set}.json").write_text(json.dumps(res, default=lambda o: None, indent=1))
    if a.json:
        print(json.dumps(res, default=lambda o: None, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
