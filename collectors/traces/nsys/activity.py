"""Read an Nsight Systems export into a :class:`..steps.foreign.Activity` (column batches).

Kernels, graph-trace rows and copies (with bytes and direction), the runtime calls that launch,
copy or synchronise, and the ranges named in :mod:`..steps.ranges`. Kernel names are classified once
per ``StringIds`` entry (prefill/decode attention family, comm, transfer), then looked up per row.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.collectors.traces.steps import ranges as sr
from mixdiag.collectors.traces.steps.kernel_names import kernel_flags
from mixdiag.collectors.traces.steps.foreign import GRAPH_LAUNCH, LAUNCH, MEMCPY, SYNC, Activity, Calls, Items
from mixdiag.collectors.traces.nsys.db import GRAPH_TRACE, KERNEL, NVTX, PID_MASK, RUNTIME, STRINGS, NsysDb
from mixdiag.collectors.traces.nsys.kernels import fetch_columns, launch_names
from mixdiag.collectors.traces.nsys.nvtx import message_sql, range_types

MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
_EMPTY = np.zeros(0, dtype=np.int64)


def _flags(db: NsysDb) -> np.ndarray:
    """Flag per StringIds id: 1 prefill family, 2 decode family, 4 comm, 8 transfer kernel, 16 EP exchange."""
    if not db.has(STRINGS):
        return np.zeros(1, dtype=np.int64)
    top = int(db.scalar(f"SELECT max(id) FROM {STRINGS}") or 0)
    flags = np.zeros(top + 2, dtype=np.int64)  # the last entry: sentinel 0 for missing names (-1)
    for i, s in db.conn.execute(f"SELECT id, value FROM {STRINGS}"):
        if not s or i is None or i < 0:
            continue
        flags[i] = kernel_flags(s)
    return flags


def _lookup(flags: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Flag of each string id in one pass: ``flags`` ends with a 0 sentinel that the missing
    ids (-1) reach by wrapping; ids past the table (a damaged export) are checked separately."""
    if len(ids) and (int(ids.max()) >= len(flags) - 1 or int(ids.min()) < -1):
        ok = (ids >= 0) & (ids < len(flags))
        return np.where(ok, flags[np.where(ok, ids, 0)], 0)
    return np.take(flags, ids, mode="wrap")


def kernel_sql(db: NsysDb) -> tuple[str, int]:
    """The kernel-table query (process, times, device, stream, correlation, graph flag, name ids)
    and its column count; benchmarks/bench_nsys.py scans the same query bare."""
    kcols = db.columns(KERNEL)
    grp_col = "IFNULL(globalPid, -1)" if "globalPid" in kcols else "deviceId"
    names = [c for c in ("shortName", "demangledName") if c in kcols] or ["-1"]
    graph = "CASE WHEN graphId IS NULL THEN 0 ELSE 1 END" if "graphId" in kcols else "0"
    sql = (f'SELECT {grp_col}, start, "end", deviceId, IFNULL(streamId, -1), IFNULL(correlationId, -1), {graph}, '
           + ", ".join(f"IFNULL({n}, -1)" for n in names) + f" FROM {KERNEL}")
    return sql, 7 + len(names)


def read_activity(db: NsysDb, progress=None, step_names: tuple[str, ...] = ()) -> Activity:
    """Everything the foreign-step reconstruction needs, as int64 column arrays; ``step_names``:
    range names that mark steps besides the known table (``--step-range``)."""
    notes: list[str] = []
    kcols = db.columns(KERNEL)
    grp_col = "IFNULL(globalPid, -1)" if "globalPid" in kcols else "deviceId"
    flags = _flags(db)
    parts, name_ids = [], []
    if db.has(KERNEL):
        sql, n_cols = kernel_sql(db)
        cols = fetch_columns(db, sql, n_cols=n_cols, progress=progress)
        g, s, e, d, st, c, gr = cols[:7]
        f = np.zeros(len(s), dtype=np.int64)
        for ids in cols[7:]:
            f |= _lookup(flags, ids)
        parts.append((g, s, e, d, st, c, np.zeros_like(s), np.zeros_like(s), np.zeros_like(s), f, gr))
        name_ids.append(cols[7] if len(cols) > 7 else np.full(len(s), -1, dtype=np.int64))  # shortName first
    if db.has(GRAPH_TRACE):
        gc = db.columns(GRAPH_TRACE)
        gg = "IFNULL(globalPid, -1)" if "globalPid" in gc and "globalPid" in kcols else "deviceId"
        g, s, e, d, st, c = fetch_columns(db, f'SELECT {gg}, start, "end", deviceId, IFNULL(streamId, -1), '
                                              f"IFNULL(correlationId, -1) FROM {GRAPH_TRACE}", n_cols=6, progress=progress)
        z = np.zeros_like(s)
        parts.append((g, s, e, d, st, c, z + 1, z, z, z, z + 1))
        name_ids.append(z - 1)
    if db.has(MEMCPY_TABLE):
        mc = db.columns(MEMCPY_TABLE)
        mg = "IFNULL(globalPid, -1)" if "globalPid" in mc and "globalPid" in kcols else "deviceId"
        g, s, e, d, st, c, b, k = fetch_columns(
            db, f'SELECT {mg}, start, "end", deviceId, IFNULL(streamId, -1), IFNULL(correlationId, -1), '
                f"IFNULL(bytes, 0), IFNULL(copyKind, 0) FROM {MEMCPY_TABLE}", n_cols=8, progress=progress)
        z = np.zeros_like(s)
        parts.append((g, s, e, d, st, c, z + 2, b, k, z, z))
        name_ids.append(z - 1)
    arrays = [np.concatenate([p[i] for p in parts]) if parts else _EMPTY for i in range(11)]
    items = Items(*arrays)
    ids = np.concatenate(name_ids) if name_ids else _EMPTY
    return Activity(items, _calls(db), _ranges(db, step_names), notes, item_name=ids, names=_names(db, ids))


