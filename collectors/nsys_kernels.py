"""GPU work of an Nsight Systems export, per step: kernels, graph launches, SM activity.

Two ways to give each kernel its step:

* :func:`project` - NVTX step ranges exist. NVIDIA's projection rule (``nvtx_gpu_proj_trace``,
  ``nvtx_kern_sum``): a kernel belongs to the range whose thread issued its launch call inside the
  range; the call is found by ``correlationId`` *and* the process (``globalPid = globalTid &
  ~0xFFFFFF``), since correlation ids repeat across processes. It runs as SQL over temp tables
  (an index probe per runtime/kernel row inside SQLite, aggregates out), never as Python rows.
* :func:`gap_steps` - no step ranges. Kernels (and graph-trace rows) are read in cursor chunks
  into numpy columns and split where the GPU idled longer than a gap; heuristic.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.collectors.nsys_db import GRAPH_TRACE, KERNEL, PID_MASK, RUNTIME, NsysDb
from mixdiag.collectors.trace_steps import graph_counts, split_on_gaps

CHUNK_ROWS = 1 << 17
KERNEL_LAUNCH_LIKE = ("cudaLaunch%Kernel%", "cuLaunch%Kernel%")
GRAPH_LAUNCH_LIKE = ("cudaGraphLaunch%", "cuGraphLaunch%")
SM_ACTIVE_NAMES = ("SMs Active", "SM Active", "SM Active [Throughput %]", "SMs Active [Throughput %]")
AGG_COLUMNS = ["gpu_kernels", "gpu_start_ns", "gpu_end_ns", "gpu_kernel_ns", "graph_launches",
               "eager_between", "device"]


def launch_names(db: NsysDb) -> tuple[dict[int, str], dict[int, str]]:
    """StringIds of kernel-launch and graph-launch API calls (runtime ``_vNNNN`` suffixes included)."""
    like = " OR ".join("value LIKE ?" for _ in KERNEL_LAUNCH_LIKE)
    kern = db.string_ids(like, KERNEL_LAUNCH_LIKE)
    like = " OR ".join("value LIKE ?" for _ in GRAPH_LAUNCH_LIKE)
    graph = db.string_ids(like, GRAPH_LAUNCH_LIKE)
    return kern, graph


def fetch_columns(db: NsysDb, sql: str, n_cols: int) -> list[np.ndarray]:
    """Run ``sql`` (integer columns, no NULLs) and return its columns as int64 arrays.

    Rows stream in batches either way. With ``adbc-driver-sqlite`` the batches are Arrow
    columns built in C; without it, ``sqlite3`` cursor chunks (every value becomes a Python
    object first, several times slower).
    """
    conn = db.arrow_connection()
    if conn is not None:
        cols: list[list[np.ndarray]] = [[] for _ in range(n_cols)]
        with conn.cursor() as cur:
            cur.execute(sql)
            for batch in cur.fetch_record_batch():
                for i in range(n_cols):
                    cols[i].append(batch.column(i).to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
        return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in cols]
    cur = db.conn.execute(sql)
    parts = []
    while True:
        rows = cur.fetchmany(CHUNK_ROWS)
        if not rows:
            break
        parts.append(np.array(rows, dtype=np.int64).reshape(len(rows), n_cols))
    arr = np.concatenate(parts) if parts else np.zeros((0, n_cols), dtype=np.int64)
    return [np.ascontiguousarray(arr[:, i]) for i in range(n_cols)]


# ---- NVTX projection ------------------------------------------------------------------------
def project(db: NsysDb, ranges: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Per step range (row order of ``ranges``): kernels launched inside it and how it launched.

    Returns a frame indexed like ``ranges`` with :data:`AGG_COLUMNS` and notes.
    """
    notes: list[str] = []
    out = pd.DataFrame(np.nan, index=range(len(ranges)), columns=AGG_COLUMNS)
    if not db.has(RUNTIME) or not {"globalTid", "correlationId", "nameId"} <= db.columns(RUNTIME):
        notes.append("no CUPTI_ACTIVITY_KIND_RUNTIME table: kernels cannot be projected onto NVTX steps")
        return out, notes
    kern, graph = launch_names(db)
    c = db.conn
    c.execute("DROP TABLE IF EXISTS temp.mx_steps")
    c.execute("DROP TABLE IF EXISTS temp.mx_names")
    c.execute("DROP TABLE IF EXISTS temp.mx_launch")
    c.execute('CREATE TEMP TABLE mx_steps (idx INTEGER PRIMARY KEY, tid INTEGER, start INTEGER, "end" INTEGER)')
    c.executemany("INSERT INTO mx_steps VALUES (?, ?, ?, ?)",
                  zip(range(len(ranges)), ranges["tid"].astype("int64").tolist(),
                      ranges["start_ns"].astype("int64").tolist(), ranges["end_ns"].astype("int64").tolist()))
    c.execute("CREATE INDEX temp.mx_steps_tid ON mx_steps (tid, start)")
    c.execute("CREATE TEMP TABLE mx_names (id INTEGER PRIMARY KEY, is_graph INTEGER)")
    c.executemany("INSERT INTO mx_names VALUES (?, ?)", [(i, 0) for i in kern] + [(i, 1) for i in graph])
    # Launch calls issued inside a step range on the step's thread (NVIDIA's rule 1).
    c.execute(f"""CREATE TEMP TABLE mx_launch AS
        SELECT r.correlationId AS corr, r.globalTid & {PID_MASK} AS gpid, r.start AS start,
               nm.is_graph AS is_graph, s.idx AS idx
        FROM {RUNTIME} r JOIN mx_names nm ON nm.id = r.nameId
        JOIN mx_steps s ON s.idx = (SELECT idx FROM mx_steps WHERE tid = r.globalTid AND start <= r.start
                                    ORDER BY start DESC LIMIT 1)
        WHERE r.globalTid IN (SELECT tid FROM mx_steps) AND r."end" <= s."end" """)
    c.execute("CREATE INDEX temp.mx_launch_corr ON mx_launch (corr, gpid)")

    c.execute("CREATE INDEX temp.mx_launch_idx ON mx_launch (idx, is_graph, start)")
    # Graph mode evidence: graph launches, and eager launches between the first and last of them.
    host = pd.DataFrame(c.execute("""
        WITH g AS (SELECT idx, count(*) AS n, min(start) AS first, max(start) AS last
                   FROM mx_launch WHERE is_graph = 1 GROUP BY idx)
        SELECT g.idx, g.n, (SELECT count(*) FROM mx_launch e WHERE e.idx = g.idx AND e.is_graph = 0
                              AND e.start > g.first AND e.start < g.last)
        FROM g""").fetchall(), columns=["idx", "graph_launches", "eager_between"])
    has_pid = "globalPid" in db.columns(KERNEL)
    if not has_pid:
        notes.append("kernel table has no globalPid: kernels joined to launches by correlationId alone")
    on = "l.corr = k.correlationId" + (" AND l.gpid = k.globalPid" if has_pid else "")
    gpu = pd.DataFrame(c.execute(f"""
        SELECT l.idx, count(*), min(k.start), max(k."end"), sum(k."end" - k.start), min(k.deviceId)
        FROM {KERNEL} k JOIN mx_launch l ON {on} GROUP BY l.idx""").fetchall(),
        columns=["idx", "gpu_kernels", "gpu_start_ns", "gpu_end_ns", "gpu_kernel_ns", "device"])
    if db.has(GRAPH_TRACE):
        has_gpid = "globalPid" in db.columns(GRAPH_TRACE)
        gon = "l.corr = g.correlationId" + (" AND l.gpid = g.globalPid" if has_gpid else "")
        g = pd.DataFrame(c.execute(f"""
            SELECT l.idx, min(g.start), max(g."end"), sum(g."end" - g.start), min(g.deviceId)
            FROM {GRAPH_TRACE} g JOIN mx_launch l ON {gon} GROUP BY l.idx""").fetchall(),
            columns=["idx", "g_start", "g_end", "g_ns", "g_dev"])
        gpu = gpu.merge(g, on="idx", how="outer")
        gpu["gpu_start_ns"] = gpu[["gpu_start_ns", "g_start"]].min(axis=1)
        gpu["gpu_end_ns"] = gpu[["gpu_end_ns", "g_end"]].max(axis=1)
        gpu["gpu_kernel_ns"] = gpu["gpu_kernel_ns"].fillna(0) + gpu["g_ns"].fillna(0)
        gpu["device"] = gpu["device"].fillna(gpu["g_dev"])
        gpu["gpu_kernels"] = gpu["gpu_kernels"].fillna(0)
        gpu = gpu.drop(columns=["g_start", "g_end", "g_ns", "g_dev"])
    for frame in (host.set_index("idx"), gpu.set_index("idx")):
        for col in frame.columns:
            out.loc[frame.index, col] = frame[col].to_numpy(dtype="float64")
    # Steps without a single launch call launched nothing: zero, not unknown.
    for col in ("gpu_kernels", "graph_launches", "eager_between", "gpu_kernel_ns"):
        out[col] = out[col].fillna(0.0)
    return out, notes


