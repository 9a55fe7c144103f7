"""What the device breakdown adds to ``mixdiag analyze`` on a large Nsight export, side by side in one run.

The export is bench_nsys.py's simulated vLLM-like engine (``ranges`` variant: step ranges, node-level
graph trace), cached under benchmarks/.cache/. Two probes run the real CLI in a fresh process each,
interleaved ``--repeats`` times (alternating which runs first) so machine load hits both alike:

* ``plain``     - ``mixdiag analyze EXPORT --json --no-breakdown`` (no per-kernel rows kept, no breakdown);
* ``breakdown`` - ``mixdiag analyze EXPORT --json`` (the activity frame and the breakdown section).

Per probe: wall and CPU seconds (user + sys of the child, from ``wait4``) and peak RSS; the line that
matters is the ratio breakdown / plain (target: <= 1.30 in wall and CPU, issue 25).

    .venv/bin/python benchmarks/bench_breakdown.py [--kernels 2500000] [--repeats 3] [--json]
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
sys.path.insert(0, str(ROOT / "benchmarks"))
TARGET_RATIO = 1.30


def probe(path: Path, breakdown: bool) -> dict:
    cmd = [str(ROOT / ".venv" / "bin" / "mixdiag"), "analyze", str(path), "--json"] + ([] if breakdown else ["--no-breakdown"])
    t = time.perf_counter()
    with open(os.devnull, "wb") as null:
        p = subprocess.Popen(cmd, stdout=null, stderr=subprocess.PIPE, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"probe failed: {err.strip().splitlines()[-1] if err.strip() else status}")
    return {"seconds": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_bytes": ru.ru_maxrss * 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=2_500_000, help="kernel rows in the simulated export")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)
    from bench_nsys import export

    path = export("ranges", args.kernels, args.json)
    runs = {"plain": [], "breakdown": []}
    for i in range(args.repeats):
        # alternate which probe runs first (ABBA): whatever favours one position of two back-to-back
        # runs on a shared machine (page cache, another session's cycle) then falls on both probes alike
        for mode in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
            runs[mode].append(probe(path, mode == "breakdown"))
    res = {"export": path.name, "repeats": args.repeats, "load_avg_1m": os.getloadavg()[0], "cpus": os.cpu_count()}
    lines = [f"{'probe':<10} {'wall s':>7} {'CPU s':>7} {'peak RSS':>9}"]
    for mode, rs in runs.items():
        d = {k: statistics.median(r[k] for r in rs) for k in ("seconds", "cpu_s")}
        d["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rs)
        res[mode] = d
        lines.append(f"{mode:<10} {d['seconds']:>7.2f} {d['cpu_s']:>7.2f} {d['peak_rss_bytes'] / 1e6:>7.0f}MB")
    wall_ratio = res["breakdown"]["seconds"] / res["plain"]["seconds"]
    cpu_ratio = res["breakdown"]["cpu_s"] / res["plain"]["cpu_s"]
    res.update(wall_ratio=wall_ratio, cpu_ratio=cpu_ratio, meets_target=bool(max(wall_ratio, cpu_ratio) <= TARGET_RATIO))
    print("\n".join(lines))
    print(f"breakdown / plain: wall {wall_ratio:.2f}x, CPU {cpu_ratio:.2f}x, peak RSS "
          f"{res['breakdown']['peak_rss_bytes'] / res['plain']['peak_rss_bytes']:.2f}x (target <= {TARGET_RATIO:.2f}: "
          f"{'met' if res['meets_target'] else 'NOT met'}; medians of {args.repeats}, load average "
          f"{res['load_avg_1m']:.1f} on {res['cpus']} CPUs)")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