def _names(db: NsysDb, ids: np.ndarray) -> dict:
    """``StringIds`` value of each distinct kernel name id in ``ids`` (a few hundred, not one per row)."""
    used = np.unique(ids[ids >= 0]) if len(ids) else _EMPTY
    if not len(used) or not db.has(STRINGS):
        return {}
    out = {}
    for lo in range(0, len(used), 900):  # SQLite's bound-parameter limit
        chunk = [int(i) for i in used[lo:lo + 900]]
        out.update(db.conn.execute(f"SELECT id, value FROM {STRINGS} WHERE id IN ({','.join('?' * len(chunk))})",
                                   chunk).fetchall())
    return out


def _calls(db: NsysDb) -> Calls | None:
    if not db.has(RUNTIME) or not db.has(STRINGS) or not {"globalTid", "correlationId", "nameId"} <= db.columns(RUNTIME):
        return None
    kern, graph = launch_names(db)
    memcpy = db.string_ids(" OR ".join("value LIKE ?" for _ in sr.MEMCPY_CALL_LIKE), sr.MEMCPY_CALL_LIKE)
    sync = db.string_ids(" OR ".join("value LIKE ?" for _ in sr.SYNC_CALL_LIKE), sr.SYNC_CALL_LIKE)
    what = {}
    for ids, w in ((kern, LAUNCH), (graph, GRAPH_LAUNCH), (memcpy, MEMCPY), (sync, SYNC)):
        what.update({int(i): w for i in ids})
    if not what:
        return None
    ids = ",".join(str(i) for i in what)
    tid, s, e, c, name = fetch_columns(db, f'SELECT globalTid, start, "end", IFNULL(correlationId, -1), nameId '
                                           f"FROM {RUNTIME} WHERE nameId IN ({ids})", n_cols=5)
    keys = np.fromiter(what.keys(), dtype=np.int64)
    vals = np.fromiter(what.values(), dtype=np.int64)
    o = np.argsort(keys)
    w = vals[o][np.searchsorted(keys[o], name)]
    return Calls(tid & PID_MASK, tid, s, e, c, w)


def _ranges(db: NsysDb, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    empty = pd.DataFrame({"grp": _EMPTY, "tid": _EMPTY, "start": _EMPTY, "end": _EMPTY, "name": [], "transfer": []})
    if not db.has(NVTX) or not {"start", "end", "eventType", "globalTid"} <= db.columns(NVTX):
        return empty
    msg, join = message_sql(db)
    types = range_types(db)
    step_names = sr.ENGINE_STEP_NAMES + tuple(extra)
    likes = ["%nixl%", "%ucx%", "%mooncake%", "%kv%transfer%", "%kv%connector%", "%kv%load%", "%kv_layer%",
             "%send_kv%", "%recv_kv%"]
    sql = (f'SELECT n.start, n."end", n.globalTid, {msg} AS msg FROM {NVTX} n {join} '
           f"WHERE n.eventType IN ({','.join('?' * len(types))}) AND n.\"end\" IS NOT NULL "
           f"AND (msg IN ({','.join('?' * len(step_names))}) OR " + " OR ".join("msg LIKE ?" for _ in likes) + ")")
    rows = db.conn.execute(sql, (*types, *step_names, *likes)).fetchall()
    if not rows:
        return empty
    rows = [r for r in rows if None not in r]
    if not rows:
        return empty
    start, end, tid, name = zip(*rows)
    codes, uniq = pd.factorize(pd.Series(name, dtype=object))
    names = np.array([str(u).strip() for u in uniq], dtype=object)  # per distinct name, not per row
    xfer = np.array([bool(sr.TRANSFER_RANGE_RE.search(u)) and u not in step_names for u in names], dtype=bool)
    tid = np.array(tid, dtype=np.int64)
    return pd.DataFrame({"grp": tid & PID_MASK, "tid": tid, "start": np.array(start, dtype=np.int64),
                         "end": np.array(end, dtype=np.int64), "name": names[codes], "transfer": xfer[codes]})
