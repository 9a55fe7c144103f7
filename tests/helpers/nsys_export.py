"""Build small Nsight Systems SQLite exports for tests, with the real table definitions.

Tables come from the DDL of a real export (``tests/fixtures/nsys/nsys_schema_3.25.0_ddl.sql``);
the graph-trace and GPU-metrics tables, which no small public export contains, are created with
the columns NVIDIA documents (formats.md §3.6, §3.7). Rows are inserted by the test, so its
expectations come from what it inserted, not from the collector.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

DDL = Path(__file__).resolve().parents[1] / "fixtures" / "nsys" / "nsys_schema_3.25.0_ddl.sql"
EXTRA_DDL = {
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": """CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (
        start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
        greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
        graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL)""",
    "TARGET_INFO_GPU_METRICS": """CREATE TABLE TARGET_INFO_GPU_METRICS (
        typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, typeName TEXT NOT NULL,
        metricId INTEGER NOT NULL, metricName TEXT NOT NULL)""",
    "GPU_METRICS": """CREATE TABLE GPU_METRICS (
        rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL,
        value INTEGER NOT NULL)""",
}
HW = 1 << 48  # the hardware/VM bits real exports carry in globalTid/globalPid


def gtid(pid: int, tid: int) -> int:
    return HW | (pid << 24) | tid


def gpid(pid: int) -> int:
    return HW | (pid << 24)


def table_ddl() -> dict[str, str]:
    """``name -> CREATE TABLE statement`` of every table in the real DDL file."""
    text = DDL.read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"CREATE TABLE (\w+) \((?:.|\n)*?\n\);", text)}


class NsysExport:
    """A new export at ``path`` holding ``tables`` (default: the core trace tables)."""

    CORE = ("StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
            "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT", "ENUM_NSYS_EVENT_TYPE")

    def __init__(self, path, tables=CORE, session=(1_700_000_000_000_000_000, 10_000_000_000)):
        self.path = Path(path)
        self.conn = sqlite3.connect(self.path)
        ddl = table_ddl()
        for t in tables:
            self.conn.execute(EXTRA_DDL.get(t) or ddl[t])
        self.tables = set(tables)
        self._strings: dict[str, int] = {}
        if "TARGET_INFO_SESSION_START_TIME" in self.tables:
            self.conn.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, 'x', 'x', ?)", session)
        if "ENUM_NSYS_EVENT_TYPE" in self.tables:
            self.conn.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
                                  [(59, "NvtxPushPopRange", "NVTX push-pop range"),
                                   (60, "NvtxStartEndRange", "NVTX start-end range"),
                                   (75, "NvtxDomainCreate", "NVTX domain create")])
        if "META_DATA_EXPORT" in self.tables:
            self.conn.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.25.0')")

    def string(self, value: str) -> int:
        if value not in self._strings:
            self._strings[value] = len(self._strings) + 1
            self.conn.execute("INSERT INTO StringIds VALUES (?, ?)", (self._strings[value], value))
        return self._strings[value]

    def domain(self, domain_id: int, name: str, tid: int) -> None:
        self.conn.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (0, 75, ?, ?, ?)",
                          (name, tid, domain_id))

    def nvtx(self, start, end, text, tid, *, registered=False, domain=0, event_type=59, int64=None, double=None):
        """A range; ``registered`` stores the message in StringIds (as the ``nvtx`` package does)."""
        text_col, text_id = (None, self.string(text)) if registered else (text, None)
        self.conn.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid, textId, domainId, "
                          "int64Value, doubleValue) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          (start, end, event_type, text_col, tid, text_id, domain, int64, double))

    def call(self, start, end, name, corr, tid):
        """A runtime/driver API call (e.g. ``cudaLaunchKernel_v7000``, ``cudaGraphLaunch_v10000``)."""
        self.conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, 0, NULL)",
                          (start, end, tid, corr, self.string(name)))

    def kernel(self, start, end, corr, pid, *, device=0, graph_id=None, name="k", short=None, stream=7):
        """A kernel row; ``name`` is the demangled name, ``short`` the short one (default: the same)."""
        sid = self.string(name)
        short_id = self.string(short) if short else sid
        self.conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, contextId, streamId, correlationId, "
            "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
            "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, "
            "sharedMemoryExecuted, graphId, tensorSizeMinusOneElements) "
            "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1, 0, ?, 0)",
            (start, end, device, stream, corr, gpid(pid), sid, short_id, graph_id))

    def memcpy(self, start, end, corr, pid, *, nbytes, copy_kind, device=0, stream=7):
        """:meth:`copy` with keyword arguments (``copy_kind``: 1 = H2D, 2 = D2H, 8 = D2D, 10 = P2P)."""
        self.copy(start, end, corr, pid, nbytes, copy_kind, device=device, stream=stream)

    def copy(self, start, end, corr, pid, nbytes, kind, *, device=0, stream=7):
        """A CUPTI memcpy row (``kind``: 1 H2D, 2 D2H, 8 D2D, 10 P2P as in ``ENUM_CUDA_MEMCPY_OPER``)."""
        self.conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, \"end\", deviceId, contextId, streamId, correlationId, "
            "globalPid, bytes, copyKind, srcKind, dstKind, srcDeviceId, dstDeviceId, copyCount) "
            "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, 1, 2, ?, ?, 1)",
            (start, end, device, stream, corr, gpid(pid), nbytes, kind, device, device))

    def graph_trace(self, start, end, corr, pid, *, device=0, graph_id=1, stream=7):
        self.conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, ?, 1, NULL, ?, ?, ?, ?, 1)",
                          (start, end, device, stream, corr, gpid(pid), graph_id))

    def sm_metric(self, t, percent, *, gpu=0, name="SMs Active", metric_id=5):
        type_id = 0x100 | gpu
        if not self.conn.execute("SELECT 1 FROM TARGET_INFO_GPU_METRICS WHERE typeId = ? AND metricId = ?",
                                 (type_id, metric_id)).fetchone():
            self.conn.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GPU', ?, ?)", (type_id, metric_id, name))
        self.conn.execute("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)", (t, t, type_id, metric_id, percent))

    def close(self) -> Path:
        self.conn.commit()
        self.conn.close()
        return self.path
