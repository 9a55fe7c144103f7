"""GPU work of an Nsight Systems export, per step: kernels, graph launches, SM activity.

Two ways to give each kernel its step:

* :func:`project` - NVTX step ranges exist. NVIDIA's projection rule (``nvtx_gpu_proj_trace``,
  ``nvtx_kern_sum``): a kernel belongs to the range whose thread issued its launch call inside the
  range; the call is found by ``correlationId`` *and* the process (``globalPid = globalTid &
  ~0xFFFFFF``), since correlation ids repeat across processes. SQLite filters the launch calls;
  calls and kernels come out as column batches and are matched with sorted numpy keys.
* :func:`gap_steps` - no step ranges. Kernels (and graph-trace rows) come out as column batches
  and are split where the GPU idled longer than a gap; heuristic.

Columns leave SQLite in batches (:func:`fetch_columns`), never as one Python object per row.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.collectors.traces.nsys.db import GRAPH_TRACE, KERNEL, PID_MASK, RUNTIME, NsysDb
from mixdiag.collectors.traces.steps.reconstruct import graph_counts, split_on_gaps
from mixdiag.errors import UserError

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


def fetch_columns(db: NsysDb, sql: str, n_cols: int, progress=None) -> list[np.ndarray]:
    """Run ``sql`` (integer columns, no NULLs) and return its columns as int64 arrays.

    Rows stream in batches either way. With ``adbc-driver-sqlite`` the batches are Arrow
    columns built in C; without it, ``sqlite3`` cursor chunks (every value becomes a Python
    object first, several times slower). ``progress(rows)`` is called after each batch.
    """
    conn = db.arrow_connection()
    if conn is not None:
        try:
            return _fetch_arrow(conn, sql, n_cols, progress)
        except Exception:  # noqa: BLE001  the driver refused (odd types, damaged pages): sqlite3 decides
            db.disable_arrow()
    cur = db.conn.execute(sql)
    parts = []
    while True:
        rows = cur.fetchmany(CHUNK_ROWS)
        if not rows:
            break
        if progress:
            progress(len(rows))
        try:
            parts.append(np.array(rows, dtype=np.int64).reshape(len(rows), n_cols))
        except (ValueError, TypeError, OverflowError):
            raise UserError(f"{db.path}: damaged export (non-integer values where integers belong: "
                            f"{next(r for r in rows if not all(isinstance(v, (int, float)) for v in r))!r:.80})"
                            ) from None
    arr = np.concatenate(parts) if parts else np.zeros((0, n_cols), dtype=np.int64)
    return [np.ascontiguousarray(arr[:, i]) for i in range(n_cols)]


def _fetch_arrow(conn, sql: str, n_cols: int, progress=None) -> list[np.ndarray]:
    cols: list[list[np.ndarray]] = [[] for _ in range(n_cols)]
    with conn.cursor() as cur:
        # Larger batches than the driver's default 1024 rows: fewer Python round trips per column.
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(CHUNK_ROWS)})
        cur.execute(sql)
        for batch in cur.fetch_record_batch():
            for i in range(n_cols):
                cols[i].append(batch.column(i).to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
            if progress:
                progress(batch.num_rows)
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in cols]


# ---- NVTX projection ------------------------------------------------------------------------
def project(db: NsysDb, ranges: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Per step range (row order of ``ranges``): kernels launched inside it and how it launched.

    Returns a frame indexed like ``ranges`` with :data:`AGG_COLUMNS` and notes.
    """
    notes: list[str] = []
    n = len(ranges)
    out = pd.DataFrame(np.nan, index=range(n), columns=AGG_COLUMNS)
    if not db.has(RUNTIME) or not {"globalTid", "correlationId", "nameId"} <= db.columns(RUNTIME):
        notes.append("no CUPTI_ACTIVITY_KIND_RUNTIME table: kernels cannot be projected onto NVTX steps")
        return out, notes
    kern, graph = launch_names(db)
    for col in ("gpu_kernels", "graph_launches", "eager_between", "gpu_kernel_ns"):
        out[col] = 0.0  # a step without a launch call launched nothing: zero, not unknown
    if not (kern or graph) or n == 0:
        return out, notes
    # Launch calls on the step ranges' threads (ids are integers read from the export itself).
    ids = ",".join(str(int(i)) for i in list(kern) + list(graph))
    tids = ",".join(str(int(t)) for t in ranges["tid"].unique())
    tid, start, end, corr, name = fetch_columns(
        db, f'SELECT globalTid, start, "end", IFNULL(correlationId, -1), nameId FROM {RUNTIME} '
            f"WHERE nameId IN ({ids}) AND globalTid IN ({tids})", n_cols=5)
    step = _enclosing_range(ranges, tid, start, end)
    keep = step >= 0
    tid, start, corr, name, step = tid[keep], start[keep], corr[keep], name[keep], step[keep]
    is_graph = np.isin(name, np.fromiter(graph, dtype=np.int64, count=len(graph)))
    launches, between = graph_counts(step, start.astype("float64"), np.where(is_graph, corr, -1), n)
    out["graph_launches"], out["eager_between"] = launches.astype("float64"), between.astype("float64")

    # GPU work of those launches: same correlation id in the same process (NVIDIA's rule 2).
    kcols = db.columns(KERNEL)
    has_pid = "globalPid" in kcols
    if not has_pid:
        notes.append("kernel table has no globalPid: kernels joined to launches by correlationId alone")
    launch_key = _keys(tid & PID_MASK if has_pid else np.zeros_like(tid), corr)
    order = np.argsort(launch_key, kind="stable")
    launch_key, launch_step = launch_key[order], step[order]
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    busy = np.zeros(n)
    count = np.zeros(n)
    device = np.full(n, np.nan)
    sources = [(KERNEL, kcols, True)]
    if db.has(GRAPH_TRACE):
        sources.append((GRAPH_TRACE, db.columns(GRAPH_TRACE), False))
    for table, cols, is_kernel in sources:
        pid_col = "IFNULL(globalPid, -1)" if has_pid and "globalPid" in cols else "0"
        # The device is only needed to pick a GPU's SM-activity samples.
        dev_col = ", deviceId" if db.has("GPU_METRICS") else ""
        got = fetch_columns(db, f'SELECT {pid_col}, IFNULL(correlationId, -1), start, "end"{dev_col} FROM {table}',
                            n_cols=5 if dev_col else 4)
        gp, kc, ks, ke = got[:4]
        kd = got[4] if dev_col else None
        if len(launch_key) == 0:
            continue
        work_key = _keys(gp, kc)
        pos = np.minimum(np.searchsorted(launch_key, work_key), len(launch_key) - 1)
        hit = (launch_key[pos] == work_key) & (kc >= 0)  # a missing correlation id matches nothing
        st = launch_step[pos[hit]]
        np.minimum.at(first, st, ks[hit])
        np.maximum.at(last, st, ke[hit])
        busy += np.bincount(st, weights=(ke - ks)[hit], minlength=n)
        if is_kernel:
            count += np.bincount(st, minlength=n)
        if kd is not None:
            device[st] = kd[hit]
    seen = np.isfinite(first)
    out["gpu_kernels"] = count
    out["gpu_kernel_ns"] = busy
    out["gpu_start_ns"] = np.where(seen, first, np.nan)
    out["gpu_end_ns"] = np.where(seen, last, np.nan)
    out["device"] = device
    return out, notes


