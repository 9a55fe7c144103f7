"""Nsight Systems SQLite ingest of a foreign engine's trace at real size: rows/s, ratio to a bare scan, RSS.

The export is a simulated vLLM-like engine (tests/helpers/foreign_trace, node-level graph trace)
with ``--kernels`` kernel rows (default 2 M), written once per variant and cached under
benchmarks/.cache/ (gitignored): ``ranges`` carries the engine's own step ranges
(``execute_model``), ``sync`` none (steps from the engine thread's D2H copy + synchronize
pattern). Each probe runs in a fresh interpreter so its peak RSS is its own; repeats interleave
the probes so machine load hits them alike:

* ``scan``   - the collector's own kernel-table query read bare with the same reader (Arrow
  batches via ``nsys_kernels.fetch_columns``), nothing else: what any reader must at least pay;
* ``ranges`` - ``nsys.read`` of the ``ranges`` export (steps by range names, token inference,
  graph mode, KV transfer, comm share);
* ``sync``   - the same on the ``sync`` export.

Targets: >= 1 M kernel rows/s, ingest / scan <= 3, peak RSS <= 1.5 GB, for both ingests.

    .venv/bin/python benchmarks/bench_nsys.py [--kernels 2000000] [--repeats 3] [--json] [-q]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache"
TARGETS = {"kernel_rows_per_s": 1_000_000, "ratio_to_scan": 3.0, "peak_rss_bytes": 1.5e9}
VARIANTS = {"ranges": True, "sync": False}  # variant -> engine step ranges in the trace

PROBE = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.collectors.traces.nsys.activity import kernel_sql
from mixdiag.collectors.traces.nsys.db import NsysDb
from mixdiag.collectors.traces.nsys.kernels import fetch_columns
c0, t = cpu(), time.perf_counter()
if mode == "scan":
    db = NsysDb(path)
    sql, n_cols = kernel_sql(db)
    n = len(fetch_columns(db, sql, n_cols)[0])
    out = {"rows": n}
else:
    tl = nsys.read(path, progress=False)
    src = tl.meta["sources"][0]
    n = src["kernels_total"]
    out = {"rows": n, "steps": len(tl.steps), "step_source": src["step_source"],
           "kinds": tl.steps["kind"].value_counts().to_dict(),
           "kv_transfer_steps": int((tl.steps["kv_transfer_s"] > 0).sum())}
dt = time.perf_counter() - t
out.update(mode=mode, seconds=dt, cpu_s=cpu() - c0, peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print(json.dumps(out))
"""


def export(variant: str, kernels: int, quiet: bool) -> Path:
    """The cached export of ``variant`` with >= ``kernels`` kernel rows (simulated on first use)."""
    path = CACHE / f"vllm_{variant}_{kernels}.sqlite"
    if path.exists():
        return path
    sys.path.insert(0, str(ROOT))
    from tests.helpers.foreign_trace import simulate

    CACHE.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    truth = simulate("vllm", 1, 400, None, VARIANTS[variant], "node", "nsys", tmp, scale=kernels)
    tmp.rename(path)
    if not quiet:
        sys.stderr.write(f"simulated {path.name}: {truth.meta['kernel_rows']:,} kernel rows, "
                         f"{path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s\n")
    return path


def probe(mode: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(path)], capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"probe {mode} failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=2_000_000, help="kernel rows in the simulated export")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notes")
    args = ap.parse_args(argv)
    quiet = args.quiet or args.json
    paths = {v: export(v, args.kernels, quiet) for v in VARIANTS}
    plan = [(m, paths["ranges"] if m == "scan" else paths[m]) for m in ("scan", *VARIANTS)] * args.repeats
    runs: dict[str, list[dict]] = {"scan": [], **{v: [] for v in VARIANTS}}
    from tqdm import tqdm

    for mode, path in tqdm(plan, desc="probes", unit="probe", disable=quiet, file=sys.stderr, leave=False):
        runs[mode].append(probe(mode, path))
    res = {"kernel_rows": runs["ranges"][0]["rows"], "repeats": args.repeats, "targets": TARGETS,
           "load_avg_1m": os.getloadavg()[0], "cpus": os.cpu_count()}
    scan_s = statistics.median(r["seconds"] for r in runs["scan"])
    scan_cpu = statistics.median(r["cpu_s"] for r in runs["scan"])
    lines = [f"{'probe':<8} {'rows':>11} {'wall s':>7} {'CPU s':>6} {'M rows/s':>9} {'M rows/CPU-s':>13} "
             f"{'x scan':>7} {'x scan CPU':>10} {'peak RSS':>9}  steps"]
    meets = True
    for mode, rs in runs.items():
        wall = statistics.median(r["seconds"] for r in rs)
        cpu = statistics.median(r["cpu_s"] for r in rs)
        rows = rs[0]["rows"]
        rss = max(r["peak_rss_bytes"] for r in rs)
        d = {"rows": rows, "seconds": wall, "cpu_s": cpu, "kernel_rows_per_s": rows / wall,
             "kernel_rows_per_cpu_s": rows / cpu, "ratio_to_scan": wall / scan_s, "cpu_ratio_to_scan": cpu / scan_cpu,
             "peak_rss_bytes": rss, **{k: rs[0][k] for k in ("steps", "step_source", "kinds", "kv_transfer_steps")
                                       if k in rs[0]}}
        res[mode] = d
        if mode != "scan":
            meets &= (d["kernel_rows_per_s"] >= TARGETS["kernel_rows_per_s"] and d["ratio_to_scan"] <= TARGETS["ratio_to_scan"]
                      and rss <= TARGETS["peak_rss_bytes"])
        lines.append(f"{mode:<8} {rows:>11,} {wall:>7.2f} {cpu:>6.2f} {rows / wall / 1e6:>9.2f} {rows / cpu / 1e6:>13.2f} "
                     f"{wall / scan_s:>7.2f} {cpu / scan_cpu:>10.2f} {rss / 1e6:>7.0f}MB  "
                     f"{d.get('steps', '')} {d.get('step_source', '') or ''}")
    res["meets_targets"] = bool(meets)
    print("\n".join(lines))
    print(f"targets: >= 1 M kernel rows/s, <= 3x scan, peak RSS <= 1.5 GB -> {'met' if meets else 'NOT met'} "
          f"(medians of {args.repeats}; load average {res['load_avg_1m']:.1f} on {res['cpus']} CPUs)")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
