"""Inputs of the attribution benchmark's tiers, generated once per seed and cached.

Two kinds of input, each with its ground truth:
* **reference-engine runs** (tiers a-c, e, f): ``mixdiag run --scenario S --seed N --max-steps 300``
  with the run set's flags, in ``<cache>/ref/<S>__seed<N>__<runset>__steps<n>/`` (complete when
  ``bench_run_args.txt`` is there). Truth: ``truth.csv`` + the run's per-step records (for
  visibility only; tiers e/f's diagnosis never reads them).
* **foreign-engine traces** (tier d): the foreign-trace simulator's Nsight SQLite exports
  (tests/helpers/foreign_trace) in ``<cache>/sim/<variant>__seed<N>__steps<n>__<faults>.sqlite`` (the
  fault set drawn from the seed, :func:`sim_faults`) plus
  ``.truth.csv``. No reference-engine ranges: the simulator writes what vLLM/SGLang/an EP engine
  emit (their NVTX names when a variant has NVTX, else none).
"""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

#: the reference engine's fault scenarios (one injected cause each) and the cause each injects
FAULT_SCENARIOS = {"mixed-default": "mixing", "prefill-first": "prefill_stall", "ep-hotspot": "ep_hotspot",
                   "pd-transfer": "pd_transfer", "graph-miss": "graph_fallback", "kv-pressure": "kv_pressure",
                   "host-stall": "host_stall"}
#: run set -> flags of `mixdiag run` (besides scenario, seed, steps)
RUN_SETS = {
    "vllm": "--metrics-dialect vllm --log-format vllm --scrape-interval 1",
    "sglang": "--metrics-dialect sglang --log-format sglang --scrape-interval 1",
    "mixdiag": "--metrics-dialect mixdiag --log-format vllm --scrape-interval 1 --profile all --profile-light",
}
#: tier -> the run set it reads (tier a scores the vLLM-dialect runs' own per-step records)
TIER_RUN_SET = {"a": "vllm", "b": "mixdiag", "c": "mixdiag", "e": "vllm", "f": "sglang"}


@dataclass(frozen=True)
class SimVariant:
    """One foreign-engine export shape (the simulator's parameters)."""
    engine: str
    graph_trace: str
    nvtx: bool
    gpu_metrics_hz: int


#: tier d's exports: vLLM-like at graph and node level, with and without NVTX (GPU metrics on
#: half), SGLang-like without NVTX, 2-rank EP with NVTX - each with the engine's default faults
SIM_VARIANTS = {
    "vllm-graph-nvtx": SimVariant("vllm", "graph", True, 1000),
    "vllm-graph-bare": SimVariant("vllm", "graph", False, 0),
    "vllm-node-nvtx": SimVariant("vllm", "node", True, 0),
    "vllm-node-bare": SimVariant("vllm", "node", False, 1000),
    "sglang-graph-bare": SimVariant("sglang", "graph", False, 1000),
    "ep2-graph-nvtx": SimVariant("ep2", "graph", True, 1000),
}