def _keys(gpid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """One int64 per (process, correlation id): the 24 PID bits above a 32-bit correlation id
    (CUPTI correlation ids are 32-bit)."""
    return ((gpid >> 24) & 0xFFFFFF) << 32 | (corr & 0xFFFFFFFF)


def _enclosing_range(ranges: pd.DataFrame, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Row of ``ranges`` whose range holds each call fully on the same thread (NVIDIA's rule 1), or -1."""
    out = np.full(len(tid), -1, dtype=np.int64)
    for t, rows in ranges.groupby("tid").groups.items():
        r = ranges.loc[rows].sort_values("start_ns")
        rs, re_, ri = r["start_ns"].to_numpy(), r["end_ns"].to_numpy(), r.index.to_numpy()
        sel = np.flatnonzero(tid == t)
        pos = np.searchsorted(rs, start[sel], side="right") - 1
        ok = (pos >= 0) & (end[sel] <= re_[np.clip(pos, 0, None)])
        out[sel[ok]] = ri[pos[ok]]
    return out


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
            "CASE WHEN graphId IS NULL THEN -1 ELSE IFNULL(correlationId, -1) END" if node_graphs else None,
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
        g = fetch_columns(db, f'SELECT IFNULL({ggroup}, -1), start, "end", IFNULL(correlationId, -1), deviceId '
                             f"FROM {GRAPH_TRACE}",
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