# ---- gap heuristic --------------------------------------------------------------------------
def gap_steps(db: NsysDb, gap_ns: int) -> tuple[pd.DataFrame, list[str]]:
    """Steps of each process (or device) from idle gaps in its GPU work; heuristic.

    Only the columns the split needs are read (group, start, end; the graph launch id only when
    the export can hold graph kernels; the device only when GPU_METRICS needs it), since moving
    values out of SQLite is what this costs. Returns one row per step: group, step,
    :data:`AGG_COLUMNS`; and notes.
    """
    notes: list[str] = []
    kcols = db.columns(KERNEL)
    group = "globalPid" if "globalPid" in kcols else "deviceId"
    if group == "deviceId":
        notes.append("kernel table has no globalPid: steps split per device")
    _, graph_names = launch_names(db)
    node_graphs = "graphId" in kcols and (bool(graph_names) or not db.has(RUNTIME)) and bool(
        db.scalar(f"SELECT 1 FROM {KERNEL} WHERE graphId IS NOT NULL LIMIT 1"))
    want_dev = db.has("GPU_METRICS") or group == "deviceId"
    cols = [f"IFNULL({group}, -1)", "start", '"end"',
            "CASE WHEN graphId IS NULL THEN -1 ELSE correlationId END" if node_graphs else None,
            "deviceId" if want_dev else None]
    # Columns that would be constant are not fetched: moving values out of SQLite is the cost.
    got = fetch_columns(db, f"SELECT {', '.join(c for c in cols if c)} FROM {KERNEL}", n_cols=sum(map(bool, cols)))
    it = iter(got)
    grp, start, end, gkey, dev = (next(it) if c else None for c in cols)
    n_kernels = len(start)
    del got, it
    if db.has(GRAPH_TRACE):
        gcols = db.columns(GRAPH_TRACE)
        ggroup = group if group in gcols else "deviceId"
        g = fetch_columns(db, f'SELECT IFNULL({ggroup}, -1), start, "end", correlationId, deviceId FROM {GRAPH_TRACE}',
                          n_cols=5)
        if len(g[0]):
            fill = lambda a: a if a is not None else np.full(n_kernels, -1, dtype=np.int64)  # noqa: E731
            grp, start, end, gkey, dev = (np.concatenate([fill(a), b]) for a, b in zip((grp, start, end, gkey, dev), g))
    frames = [_split_group(gid, idx, start, end, gkey, dev, n_kernels, gap_ns)
              for gid, idx in _group_rows(grp, start)]
    if not frames:
        return pd.DataFrame(columns=["group", "step"] + AGG_COLUMNS), notes
    return pd.concat(frames, ignore_index=True), notes


