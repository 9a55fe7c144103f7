"""HTA's own job on one trace directory, run by the HTA venv's interpreter (never imported by mixdiag).

    benchmarks/.cache/peers/hta/bin/python benchmarks/peers_hta_probe.py TRACE_DIR [--breakdowns LIST]

Loads the directory's rank files with ``TraceAnalysis`` and runs the temporal, kernel, idle-time and
communication breakdowns (plus the memory-bandwidth summary and the straggler finder), each guarded:
a breakdown that raises is reported, not hidden. Prints one JSON line: the ranks HTA's own file scan
found, the ranks loaded, and per breakdown ``ok`` or the exception.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import time
import warnings
from pathlib import Path


def main() -> int:
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    trace_dir = Path(sys.argv[1]).resolve()  # HTA joins relative rank files onto its default /tmp/trace
    wanted = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[2] == "--breakdowns" else None
    from hta.common.trace_file import create_rank_to_trace_dict_from_dir
    from hta.trace_analysis import TraceAnalysis

    files = sorted(str(p) for p in trace_dir.iterdir() if p.name.endswith((".json", ".json.gz")))
    # HTA's own rank scan (regex '"rank":\s+(\d+)'): compact JSON without a space after the colon maps every
    # file to rank 0, so one rank silently replaces the other. Reported, then the files are passed by rank.
    _, scanned = create_rank_to_trace_dict_from_dir(str(trace_dir))
    by_rank = {}
    for i, f in enumerate(files):
        with open(f, "rb") as fh:  # the header only: distributedInfo precedes traceEvents
            m = re.search(rb'"rank"\s*:\s*(\d+)', fh.read(65536))
        by_rank[int(m.group(1)) if m else i] = f
    out = {"files": len(files), "ranks_by_hta_scan": sorted(scanned), "breakdowns": {}}
    t = time.perf_counter()
    try:
        a = TraceAnalysis(trace_files=by_rank)
    except Exception as e:  # a load failure is the whole answer
        out["load"] = f"{type(e).__name__}: {e}"[:300]
        print(json.dumps(out))
        return 0
    ranks = sorted(a.t.traces)
    out.update(load="ok", load_s=round(time.perf_counter() - t, 3), ranks=ranks)
    jobs = {
        "temporal": lambda: a.get_temporal_breakdown(visualize=False),
        "kernel": lambda: a.get_gpu_kernel_breakdown(visualize=False),
        "idle": lambda: a.get_idle_time_breakdown(ranks=ranks, visualize=False),
        "comm_overlap": lambda: a.get_comm_comp_overlap(visualize=False),
        "memory_bw": lambda: a.get_memory_bw_summary(ranks=ranks),
        "stragglers": lambda: a.get_potential_stragglers(),
    }
    for name, job in jobs.items():
        if wanted and name not in wanted:
            continue
        t = time.perf_counter()
        try:
            r = job()
            rows = len(r[0]) if isinstance(r, tuple) else (len(r) if r is not None else 0)
            out["breakdowns"][name] = {"ok": True, "rows": rows, "s": round(time.perf_counter() - t, 3)}
        except Exception as e:
            out["breakdowns"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
