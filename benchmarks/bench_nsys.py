"""Nsight Systems SQLite ingest at scale: kernel rows/s, peak RSS, and cost relative to a bare scan.

Builds a large export by replicating a real fixture's kernel and runtime rows (times shifted by
the fixture's span per copy, correlation ids kept unique per copy) into a temp file, then times,
interleaved and each in a fresh process (so peak RSS is that run's own):

* ``ingest``      - the full ``mixdiag.collectors.load(path)`` (steps, graph mode, validation);
* ``ingest-sqlite3`` - the same without the Arrow reader (stdlib ``sqlite3`` rows), for reference;
* ``scan``        - a bare ``SELECT`` of the same columns of the same table, iterated with
  ``sqlite3`` cursor chunks and discarded (what any Python reader must at least pay).

Targets: >= 1 M kernel rows/s for ``ingest``, ``ingest / scan`` <= 3, peak RSS <= 1.5 GB.
``--json`` ends with one JSON line.

    .venv/bin/python benchmarks/bench_nsys.py [--kernels 2000000] [--repeats 3] [--with-steps 20] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "nsys" / "h100_2gpu_1s.sqlite"
TARGETS = {"kernel_rows_per_s": 1_000_000, "ratio_to_scan": 3.0, "peak_rss_bytes": 1.5e9}

# Each probe runs in its own interpreter and prints one JSON line: seconds and peak RSS.
PROBE = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
if mode == "scan":
    import sqlite3
    c0, t = cpu(), time.perf_counter()
    cur = sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(
        'SELECT globalPid, start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL')
    n = 0
    while rows := cur.fetchmany(131072):
        n += len(rows)
    dt = time.perf_counter() - t
else:
    from mixdiag.collectors import load
    from mixdiag.collectors.traces.nsys_db import NsysDb
    if mode == "ingest-sqlite3":
        NsysDb.arrow_connection = lambda self: None
    c0, t = cpu(), time.perf_counter()
    tl = load(path)
    dt = time.perf_counter() - t
    n = int(tl.steps["gpu_kernels"].sum())
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"mode": mode, "seconds": dt, "cpu_s": cpu() - c0, "rows": n, "peak_rss_bytes": rss}))
"""