def _group_rows(grp: np.ndarray, start: np.ndarray):
    """``(group, row indices sorted by start)`` per group; rows are often already in time order."""
    for g in np.unique(grp):
        idx = np.flatnonzero(grp == g)
        if np.any(np.diff(start[idx]) < 0):
            idx = idx[np.argsort(start[idx], kind="stable")]
        yield g, idx


def _split_group(gid, idx, start, end, gkey, dev, n_kernels, gap_ns) -> pd.DataFrame:
    """Aggregates of one group's steps: its work items ``idx`` split on idle gaps."""
    st, en = start[idx], end[idx]
    step = split_on_gaps(st, en, gap_ns)
    n_steps = int(step[-1]) + 1
    heads = np.flatnonzero(np.diff(step, prepend=-1))
    if gkey is not None:
        launches, between = graph_counts(step, st.astype("float64"), gkey[idx], n_steps)
    else:
        launches = between = np.zeros(n_steps, dtype=np.int64)
    kernels = np.add.reduceat((idx < n_kernels).astype(np.int64), heads)
    device = dev[idx][heads].astype("float64") if dev is not None else np.full(n_steps, np.nan)
    return pd.DataFrame({
        "group": gid, "step": np.arange(n_steps),
        "gpu_kernels": kernels, "gpu_start_ns": st[heads], "gpu_end_ns": np.maximum.reduceat(en, heads),
        "gpu_kernel_ns": np.add.reduceat(en - st, heads),
        "graph_launches": launches, "eager_between": between,
        "device": np.where(device >= 0, device, np.nan),
    })


