"""Accuracy tier (g): `mixdiag analyze` on a real vLLM 0.32 (the testbed, docs/testbed-vllm.md),
scored by the strict rule of mixdiag/vllm_testbed/scoring.py against the engine's own records.

Views (what analyze reads from one run directory):
  g1 scrapes/ only; g2 scrapes/ + vllm.log (the operator log, no iteration lines);
  g3 client.jsonl; g4 client.jsonl + scrapes/ + vllm.log (one instance); g5 the live URL;
  g6 scrapes/ + vllm.log + host.csv and g7 g4 + host.csv (the EngineCore as the OS saw it: `mixdiag sample-host`,
  recorded by the testbed since wave 8; runs captured before have no host.csv and are reported so).
Runs are cached under benchmarks/.cache/tier_g/<name>/ (one `mixdiag testbed vllm` each, one at a
time); `--no-generate` scores what is cached; `--runs DIR,...` scores other capture directories.

    .venv/bin/python benchmarks/tier_g.py [--seed 2101] [--duration 40] [--no-generate] [--runs ...]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mixdiag.vllm_testbed import scoring  # noqa: E402

VIEWS = {"g1": ("scrapes",), "g2": ("scrapes", "vllm.log"), "g3": ("client.jsonl",),
         "g4": ("client.jsonl", "scrapes", "vllm.log"), "g6": ("scrapes", "vllm.log", "host.csv"),
         "g7": ("client.jsonl", "scrapes", "vllm.log", "host.csv")}
VIEW_NAMES = {"g1": "scrapes only", "g2": "scrapes + operator log", "g3": "client records",
              "g4": "client + scrapes + log", "g5": "live URL", "g6": "scrapes + log + host samples",
              "g7": "client + scrapes + log + host samples"}
#: the order views are scored and printed in
ORDER = ("g1", "g2", "g3", "g4", "g5", "g6", "g7")
#: the live view: `mixdiag analyze <url>/metrics --json` run beside the load by the testbed
#: (`--live-analyze`, mixdiag/vllm_testbed/live_view.py), scored from the JSON it printed
LIVE_JSON = Path("live") / "analyze.json"
TARGETS = {"g4_macro_f1": 0.90, "mixing_precision": 0.7, "mixing_recall": 0.8, "control_false_mixing": 0.10}
#: a cause "is named" by a run when it takes >= this share of the run's named spikes (stability check)
NAMED_SHARE = 0.10


#: the GC run's base load: at the default 2.5 requests/s the decode batch is often empty on a quiet machine
#: (tier g 4001: 3 of 4 pauses held no decode), and a pause that holds no decode is no ITL fault
GC_LOAD = ("--rate", "6", "--streams", "12")


def protocol(seed: int, duration: int) -> list[tuple[str, str, int, int, tuple[str, ...]]]:
    """(name, faults, seed, duration, extra testbed args) of the reported runs: a same-seed pair for
    stability, a control without long prompts, a small KV cache, GC pauses beside long prompts."""
    return [("long_stall_a", "long_prompts,host_stall", seed, duration, ()),
            ("long_stall_b", "long_prompts,host_stall", seed, duration, ()),
            ("control", "none", seed + 1, duration, ()),
            ("small_kv", "small_kv", seed + 2, duration, ()),
            # full collections in the engine with vLLM's GC debugger on: the host stall the engine times itself
            ("long_gc", "long_prompts,gc_pause", seed + 3, duration, GC_LOAD)]


def ensure_run(cache: Path, name: str, faults: str, seed: int, duration: int, generate: bool,
               extra: tuple[str, ...] = ()) -> tuple[Path, str | None]:
    """The cached run directory, generating it when missing (or why it is not there)."""
    run = cache / name
    if (run / "testbed.json").exists() and (run / "truth" / "iterations.log").exists():
        return run, None
    if not generate:
        return run, "not cached (--no-generate)"
    if run.exists() and any(run.iterdir()):
        return run, f"{run} holds an incomplete run; remove it to regenerate"
    cmd = [str(ROOT / ".venv" / "bin" / "mixdiag"), "testbed", "vllm", "--out", str(run), "--duration", str(duration),
           "--faults", faults, "--seed", str(seed), "--live-analyze", "-q", *extra]
    print(f"generating {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        # the driver made the directory before failing: drop it so a later call can regenerate
        if not (run / "testbed.json").exists():
            shutil.rmtree(run, ignore_errors=True)
        return run, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return run, None


def run_config(run: Path) -> dict:
    """seed/faults/duration as the testbed recorded them (identical configs = identical traffic)."""
    c = json.loads((run / "testbed.json").read_text())["config"]
    return {"seed": c["seed"], "faults": tuple(c["faults"]), "duration_s": c["duration_s"]}


def spikes_of(run: Path, view: str) -> list[tuple[float, float, str]]:
    """analyze's spikes for one view of one run, as (t_start_s, t_end_s, cause)."""
    from mixdiag.collectors import load
    from mixdiag.diagnosis import diagnose
    if view == "g5":
        doc = json.loads((run / LIVE_JSON).read_text())
        return [(float(x["t_start_s"]), float(x["t_end_s"]), str(x["cause"])) for x in doc["spikes"]]
    paths = [str(run / p) for p in VIEWS[view]]
    sp = diagnose(load(paths if len(paths) > 1 else paths[0])).spikes
    return [(float(a), float(b), str(c)) for a, b, c in zip(sp["t_start_s"], sp["t_end_s"], sp["cause"])]