def note(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def build_export(src: Path, dst: Path, kernels: int) -> int:
    """Copy ``src`` to ``dst`` and replicate its kernel/runtime rows until >= ``kernels`` kernels."""
    shutil.copy(src, dst)
    dst.chmod(0o644)
    c = sqlite3.connect(dst)
    (n,) = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    copies = -(-kernels // n)
    (span,) = c.execute("""SELECT max(e) - min(s) + 1000000 FROM (
        SELECT min(start) s, max("end") e FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL
        SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_RUNTIME)""").fetchone()
    (corr,) = c.execute("""SELECT max(m) + 1 FROM (SELECT max(correlationId) m FROM CUPTI_ACTIVITY_KIND_KERNEL
        UNION ALL SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME)""").fetchone()
    c.execute("CREATE TEMP TABLE copies (k INTEGER)")
    c.executemany("INSERT INTO copies VALUES (?)", [(k,) for k in range(1, copies)])
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        cols = [r[1] for r in c.execute(f"PRAGMA table_info({table})")]
        shifted = {"start": f"start + k * {span}", "end": f'"end" + k * {span}',
                   "correlationId": f"correlationId + k * {corr}"}
        sel = ", ".join(shifted.get(col, f'"{col}"') for col in cols)
        c.execute(f"INSERT INTO {table} SELECT {sel} FROM {table}, copies")
    c.commit()
    (total,) = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    c.close()
    return total


def add_step_ranges(path: Path, step_ms: float) -> int:
    """Add mixdiag ``step`` NVTX ranges tiling every launching thread's time (the projection path)."""
    c = sqlite3.connect(path)
    spans = c.execute('SELECT globalTid, min(start), max("end") FROM CUPTI_ACTIVITY_KIND_RUNTIME '
                      "WHERE globalTid IS NOT NULL GROUP BY globalTid").fetchall()
    width = int(step_ms * 1e6)
    rows = []
    for tid, lo, hi in spans:
        for i, t in enumerate(range(lo, hi + 1, width)):
            rows.append((t, t + width - 1, 59, f"step {i} kind=decode prefill_tokens=0 decode_reqs=8 decode_rows=8 "
                         "graph=NONE", tid, 0, 8))
    c.executemany('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, domainId, int64Value) '
                  "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    c.commit()
    c.close()
    return len(rows)


def probe(mode: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(path)], capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"probe {mode} failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=2_000_000, help="kernel rows in the built export (>= 2 M)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--with-steps", type=float, metavar="MS", default=None,
                    help="also time an export with mixdiag step ranges every MS ms (NVTX projection path)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "large.sqlite"
        t = time.perf_counter()
        total = build_export(FIXTURE, path, args.kernels)
        note(f"built {path.name}: {total:,} kernel rows, {path.stat().st_size / 1e6:.0f} MB "
             f"in {time.perf_counter() - t:.1f} s")
        runs: dict[str, list[dict]] = {"scan": [], "ingest": [], "ingest-sqlite3": []}
        for r in range(args.repeats):
            for mode in runs:  # interleaved, so machine load hits every mode alike
                runs[mode].append(probe(mode, path))
            note(f"repeat {r + 1}: " + ", ".join(f"{m} {runs[m][-1]['seconds']:.2f} s" for m in runs))
        nvtx = None
        if args.with_steps:
            n_ranges = add_step_ranges(path, args.with_steps)
            nvtx = probe("ingest", path)
            nvtx["step_ranges"] = n_ranges
            note(f"with {n_ranges:,} step ranges: ingest {nvtx['seconds']:.2f} s, CPU {nvtx['cpu_s']:.2f} s")
    med = {m: statistics.median(x["seconds"] for x in v) for m, v in runs.items()}
    cpu = {m: statistics.median(x["cpu_s"] for x in v) for m, v in runs.items()}
    rss = {m: max(x["peak_rss_bytes"] for x in v) for m, v in runs.items()}
    rows = runs["ingest"][0]["rows"]
    result = {
        "kernel_rows": total, "rows_in_steps": rows, "repeats": args.repeats,
        "scan_s": med["scan"], "ingest_s": med["ingest"], "ingest_sqlite3_s": med["ingest-sqlite3"],
        "kernel_rows_per_s": total / med["ingest"], "kernel_rows_per_s_sqlite3": total / med["ingest-sqlite3"],
        "ratio_to_scan": med["ingest"] / med["scan"], "ratio_to_scan_sqlite3": med["ingest-sqlite3"] / med["scan"],
        "peak_rss_bytes": rss["ingest"], "peak_rss_bytes_sqlite3": rss["ingest-sqlite3"],
        "peak_rss_bytes_scan": rss["scan"], "targets": TARGETS,
        # CPU seconds of each probe: what the work costs, less blurred by other processes on the machine.
        "scan_cpu_s": cpu["scan"], "ingest_cpu_s": cpu["ingest"], "ingest_sqlite3_cpu_s": cpu["ingest-sqlite3"],
        "kernel_rows_per_cpu_s": total / cpu["ingest"], "cpu_ratio_to_scan": cpu["ingest"] / cpu["scan"],
        "load_avg_1m": os.getloadavg()[0], "cpus": os.cpu_count(),
    }
    if nvtx is not None:
        result["with_steps"] = {"step_ranges": nvtx["step_ranges"], "ingest_s": nvtx["seconds"],
                                "ingest_cpu_s": nvtx["cpu_s"], "kernels_in_steps": nvtx["rows"],
                                "kernel_rows_per_s": total / nvtx["seconds"], "peak_rss_bytes": nvtx["peak_rss_bytes"]}
    result["meets_targets"] = (result["kernel_rows_per_s"] >= TARGETS["kernel_rows_per_s"]
                               and result["ratio_to_scan"] <= TARGETS["ratio_to_scan"]
                               and result["peak_rss_bytes"] <= TARGETS["peak_rss_bytes"])
    print(f"kernel rows            {total:,} (all {rows:,} placed in steps)")
    print(f"bare sqlite3 scan      {med['scan']:.2f} s   peak RSS {rss['scan'] / 1e6:.0f} MB")
    print(f"full ingest            {med['ingest']:.2f} s   {result['kernel_rows_per_s'] / 1e6:.2f} M rows/s   "
          f"ratio to scan {result['ratio_to_scan']:.2f}   peak RSS {rss['ingest'] / 1e6:.0f} MB")
    print(f"ingest without Arrow   {med['ingest-sqlite3']:.2f} s   "
          f"{result['kernel_rows_per_s_sqlite3'] / 1e6:.2f} M rows/s   ratio to scan "
          f"{result['ratio_to_scan_sqlite3']:.2f}   peak RSS {rss['ingest-sqlite3'] / 1e6:.0f} MB")
    print(f"CPU time               scan {cpu['scan']:.2f} s, ingest {cpu['ingest']:.2f} s "
          f"({result['kernel_rows_per_cpu_s'] / 1e6:.2f} M rows per CPU-s, ratio {result['cpu_ratio_to_scan']:.2f}), "
          f"without Arrow {cpu['ingest-sqlite3']:.2f} s; load average {result['load_avg_1m']:.1f} on {os.cpu_count()} CPUs")
    if nvtx is not None:
        print(f"with {nvtx['step_ranges']:,} NVTX step ranges (projection): {nvtx['seconds']:.2f} s "
              f"(CPU {nvtx['cpu_s']:.2f} s), {total / nvtx['seconds'] / 1e6:.2f} M kernel rows/s, "
              f"peak RSS {nvtx['peak_rss_bytes'] / 1e6:.0f} MB")
    print(f"targets: >= 1 M rows/s, ratio <= 3, peak RSS <= 1.5 GB -> "
          f"{'met' if result['meets_targets'] else 'NOT met'}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