def runtime_graph_launches(db: NsysDb) -> int:
    """How many graph launch calls the runtime table records (0 if it cannot tell)."""
    if not db.has(RUNTIME) or "nameId" not in db.columns(RUNTIME):
        return 0
    _, graph = launch_names(db)
    if not graph:  # no graph launch name was ever interned: nothing to count
        return 0
    marks = ",".join("?" * len(graph))
    return int(db.scalar(f"SELECT count(*) FROM {RUNTIME} WHERE nameId IN ({marks})", tuple(graph)) or 0)


# ---- GPU_METRICS ----------------------------------------------------------------------------
def sm_active_samples(db: NsysDb) -> tuple[pd.DataFrame, str | None]:
    """SM-activity samples (gpu, t_ns, ratio 0..1) under whichever name the export uses."""
    cols = db.columns("TARGET_INFO_GPU_METRICS")
    if not db.has("GPU_METRICS") or not {"typeId", "metricId", "metricName"} <= cols:
        return pd.DataFrame(columns=["gpu", "t_ns", "value"]), None
    marks = ",".join("?" * len(SM_ACTIVE_NAMES))
    names = [r[0] for r in db.conn.execute(
        f"SELECT DISTINCT metricName FROM TARGET_INFO_GPU_METRICS WHERE metricName IN ({marks})", SM_ACTIVE_NAMES)]
    if not names:
        return pd.DataFrame(columns=["gpu", "t_ns", "value"]), None
    # Join on typeId and metricId both: metricId alone is not unique across GPUs/metric sets.
    names_sql = ", ".join("'" + n.replace("'", "''") + "'" for n in names)
    gpu, t, v = fetch_columns(db, f"""
        SELECT g.typeId & 255, g.timestamp, CAST(g.value AS INTEGER) FROM GPU_METRICS g
        JOIN TARGET_INFO_GPU_METRICS t ON t.typeId = g.typeId AND t.metricId = g.metricId
        WHERE t.metricName IN ({names_sql}) AND g.timestamp >= 0""", n_cols=3)
    df = pd.DataFrame({"gpu": gpu, "t_ns": t, "value": v / 100.0})
    return df.sort_values(["gpu", "t_ns"], kind="stable").reset_index(drop=True), names[0]


def window_means(samples: pd.DataFrame, gpu: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Mean sample value inside each [t0, t1] window of each window's GPU (NaN where none).

    A GPU id the samples do not know falls back to the only GPU sampled, if there is one.
    """
    out = np.full(len(t0), np.nan)
    if samples.empty:
        return out
    gpus = samples["gpu"].unique()
    for g in gpus:
        s = samples[samples["gpu"] == g]
        sel = (gpu == g) | (len(gpus) == 1)
        if not sel.any():
            continue
        t = s["t_ns"].to_numpy()
        csum = np.concatenate([[0.0], np.cumsum(s["value"].to_numpy())])
        lo = np.searchsorted(t, t0[sel], side="left")
        hi = np.searchsorted(t, t1[sel], side="right")
        n = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            out[sel] = np.where(n > 0, (csum[hi] - csum[lo]) / np.maximum(n, 1), np.nan)
    return out
