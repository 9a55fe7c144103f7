"""Write a :class:`Trace` as the Chrome-trace JSON that ``torch.profiler`` (Kineto) exports, one file per rank.

Shape as Kineto writes it (pytorch/kineto ``libkineto/src/output_json.cpp``; HTA reads the same):
top-level ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (rank, world_size),
``baseTimeNanoseconds`` and ``traceEvents``; complete events ``ph: X`` with ``ts``/``dur`` in
microseconds; GPU rows use ``pid`` = device and ``tid`` = stream; categories ``kernel``,
``gpu_memcpy``, ``cuda_runtime``, ``cuda_sync``, ``user_annotation`` / ``gpu_user_annotation``
(``record_function`` ranges), ``cpu_op``; ``args`` carry ``External id``, ``correlation``,
``device``, ``stream`` and, for copies, ``bytes``; ``ac2g`` flow events link launches to GPU ops.
Kineto has no graph-level trace mode: kernels replayed from a CUDA graph appear one by one under
the ``cudaGraphLaunch`` correlation id, so graph replays are written at node level here.
"""
from __future__ import annotations

import json
from pathlib import Path

from .timeline import Trace

COPY_NAME = {1: "Memcpy HtoD (Pinned -> Device)", 2: "Memcpy DtoH (Device -> Pinned)",
             8: "Memcpy DtoD (Device -> Device)", 10: "Memcpy PtoP (Device -> Device)"}
SYNC_NAME = {1: "Event Sync", 3: "Stream Sync"}


def _strip(name: str) -> str:
    """Kineto reports runtime names without nsys' version suffix."""
    return name.rsplit("_v", 1)[0] if "_v" in name else name


def rank_paths(out: Path, n_ranks: int) -> list[Path]:
    """``out`` for rank 0, ``<stem>.rank<r><suffix>`` for the others (torch writes one file per process)."""
    out = Path(out)
    return [out] + [out.with_name(f"{out.stem}.rank{r}{out.suffix}") for r in range(1, n_ranks)]


def write_kineto(trace: Trace, out: Path, *, process_names) -> list[Path]:
    """Write one JSON per rank; returns their paths."""
    paths = rank_paths(out, len(trace.pids))
    base = trace.t0 - 10_000_000
    us = lambda t: round((t - base) / 1000.0, 3)  # noqa: E731
    for r, (pid, path) in enumerate(zip(trace.pids, paths)):
        ev: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process_names[r % len(process_names)]}},
            {"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"GPU {r}"}},
        ]
        ext = 0
        launch_of: dict[int, tuple[int, int, int]] = {}  # correlation -> (start, tid, External id)
        flowed: set[int] = set()
        for s, e, p, t, c, n in trace.runtime:
            if p != pid:
                continue
            ext += 1
            launch_of[c] = (s, t, ext)
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": _strip(n), "pid": p, "tid": t, "ts": us(s),
                       "dur": round((e - s) / 1000, 3), "args": {"External id": ext, "correlation": c}})
            if n.startswith("cudaMemcpy"):
                ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": p, "tid": t, "ts": us(s) - 0.5,
                           "dur": round((e - s) / 1000, 3) + 1.0, "args": {"External id": ext}})
        for s, e, d, st, c, p, n, g, node in trace.kernels:
            if p != pid:
                continue
            args = {"External id": launch_of.get(c, (0, 0, 0))[2], "device": d, "context": 1, "stream": st, "correlation": c,
                    "registers per thread": 128, "grid": [132, 1, 1], "block": [256, 1, 1]}
            ev.append({"ph": "X", "cat": "kernel", "name": n, "pid": d, "tid": st, "ts": us(s),
                       "dur": round((e - s) / 1000, 3), "args": args})
            if c in launch_of and c not in flowed:  # one flow per launch (a graph's first node)
                flowed.add(c)
                ls, lt, _ = launch_of[c]
                ev.append({"ph": "s", "id": c, "pid": p, "tid": lt, "ts": us(ls), "cat": "ac2g", "name": "ac2g"})
                ev.append({"ph": "f", "id": c, "pid": d, "tid": st, "ts": us(s), "cat": "ac2g", "name": "ac2g", "bp": "e"})
        for s, e, d, st, c, p, b, k, *_ in trace.copies:
            if p != pid:
                continue
            dur = max(e - s, 1)
            ev.append({"ph": "X", "cat": "gpu_memcpy", "name": COPY_NAME.get(k, "Memcpy"), "pid": d, "tid": st,
                       "ts": us(s), "dur": round(dur / 1000, 3),
                       "args": {"External id": launch_of.get(c, (0, 0, 0))[2], "device": d, "context": 1, "stream": st, "correlation": c,
                                "bytes": b, "memory bandwidth (GB/s)": round(b / dur, 3)}})
        for s, e, d, st, c, p, ty in trace.syncs:
            if p == pid:
                ev.append({"ph": "X", "cat": "cuda_sync", "name": SYNC_NAME.get(ty, "Sync"), "pid": d, "tid": st,
                           "ts": us(s), "dur": round((e - s) / 1000, 3),
                           "args": {"device": d, "stream": st, "correlation": c}})
        for s, e, p, t, x in trace.nvtx:
            if p == pid:
                ev.append({"ph": "X", "cat": "user_annotation", "name": x, "pid": p, "tid": t, "ts": us(s),
                           "dur": round((e - s) / 1000, 3), "args": {"External id": 0}})
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": r, "name": "NVIDIA H100 80GB HBM3",
                                                        "totalGlobalMem": 85045231616, "numSms": 132}],
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": len(trace.pids)},
               "record_shapes": 0, "with_stack": 0, "traceName": str(path), "displayTimeUnit": "ms",
               "baseTimeNanoseconds": base, "traceEvents": ev}
        Path(path).write_text(json.dumps(doc, separators=(",", ":")))
    return paths
