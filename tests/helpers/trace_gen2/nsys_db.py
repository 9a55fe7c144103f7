"""Writes :class:`~.engine.Rows` as an Nsight Systems SQLite export (schema 3.25, lazy: tables
without rows are left out as ``nsys export`` does by default).

The CREATE TABLE statements below are copied from /work/shared/reference/nsys_schema_3.25.0_ddl.sql
(line numbers beside each; column comments dropped). That file lacks the graph-trace and GPU-metrics
tables and TARGET_INFO_GPU; those are written from formats.md section 3.6 / 3.7 (columns as listed
there) and NVIDIA's AnalysisGuide schema reference (TARGET_INFO_GPU: a subset of its columns).
"""
from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path

import numpy as np

from .engine import Rows

DDL = {
    # nsys_schema_3.25.0_ddl.sql lines 442-447
    "StringIds": """CREATE TABLE StringIds (
    id                          INTEGER   NOT NULL   PRIMARY KEY,
    value                       TEXT      NOT NULL
);""",
    # nsys_schema_3.25.0_ddl.sql lines 37-78
    "CUPTI_ACTIVITY_KIND_KERNEL": """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,
    end                         INTEGER   NOT NULL,
    deviceId                    INTEGER   NOT NULL,
    contextId                   INTEGER   NOT NULL,
    greenContextId              INTEGER,
    streamId                    INTEGER   NOT NULL,
    correlationId               INTEGER,
    globalPid                   INTEGER,
    demangledName               INTEGER   NOT NULL,
    shortName                   INTEGER   NOT NULL,
    mangledName                 INTEGER,
    launchType                  INTEGER,
    cacheConfig                 INTEGER,
    registersPerThread          INTEGER   NOT NULL,
    gridX                       INTEGER   NOT NULL,
    gridY                       INTEGER   NOT NULL,
    gridZ                       INTEGER   NOT NULL,
    blockX                      INTEGER   NOT NULL,
    blockY                      INTEGER   NOT NULL,
    blockZ                      INTEGER   NOT NULL,
    staticSharedMemory          INTEGER   NOT NULL,
    dynamicSharedMemory         INTEGER   NOT NULL,
    localMemoryPerThread        INTEGER   NOT NULL,
    localMemoryTotal            INTEGER   NOT NULL,
    gridId                      INTEGER   NOT NULL,
    sharedMemoryExecuted        INTEGER,
    graphNodeId                 INTEGER,
    sharedMemoryLimitConfig     INTEGER,
    qmdBulkReleaseDone          INTEGER,
    qmdPreexitDone              INTEGER,
    qmdLastCtaDone              INTEGER,
    graphId                     INTEGER,
    clusterX                    INTEGER,
    clusterY                    INTEGER,
    clusterZ                    INTEGER,
    clusterSchedulingPolicy     INTEGER,
    maxPotentialClusterSize     INTEGER,
    maxActiveClusters           INTEGER,
    sharedMemoryRequestedPercentage   INTEGER,
    tensorSizeMinusOneElements   TEXT      NOT NULL
);""",
    # nsys_schema_3.25.0_ddl.sql lines 80-102
    "CUPTI_ACTIVITY_KIND_MEMCPY": """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start                       INTEGER   NOT NULL,
    end                         INTEGER   NOT NULL,
    deviceId                    INTEGER   NOT NULL,
    contextId                   INTEGER   NOT NULL,
    greenContextId              INTEGER,
    streamId                    INTEGER   NOT NULL,
    correlationId               INTEGER,
    globalPid                   INTEGER,
    bytes                       INTEGER   NOT NULL,
    copyKind                    INTEGER   NOT NULL,
    deprecatedSrcId             INTEGER,
    srcKind                     INTEGER,
    dstKind                     INTEGER,
    srcDeviceId                 INTEGER,
    srcContextId                INTEGER,
    dstDeviceId                 INTEGER,
    dstContextId                INTEGER,
    migrationCause              INTEGER,
    graphNodeId                 INTEGER,
    virtualAddress              INTEGER,
    copyCount                   INTEGER
);""",
    # nsys_schema_3.25.0_ddl.sql lines 129-138
    "CUPTI_ACTIVITY_KIND_RUNTIME": """CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start                       INTEGER   NOT NULL,
    end                         INTEGER   NOT NULL,
    eventClass                  INTEGER   NOT NULL,
    globalTid                   INTEGER,
    correlationId               INTEGER,
    nameId                      INTEGER   NOT NULL,
    returnValue                 INTEGER   NOT NULL,
    callchainId                 INTEGER
);""",
    # nsys_schema_3.25.0_ddl.sql lines 370-391
    "NVTX_EVENTS": """CREATE TABLE NVTX_EVENTS (
    start                       INTEGER   NOT NULL,
    end                         INTEGER,
    eventType                   INTEGER   NOT NULL,
    rangeId                     INTEGER,
    category                    INTEGER,
    color                       INTEGER,
    text                        TEXT,
    globalTid                   INTEGER,
    endGlobalTid                INTEGER,
    textId                      INTEGER,
    domainId                    INTEGER,
    uint64Value                 INTEGER,
    int64Value                  INTEGER,
    doubleValue                 REAL,
    uint32Value                 INTEGER,
    int32Value                  INTEGER,
    floatValue                  REAL,
    jsonTextId                  INTEGER,
    jsonText                    TEXT,
    binaryData                  TEXT
);""",
    # nsys_schema_3.25.0_ddl.sql lines 300-306
    "ENUM_NSYS_EVENT_TYPE": """CREATE TABLE ENUM_NSYS_EVENT_TYPE (
    id                          INTEGER   NOT NULL   PRIMARY KEY,
    name                        TEXT,
    label                       TEXT
);""",
    # nsys_schema_3.25.0_ddl.sql lines 188-194
    "ENUM_CUDA_MEMCPY_OPER": """CREATE TABLE ENUM_CUDA_MEMCPY_OPER (
    id                          INTEGER   NOT NULL   PRIMARY KEY,
    name                        TEXT,
    label                       TEXT
);""",
    # nsys_schema_3.25.0_ddl.sql lines 459-464
    "TARGET_INFO_SESSION_START_TIME": """CREATE TABLE TARGET_INFO_SESSION_START_TIME (
    utcEpochNs                  INTEGER,
    utcTime                     TEXT,
    localTime                   TEXT,
    systemClockNs               INTEGER
);""",
    # nsys_schema_3.25.0_ddl.sql lines 363-368
    "META_DATA_EXPORT": """CREATE TABLE META_DATA_EXPORT (
    name                        TEXT      NOT NULL,
    value                       TEXT
);""",
    # nsys_schema_3.25.0_ddl.sql lines 356-361
    "META_DATA_CAPTURE": """CREATE TABLE META_DATA_CAPTURE (
    name                        TEXT      NOT NULL,
    value                       TEXT
);""",
    # nsys_schema_3.25.0_ddl.sql lines 420-426
    "PROCESSES": """CREATE TABLE PROCESSES (
    globalPid                   INTEGER,
    pid                         INTEGER,
    name                        TEXT
);""",
    # nsys_schema_3.25.0_ddl.sql lines 474-478
    "ThreadNames": """CREATE TABLE ThreadNames (
    nameId                      INTEGER   NOT NULL,
    priority                    INTEGER,
    globalTid                   INTEGER
);""",
    # nsys_schema_3.25.0_ddl.sql lines 449-457
    "TARGET_INFO_CUDA_STREAM": """CREATE TABLE TARGET_INFO_CUDA_STREAM (
    streamId                    INTEGER   NOT NULL,
    hwId                        INTEGER   NOT NULL,
    vmId                        INTEGER   NOT NULL,
    processId                   INTEGER   NOT NULL,
    contextId                   INTEGER   NOT NULL,
    priority                    INTEGER   NOT NULL,
    flag                        INTEGER   NOT NULL
);""",
    # formats.md section 3.6 (CUPTI GraphTrace2 rows, one per graph launch)
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": """CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL
);""",
    # formats.md section 3.7
    "TARGET_INFO_GPU_METRICS": """CREATE TABLE TARGET_INFO_GPU_METRICS (
    typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, typeName TEXT NOT NULL, metricId INTEGER NOT NULL,
    metricName TEXT NOT NULL
);""",
    "GPU_METRICS": """CREATE TABLE GPU_METRICS (
    rawTimestamp INTEGER NOT NULL, timestamp INTEGER NOT NULL, typeId INTEGER NOT NULL,
    metricId INTEGER NOT NULL, value INTEGER NOT NULL
);""",
    # AnalysisGuide "TARGET_INFO_GPU" (subset of its columns)
    "TARGET_INFO_GPU": """CREATE TABLE TARGET_INFO_GPU (
    vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER,
    totalMemory INTEGER, smCount INTEGER, computeMajor INTEGER, computeMinor INTEGER, uuid TEXT
);""",
}

#: ENUM_NSYS_EVENT_TYPE ids of the NVTX rows written (formats.md section 3.3)
EVENT_TYPES = ((33, "NvtxCategory", "NVTX category"), (34, "NvtxMark", "NVTX mark"),
               (59, "NvtxPushPopRange", "NVTX PushPop Range"), (60, "NvtxStartEndRange", "NVTX StartEnd Range"),
               (75, "NvtxDomainCreate", "NVTX domain create"))
#: CUpti_ActivityMemcpyKind (CUPTI docs)
MEMCPY_OPER = ((0, "CUDA_MEMCPY_OPER_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_OPER_HTOD", "Host-to-Device"),
               (2, "CUDA_MEMCPY_OPER_DTOH", "Device-to-Host"), (8, "CUDA_MEMCPY_OPER_DTOD", "Device-to-Device"),
               (10, "CUDA_MEMCPY_OPER_PTOP", "Peer-to-Peer"))
KERNEL_COLS = ("start, end, deviceId, contextId, greenContextId, streamId, correlationId, globalPid, demangledName, "
               "shortName, mangledName, launchType, cacheConfig, registersPerThread, gridX, gridY, gridZ, blockX, "
               "blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, "
               "gridId, sharedMemoryExecuted, graphNodeId, sharedMemoryLimitConfig, graphId, tensorSizeMinusOneElements")
SM_METRIC_ID = 7
BIN_NS = 10_000  # resolution of the SM-occupancy integral behind each GPU_METRICS sample


def _sm_samples(busy: dict, t_lo: int, t_hi: int, hz: int) -> list[tuple]:
    """``SMs Active`` per device: time-weighted SM share of every kernel in each 1/hz window, graph
    nodes included whether or not the trace shows them (the counters see the SMs, not CUPTI)."""
    out = []
    n = (t_hi - t_lo) // BIN_NS + 2
    per = max(1, int(1e9 / hz) // BIN_NS)
    for dev, spans in busy.items():
        a = np.asarray(spans, dtype=float)
        occ = np.zeros(n + 1)
        lo = np.clip(((a[:, 0] - t_lo) / BIN_NS), 0, n - 1)
        hi = np.clip(((a[:, 1] - t_lo) / BIN_NS), 0, n - 1)
        # fractional difference array: share x covered fraction of each 10-us bin
        np.add.at(occ, lo.astype(int), a[:, 2] * (1 - lo % 1))
        np.add.at(occ, lo.astype(int) + 1, a[:, 2] * (lo % 1))
        np.add.at(occ, hi.astype(int), -a[:, 2] * (1 - hi % 1))
        np.add.at(occ, hi.astype(int) + 1, -a[:, 2] * (hi % 1))
        level = np.clip(np.cumsum(occ)[:n], 0, 1)
        m = len(level) // per
        win = level[: m * per].reshape(m, per).mean(axis=1)
        type_id = 0x100 | int(dev)
        for k, v in enumerate(win):
            ts = t_lo + (k + 1) * per * BIN_NS
            out.append((ts, ts, type_id, SM_METRIC_ID, int(round(100 * v))))
    return out


def write_export(rows: Rows, path: Path, *, pids: list[int], graph_trace: str, gpu_metrics_hz: int,
                 utc_epoch_ns: int, system_clock_ns: int, process_name: str) -> None:
    path = Path(path)
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        tables = ["StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "ENUM_NSYS_EVENT_TYPE",
                  "ENUM_CUDA_MEMCPY_OPER", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT", "META_DATA_CAPTURE",
                  "PROCESSES", "ThreadNames", "TARGET_INFO_CUDA_STREAM", "TARGET_INFO_GPU"]
        tables += ["CUPTI_ACTIVITY_KIND_MEMCPY"] if rows.memcpy else []
        tables += ["CUPTI_ACTIVITY_KIND_GRAPH_TRACE"] if rows.graphs else []
        tables += ["NVTX_EVENTS"] if rows.nvtx else []
        tables += ["TARGET_INFO_GPU_METRICS", "GPU_METRICS"] if gpu_metrics_hz > 0 else []
        for t in tables:
            con.execute(DDL[t])
        for name in ("python3", "MainThread", "kv_connector"):
            rows.sid(name)
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in rows.strings.items()])
        ph = ", ".join("?" * 30)
        con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({KERNEL_COLS}) VALUES ({ph})", [
            (st, en, dev, 1, None, stream, corr, gpid, dem, short, None, 1, 0, 64, 132, 1, 1, 128, 1, 1, 0, 0, 0, 0,
             gi, 0, node, 1, gid, "") for gi, (st, en, dev, stream, corr, gpid, short, dem, gid, node)
            in enumerate(rows.kernels, start=1)])
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
                        "nameId, returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)", rows.runtime)
        rows.memcpy and con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, "
                        "correlationId, globalPid, bytes, copyKind, srcKind, dstKind, copyCount) "
                        "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, 1)", rows.memcpy)
        rows.graphs and con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, ?, 1, NULL, ?, ?, ?, ?, ?)", rows.graphs)
        rows.nvtx and con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                        "VALUES (?, ?, 59, ?, ?, 0)", rows.nvtx)
        con.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)", EVENT_TYPES)
        con.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?, ?, ?)", MEMCPY_OPER)
        utc = datetime.datetime.fromtimestamp(utc_epoch_ns / 1e9, datetime.timezone.utc)
        con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?, ?)",
                    (utc_epoch_ns, utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), utc.strftime("%Y-%m-%dT%H:%M:%S"), system_clock_ns))
        con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [
            ("EXPORT_SCHEMA_VERSION", "3.25.0"), ("EXPORT_SCHEMA_VERSION_MAJOR", "3"),
            ("EXPORT_SCHEMA_VERSION_MINOR", "25"), ("EXPORT_SCHEMA_VERSION_MICRO", "0"),
            ("EXPORT_PRODUCT_VERSION", "2026.2.1.210")])
        con.execute("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)",
                    ("CUDA_GRAPH_TRACE_OPTIONS:MODE", "Graph" if graph_trace == "graph" else "Node"))
        con.executemany("INSERT INTO PROCESSES VALUES (?, ?, ?)", [(p << 24, p, process_name) for p in pids])
        con.executemany("INSERT INTO ThreadNames VALUES (?, 0, ?)",
                        [(rows.sid("MainThread"), (p << 24) | p) for p in pids] +
                        [(rows.sid("kv_connector"), (p << 24) | (p + 3)) for p in pids])
        con.executemany("INSERT INTO TARGET_INFO_CUDA_STREAM VALUES (?, 0, 0, ?, 1, 0, ?)",
                        [(sid, p, 1 if sid == 7 else 2) for p in pids for sid in (7, 13, 21)])
        con.executemany("INSERT INTO TARGET_INFO_GPU VALUES (0, ?, 'NVIDIA H200', ?, 1, 150754820096, 132, 9, 0, ?)",
                        [(d, f"0000:{0x18 + d:02x}:00.0", f"GPU-{d:08d}") for d in range(len(pids))])
        if gpu_metrics_hz > 0:
            con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, ?, ?, ?, ?)",
                            [(0x100 | d, d, f"GPU {d}", SM_METRIC_ID, "SMs Active") for d in range(len(pids))])
            lo = min(r[0] for r in rows.runtime)
            hi = max(r[1] for r in rows.kernels + rows.graphs)
            con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)", _sm_samples(rows.busy, lo, hi, gpu_metrics_hz))
        con.commit()
    finally:
        con.close()