def note(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def ref_run_dir(cache: Path, scenario: str, seed: int, run_set: str, n_steps: int) -> Path:
    return cache / "ref" / f"{scenario}__seed{seed}__{run_set}__steps{n_steps}"


def ensure_ref_run(cache: Path, scenario: str, seed: int, run_set: str, n_steps: int, timeout_s: float,
                   generate: bool = True) -> tuple[Path, str | None]:
    """The cached run (generated unless there or ``generate`` is False); ``(dir, failure reason)``."""
    out = ref_run_dir(cache, scenario, seed, run_set, n_steps)
    if (out / "bench_run_args.txt").exists():
        return out, None
    if not generate:
        return out, "not in the cache (--no-generate)"
    if out.exists():  # an interrupted run: keep it aside, never delete
        out.rename(out.with_name(f"{out.name}.incomplete-{int(time.time())}"))
    args = f"--max-steps {n_steps} --seed {seed} {RUN_SETS[run_set]}"
    cmd = [sys.executable, "-m", "mixdiag", "run", "--scenario", scenario, "--out", str(out), "-q", *args.split()]
    note(f"running mixdiag run --scenario {scenario} {args}")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return out, f"mixdiag run timed out after {timeout_s:.0f} s"
    if p.returncode != 0:
        return out, f"mixdiag run failed (rc {p.returncode}): {(p.stderr.strip().splitlines() or ['?'])[-1]}"
    if not (out / "truth.csv").exists():
        return out, "mixdiag run wrote no truth.csv"
    (out / "bench_run_args.txt").write_text(args + "\n")
    return out, None


#: the faults each simulated engine can inject (its defaults in tests/helpers/foreign_trace/planner.py)
SIM_FAULTS = {"vllm": ("mixing", "graph_fallback", "host_stall", "pd_transfer"),
              "sglang": ("prefill_stall", "graph_fallback", "host_stall", "pd_transfer"),
              "ep2": ("ep_hotspot", "mixing", "host_stall")}


def sim_faults(variant: str, seed: int) -> tuple[str, ...]:
    """Tier (d)'s fault set for one trace, drawn from the seed (issue 24: no fixed scenario): each of
    the engine's faults with probability 0.7, at least two. The simulator itself then draws where,
    how often (3-8 % of steps) and how hard each fires from the same seed."""
    import numpy as np
    pool = SIM_FAULTS[SIM_VARIANTS[variant].engine]
    rng = np.random.default_rng([seed, 0xD1])
    pick = [f for f in pool if rng.random() < 0.7]
    while len(pick) < 2:
        pick = sorted(set(pick) | {str(rng.choice(pool))}, key=pool.index)
    return tuple(pick)


def ensure_sim_trace(cache: Path, variant: str, seed: int, n_steps: int,
                     faults: tuple[str, ...] | None = None) -> tuple[Path, pd.DataFrame]:
    """The cached export of ``variant`` for ``seed`` (with ``faults``, default: drawn from the seed)
    and its per-(step, rank) truth."""
    d = cache / "sim"
    d.mkdir(parents=True, exist_ok=True)
    faults = sim_faults(variant, seed) if faults is None else tuple(faults)
    path = d / f"{variant}__seed{seed}__steps{n_steps}__{'+'.join(faults)}.sqlite"
    tpath = path.with_suffix(".truth.csv")
    if not (path.exists() and tpath.exists()):
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers.foreign_trace import simulate
        v = SIM_VARIANTS[variant]
        tmp = path.with_name(path.name + ".part")
        tmp.unlink(missing_ok=True)
        truth = simulate(v.engine, seed, n_steps, faults, v.nvtx, v.graph_trace, "nsys", tmp,
                         gpu_metrics_hz=v.gpu_metrics_hz)
        truth.steps.to_csv(tpath, index=False)
        tmp.rename(path)
    return path, pd.read_csv(tpath)


def nsys_unix_offset_s(path: Path) -> float:
    """Seconds to add to ``t_ns / 1e9`` of an export to get unix time (the session start as UTC
    epoch and on the target clock, formats.md section 3.2); 0 when the export lacks it."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
    except sqlite3.Error:
        row = None
    finally:
        con.close()
    return (row[0] - row[1]) / 1e9 if row and row[0] is not None and row[1] is not None else 0.0


def load_sources(paths: list[str]):
    """What a user's ``mixdiag analyze PATH...`` would read (the collectors' registry)."""
    from mixdiag.collectors import load
    return load(paths if len(paths) > 1 else paths[0])


def tier_inputs(tier: str, run: Path) -> tuple[list[str] | None, str | None]:
    """The files tier b/c/e/f's diagnosis reads from a reference run, or why it cannot."""
    if tier == "b":
        trace = run / "trace.json"
        return ([str(trace)], None) if trace.exists() else (None, "no trace.json (mixdiag run --profile)")
    if not (run / "scrapes").is_dir():
        return None, "no scrapes/ (mixdiag run --scrape-interval 1)"
    return [str(p) for p in (run / "scrapes", run / "engine.log") if p.exists()], None
