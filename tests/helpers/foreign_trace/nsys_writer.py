"""Write a :class:`Trace` as an Nsight Systems 3.25 SQLite export.

Tables are created from the DDL of a real export (tests/fixtures/nsys/nsys_schema_3.25.0_ddl.sql);
the graph-trace and GPU-metrics tables, absent from that export, use the columns NVIDIA documents
(formats.md §3.6, §3.7). Conventions copied from the real fixtures: ``globalTid`` =
``<HW:8><VM:8><PID:24><TID:24>`` with bit 48 set, ``globalPid`` = the same with TID zeroed; every
name in ``StringIds``; runtime names carry the version suffix; ``META_DATA_CAPTURE`` records
``CUDA_GRAPH_TRACE_OPTIONS:MODE``; lazy export omits tables without rows (``NVTX_EVENTS`` when no
range was recorded). GPU metrics are sampled like ``--gpu-metrics-frequency`` (integer percent).
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from ..nsys_export import EXTRA_DDL, table_ddl
from .timeline import Trace

HW = 1 << 48
BASE = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS",
        "META_DATA_EXPORT", "META_DATA_CAPTURE", "ENUM_NSYS_EVENT_TYPE", "ENUM_CUDA_MEMCPY_OPER",
        "ENUM_CUPTI_SYNC_TYPE", "PROCESSES", "ThreadNames", "TARGET_INFO_CUDA_STREAM")
MEMCPY_OPER = [(0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
               (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
               (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer")]
SYNC_TYPE = [(1, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", "Event sync"),
             (3, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE", "Stream sync")]


def gpid(pid: int) -> int:
    return HW | (pid << 24)


def gtid(pid: int, tid: int) -> int:
    return HW | (pid << 24) | tid


class _Strings:
    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.ids) + 1
        return i


def sm_active(trace: Trace, hz: int, fill: float) -> list[tuple[int, int, int]]:
    """``(timestamp, device, percent)`` samples: per window, the time-weighted SM share of every
    kernel that ran (graph nodes too, whether or not the trace shows them), clipped at 1.

    A compute kernel occupies ``fill`` of the SMs (0.6-0.95: tails of waves, small decode GEMMs);
    an all-to-all kernel only its CTAs' share (``Trace.sm_work``), also while it waits for peers.
    """
    out = []
    period = int(1e9 / hz)
    work = np.array(trace.sm_work, dtype=np.float64).reshape(-1, 4)
    for dev in range(len(trace.pids)):
        w = work[work[:, 2] == dev]
        if not len(w):
            continue
        a = w[:, :2].astype(np.int64)
        share = np.where(w[:, 3] >= 1.0, fill, w[:, 3])
        lo, hi = int(a[:, 0].min()), int(a[:, 1].max())
        n = (hi - lo) // period + 1
        busy = np.zeros(n + 1)
        for (s, e), f in zip(a - lo, share):  # kernels are short against a window; split the few that straddle one
            w0, w1 = s // period, e // period
            if w0 == w1:
                busy[w0] += (e - s) * f
            else:
                busy[w0] += ((w0 + 1) * period - s) * f
                busy[w0 + 1:w1] += period * f
                busy[w1] += (e - w1 * period) * f
        pct = np.clip(busy[:n] / period, 0, 1) * 100
        out += [(lo + i * period, dev, int(v)) for i, v in enumerate(pct)]
    return out


def write_nsys(trace: Trace, path: Path, *, graph_trace: str, process_names, gpu_metrics_hz: int = 0,
               sm_fill: float = 0.85) -> Path:
    """Write ``trace`` to ``path`` (replaced if present) and return it."""
    path = Path(path)
    if path.exists():
        path.unlink()
    ddl = table_ddl()
    tables = list(BASE)
    if trace.nvtx:
        tables.append("NVTX_EVENTS")
    if trace.graphs:
        tables.append("CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    if gpu_metrics_hz:
        tables += ["TARGET_INFO_GPU_METRICS", "GPU_METRICS"]
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    for t in tables:
        con.execute(EXTRA_DDL.get(t) or ddl[t])
    S = _Strings()
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, contextId, streamId, "
                    "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, "
                    "blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, "
                    "localMemoryTotal, gridId, graphNodeId, graphId, tensorSizeMinusOneElements) VALUES "
                    "(?,?,?,1,?,?,?,?,?,128,132,1,1,256,1,1,0,49152,0,0,?,?,?,'[]')",
                    ((s, e, d, st, c, gpid(p), S(n), S(n), i, node, g)
                     for i, (s, e, d, st, c, p, n, g, node) in enumerate(trace.kernels)))
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,0,?,?,?,0,NULL)",
                    ((s, e, gtid(p, t), c, S(n)) for s, e, p, t, c, n in trace.runtime))
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, \"end\", deviceId, contextId, streamId, "
                    "correlationId, globalPid, bytes, copyKind, srcKind, dstKind, srcDeviceId, dstDeviceId, copyCount) "
                    "VALUES (?,?,?,1,?,?,?,?,?,?,?,?,?,1)",
                    ((s, e, d, st, c, gpid(p), b, k, sk, dk, sd, dd) for s, e, d, st, c, p, b, k, sk, dk, sd, dd in trace.copies))
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start, \"end\", deviceId, contextId, streamId, "
                    "correlationId, globalPid, syncType, eventId) VALUES (?,?,?,1,?,?,?,?,0)",
                    ((s, e, d, st, c, gpid(p), ty) for s, e, d, st, c, p, ty in trace.syncs))
    if trace.graphs:
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?,?,?,1,NULL,?,?,?,?,?)",
                        ((s, e, d, st, c, gpid(p), g, x) for s, e, d, st, c, p, g, x in trace.graphs))
    if trace.nvtx:  # torch.cuda.nvtx / record_function style: message in `text`, push-pop type 59
        con.executemany("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid, domainId) "
                        "VALUES (?,?,59,?,?,0)", ((s, e, x, gtid(p, t)) for s, e, p, t, x in trace.nvtx))
    if gpu_metrics_hz:
        con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GPU', 5, 'SMs Active')",
                        [(0x100 | d,) for d in range(len(trace.pids))])
        con.executemany("INSERT INTO GPU_METRICS VALUES (?,?,?,5,?)",
                        ((t, t, 0x100 | d, v) for t, d, v in sm_active(trace, gpu_metrics_hz, sm_fill)))
    _metadata(con, trace, S, graph_trace, process_names)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", ((i, s) for s, i in S.ids.items()))
    con.commit()
    con.close()
    return path


def _metadata(con, trace: Trace, S, graph_trace: str, process_names) -> None:
    ends = [r[1] for r in trace.runtime] or [trace.t0]
    stop = max(ends) + 1_000_000
    start = trace.t0 - 50_000_000
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '2026-06-01T00:00:00', '2026-06-01T00:00:00', ?)",
                (1_780_272_000_000_000_000, start))
    con.execute("INSERT INTO ANALYSIS_DETAILS VALUES (?, ?, ?, ?)", (HW, stop - start, start, stop))
    con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                    [("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_SCHEMA_VERSION", "3.25.0"),
                     ("EXPORT_SCHEMA_VERSION_MAJOR", "3"), ("EXPORT_SCHEMA_VERSION_MINOR", "25"),
                     ("EXPORT_SCHEMA_VERSION_MICRO", "0"), ("EXPORT_PARAM_LAZY", "true"),
                     ("DERIVED_BY", "tests/helpers/foreign_trace (simulated)")])
    con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)",
                    [("CUDA_GRAPH_TRACE_OPTIONS:MODE", "Graph" if graph_trace == "graph" else "Node")])
    con.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
                    [(59, "NvtxPushPopRange", "NVTX push-pop range"), (60, "NvtxStartEndRange", "NVTX start-end range"),
                     (75, "NvtxDomainCreate", "NVTX domain create")])
    con.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?, ?, ?)", MEMCPY_OPER)
    con.executemany("INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES (?, ?, ?)", SYNC_TYPE)
    for r, pid in enumerate(trace.pids):
        name = process_names[r % len(process_names)]
        con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (gpid(pid), pid, name))
        con.execute("INSERT INTO ThreadNames VALUES (?, 0, ?)", (S(name), gtid(pid, pid)))
        con.execute("INSERT INTO ThreadNames VALUES (?, 0, ?)", (S("kv_connector"), gtid(pid, pid + 7)))
        for stream in sorted({k[3] for k in trace.kernels if k[5] == pid} | {c[3] for c in trace.copies if c[5] == pid}):
            con.execute("INSERT INTO TARGET_INFO_CUDA_STREAM VALUES (?, 0, 0, ?, 1, 0, 2)", (stream, pid))