def score(runs: dict[str, Path]) -> dict:
    """Per view: per-run judged counts, pooled precision/recall/F1 per cause, macro-F1; control
    false mixing; stability of same-config pairs."""
    res = {"views": {}, "runs": {n: {**run_config(r), "dir": str(r)} for n, r in runs.items()}}
    units = {n: scoring.truth_units(r) for n, r in runs.items()}
    small = {n: scoring.small_mixed_units(r / "truth" / "iterations.log") for n, r in runs.items()}
    res["truth"] = {n: {c: sum(u.cause == c for u in us) for c in scoring.SCORED_CAUSES} for n, us in units.items()}
    for view in ORDER:
        pooled, per_run = {}, {}
        for name, run in runs.items():
            if view == "g5" and not (run / LIVE_JSON).exists():
                per_run[name] = {"error": f"no {LIVE_JSON} (run without --live-analyze)"}
                continue
            missing = [p for p in VIEWS.get(view, ()) if not (run / p).exists()]
            if missing:
                per_run[name] = {"error": f"no {', '.join(missing)} (captured before the testbed recorded it)"}
                continue
            try:
                calls = scoring.judge(spikes_of(run, view), units[name])
            except Exception as e:  # one input failing: report it, keep scoring the rest
                per_run[name] = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"}
                continue
            t = scoring.tally(calls, units[name])
            by = {}
            for c in calls:
                by[c.cause] = by.get(c.cause, 0) + 1
            wrong_mix = [c for c in calls if c.cause == "mixing" and not c.right]
            per_run[name] = {"spikes": len(calls), "by_cause": by, "tally": t, "mixing_wrong": len(wrong_mix),
                             "host_stall_by_kind": stall_kinds(run, calls),
                             "mixing_wrong_on_small_mixed": sum(
                                 any(scoring.overlaps(c.t0_s, c.t1_s, u.t0_s, u.t1_s) for u in small[name])
                                 for c in wrong_mix)}
            pooled = scoring.merge(pooled, t)
        per_cause = {c: dict(zip(("precision", "recall", "f1"), scoring.prf(t)), **t) for c, t in pooled.items()}
        res["views"][view] = {"per_run": per_run, "per_cause": per_cause, "macro_f1": scoring.macro_f1(pooled),
                              "mixing_wrong_on_small_mixed": sum(r.get("mixing_wrong_on_small_mixed", 0)
                                                                 for r in per_run.values()),
                              "unknown": sum(r.get("by_cause", {}).get("unknown", 0) for r in per_run.values()),
                              "spikes": sum(r.get("spikes", 0) for r in per_run.values())}
    res["control"] = control(res)
    res["stability"] = stability(res)
    return res


def stall_kinds(run: Path, calls: list) -> dict[str, list[int]]:
    """Injected host stalls that held decodes (the truth units), per kind (``SIGSTOP``: nothing the engine
    exposes sees it; ``gc pause``: the engine times it when its GC debugger is on): [found by a right
    host_stall call, units]."""
    from mixdiag.vllm_testbed.truth import read_faults
    out: dict[str, list[int]] = {}
    right = [c for c in calls if c.cause == "host_stall" and c.right]
    held = {(u.t0_s, u.t1_s) for u in scoring.stall_units(run / "truth" / "faults.csv", run / "truth" / "iterations.log")}
    for f in read_faults(run / "truth" / "faults.csv"):
        if f.cause != "host_stall" or (f.t_start_s, f.t_end_s) not in held:
            continue
        kind = "gc pause" if f.detail.startswith("gc pause") else "SIGSTOP"
        k = out.setdefault(kind, [0, 0])
        k[0] += any(scoring.overlaps(c.t0_s, c.t1_s, f.t_start_s, f.t_end_s) for c in right)
        k[1] += 1
    return out


def control(res: dict) -> dict:
    """Per view: false mixing calls / spikes over the runs without faults."""
    out = {}
    ctl = [n for n, c in res["runs"].items() if c["faults"] == ()]
    for view, v in res["views"].items():
        if "per_run" not in v:
            continue
        rows = [v["per_run"][n] for n in ctl if "spikes" in v["per_run"].get(n, {})]
        spikes = sum(r["spikes"] for r in rows)
        wrong = sum(r["mixing_wrong"] for r in rows)
        out[view] = {"spikes": spikes, "false_mixing": wrong, "share": wrong / spikes if spikes else None}
    return out


def named(by_cause: dict, spikes: int) -> list[str]:
    """The causes a run names: those with >= NAMED_SHARE of its named (not ``unknown``) spikes, or
    ``unknown`` alone when it names none. The share is of the named spikes: how many client-cluster
    spikes stay ``unknown`` is the busy client's noise (3301's pair: 691 and 418 spikes with 57 and 43
    mixing calls read as 8.2 % against 10.3 % of all spikes), while the failure this checks is a verdict
    that flips (153 of 155 spikes mixing in one run, 96 of 96 ``unknown`` in the other: issue 21)."""
    calls = {c: k for c, k in by_cause.items() if c != "unknown" and k}
    n = sum(calls.values())
    return sorted(c for c, k in calls.items() if k / n >= NAMED_SHARE) if n else ["unknown"]


def stability(res: dict) -> dict:
    """Per view and pair of runs with one config: the causes each names (:func:`named`)."""
    groups = {}
    for n, c in res["runs"].items():
        groups.setdefault((c["seed"], c["faults"], c["duration_s"]), []).append(n)
    out = {}
    for view, v in res["views"].items():
        if "per_run" not in v:
            continue
        for names in groups.values():
            ok = [n for n in names if "spikes" in v["per_run"].get(n, {})]
            if len(ok) < 2:
                continue
            sets = {n: named(v["per_run"][n]["by_cause"], v["per_run"][n]["spikes"]) for n in ok}
            out.setdefault(view, []).append({"runs": ok, "named": sets, "same": len({tuple(s) for s in sets.values()}) == 1})
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def render(res: dict) -> str:
    """Plain-text report plus the docs' markdown table."""
    out = ["runs:"]
    for n, c in res["runs"].items():
        out.append(f"  {n:<14} seed {c['seed']:<5} faults {','.join(c['faults']) or 'none':<24} {c['duration_s']} s  "
                   f"truth units {res['truth'][n]}")
    head = "| view | cause | precision | recall | F1 | calls (right) | truth units (found) |"
    md = [head, "|---|---|---|---|---|---|---|"]
    for view, v in res["views"].items():
        out.append(f"\n({view}) {VIEW_NAMES[view]}:")
        if "skipped" in v:
            out.append(f"  {v['skipped']}")
            md.append(f"| ({view}) {VIEW_NAMES[view]} | {v['skipped']} | | | | | |")
            continue
        for n, r in v["per_run"].items():
            out.append(f"  {n:<14} " + (r["error"] if "error" in r else f"{r['spikes']:>4} spikes {r['by_cause']}"))
        for c, p in v["per_cause"].items():
            out.append(f"  {c:<14} P {_f(p['precision'])} R {_f(p['recall'])} F1 {_f(p['f1'])}  "
                       f"calls {p['called']} right {p['right']}  units {p['units']} found {p['found']}")
            md.append(f"| ({view}) {VIEW_NAMES[view]} | {c} | {_f(p['precision'])} | {_f(p['recall'])} | "
                      f"{_f(p['f1'])} | {p['called']} ({p['right']}) | {p['units']} ({p['found']}) |")
        kinds: dict[str, list[int]] = {}
        for r in v["per_run"].values():
            for k, (found, n) in r.get("host_stall_by_kind", {}).items():
                kinds.setdefault(k, [0, 0])
                kinds[k][0] += found
                kinds[k][1] += n
        if kinds:
            out.append("  host stalls found by kind: " + ", ".join(f"{k} {f}/{n}" for k, (f, n) in sorted(kinds.items())))
        out.append(f"  macro-F1 {_f(v['macro_f1'])}; spikes {v['spikes']} (unknown {v['unknown']}); wrong mixing "
                   f"calls on a mixed step below {scoring.MIXING_MIN_PROMPT_TOKENS} prompt tokens: "
                   f"{v['mixing_wrong_on_small_mixed']}")
        md.append(f"| ({view}) {VIEW_NAMES[view]} | **macro-F1** | | | **{_f(v['macro_f1'])}** | "
                  f"spikes {v['spikes']} (unknown {v['unknown']}) | |")
    out.append("\ncontrol (no faults): false mixing calls / spikes (target <= 10 %)")
    md += ["", "| view | control spikes | false mixing | share (target <= 10 %) |", "|---|---|---|---|"]
    for view, c in res["control"].items():
        out.append(f"  ({view}) {c['false_mixing']} / {c['spikes']} = {_f(c['share'])}")
        md.append(f"| ({view}) | {c['spikes']} | {c['false_mixing']} | {_f(c['share'])} |")
    out.append(f"\nstability (same config; causes named on >= {NAMED_SHARE:.0%} of a run's named spikes)")
    md += ["", "| view | runs | causes named | same |", "|---|---|---|---|"]
    for view, pairs in res["stability"].items():
        for p in pairs:
            s = "; ".join(f"{n}: {','.join(c) or '-'}" for n, c in p["named"].items())
            out.append(f"  ({view}) {s}  -> {'same' if p['same'] else 'DIFFERENT'}")
            md.append(f"| ({view}) | {', '.join(p['runs'])} | {s} | {'yes' if p['same'] else '**no**'} |")
    return "\n".join(out) + "\n\n" + "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=2101, help="seed of the same-seed pair; control +1, small_kv +2, long_gc +3")
    ap.add_argument("--duration", type=int, default=40, help="seconds of traffic per run (default 40)")
    ap.add_argument("--cache", default=str(ROOT / "benchmarks" / ".cache" / "tier_g"))
    ap.add_argument("--runs", help="score these capture directories instead of the protocol's (comma list)")
    ap.add_argument("--no-generate", action="store_true", help="score only what is cached")
    ap.add_argument("--json-out", help="also write the results as JSON here")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    runs, missing = {}, {}
    if a.runs:
        for d in (Path(x) for x in a.runs.split(",") if x):
            if not (d / "testbed.json").exists():
                ap.error(f"{d} is not a testbed run directory (no testbed.json)")
            if d.name in runs:
                ap.error(f"two runs named {d.name!r}: results are keyed by the directory's name")
            runs[d.name] = d
    else:
        cache = Path(a.cache)
        cache.mkdir(parents=True, exist_ok=True)
        for name, faults, seed, dur, extra in protocol(a.seed, a.duration):
            run, why = ensure_run(cache, name, faults, seed, dur, not a.no_generate, extra)
            (missing.__setitem__(name, why) if why else runs.__setitem__(name, run))
    for n, why in missing.items():
        print(f"{n}: NOT EVALUATED: {why}")
    if not runs:
        print("no run to score", file=sys.stderr)
        return 1
    res = score(runs)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    print(render(res))
    print(f"\nwall time {res['wall_s']} s")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
