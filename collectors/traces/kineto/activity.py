"""Read Kineto (PyTorch profiler) events into a :class:`..steps.foreign.Activity` (column arrays).

Kineto's shapes (pytorch/kineto ``output_json.cpp``): CPU rows carry the OS ``pid``/``tid``; GPU
rows use ``pid`` = device and ``tid`` = stream, with ``args.device``/``args.stream``. Runtime calls
(``cuda_runtime``/``cuda_driver``) and GPU work (``kernel``, ``gpu_memcpy``) share
``args.correlation``; copies carry ``args.bytes`` and their direction in the name
(``Memcpy HtoD (Pinned -> Device)``). Kernels replayed from a CUDA graph appear one by one under
the ``cudaGraphLaunch`` correlation id (Kineto has no graph-level rows), so a kernel is a graph
node when its launch call is a graph launch. Every item's process is its launch call's process.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from mixdiag.collectors.traces.steps import ranges as sr
from mixdiag.collectors.traces.steps.kernel_names import kernel_flags
from mixdiag.collectors.traces.steps.foreign import GRAPH_LAUNCH, LAUNCH, MEMCPY, SYNC, Activity, Calls, Items

RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "runtime", "driver")
KERNEL_CATS = ("kernel",)
COPY_CATS = ("gpu_memcpy", "memcpy")
RANGE_CATS = ("user_annotation",)
_COPY_KINDS = {"htod": 1, "dtoh": 2, "dtod": 8, "ptop": 10}
_COPY_RE = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP)\b", re.I)
_CALLS = ((re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)"), GRAPH_LAUNCH),
          (re.compile(r"^(cuda|cu)Launch\w*Kernel"), LAUNCH),
          (re.compile(r"^(cudaMemcpy|cuMemcpy)"), MEMCPY),
          (re.compile("^(" + "|".join(p.rstrip("%") for p in sr.SYNC_CALL_LIKE) + ")"), SYNC))
_EMPTY = np.zeros(0, dtype=np.int64)


def _by_name(names: pd.Series, fn, dtype=np.int64) -> np.ndarray:
    """``fn`` applied once per distinct name (not per row)."""
    codes, uniq = pd.factorize(names)
    table = np.array([fn(u) for u in uniq], dtype=dtype) if len(uniq) else np.zeros(0, dtype=dtype)
    return table[codes] if len(codes) else np.zeros(0, dtype=dtype)


def _call_kind(name: str) -> int:
    for rx, what in _CALLS:
        if rx.match(name):
            return what
    return -1


def _copy_kind(name: str) -> int:
    m = _COPY_RE.search(name)
    return _COPY_KINDS[m.group(1).lower()] if m else 0


def _ints(col: pd.Series) -> np.ndarray:
    """Numeric ids (strings such as ``"stream 7"`` keep their digits; others become -1)."""
    v = pd.to_numeric(col, errors="coerce")
    if v.isna().any():
        digits = col.astype(str).str.extract(r"(-?\d+)", expand=False)
        v = v.fillna(pd.to_numeric(digits, errors="coerce"))
    return v.fillna(-1).to_numpy(dtype=np.int64)


def read_activity(df: pd.DataFrame, base_ns: int, *, group_base: int = 0,
                  range_names: tuple[str, ...] = ()) -> tuple[Activity, dict[int, int]]:
    """Activity of one Kineto file's event frame (``name, cat, t0_us, t1_us, pid, tid, corr, dev,
    stream, bytes``); times become ns on ``base_ns``. Groups are ``group_base + pid`` so several
    rank files can be concatenated; returns the activity and ``{group: pid}``."""
    cat = df["cat"].str.lower()
    ns = lambda col: base_ns + np.round(df.loc[sel, col].to_numpy(dtype="float64") * 1000).astype(np.int64)  # noqa: E731

    sel = cat.isin(RUNTIME_CATS).to_numpy().copy()
    what = _by_name(df.loc[sel, "name"], _call_kind)
    keep = what >= 0
    sel[np.flatnonzero(sel)[~keep]] = False
    what = what[keep]
    c_pid = _ints(df.loc[sel, "pid"])
    calls = Calls(group_base + c_pid, _ints(df.loc[sel, "tid"]), ns("t0_us"), ns("t1_us"),
                  df.loc[sel, "corr"].to_numpy(dtype=np.int64), what)
    pids, counts = np.unique(c_pid, return_counts=True)
    main_pid = int(pids[np.argmax(counts)]) if len(pids) else None

    parts, name_parts = [], []
    for cats, kind in ((KERNEL_CATS, 0), (COPY_CATS, 2)):
        sel = cat.isin(cats).to_numpy().copy()
        if not sel.any():
            continue
        sub = df.loc[sel]
        s, e = ns("t0_us"), ns("t1_us")
        dev = np.where(sub["dev"].to_numpy() >= 0, sub["dev"].to_numpy(), _ints(sub["pid"]))
        stream = np.where(sub["stream"].to_numpy() >= 0, sub["stream"].to_numpy(), _ints(sub["tid"]))
        z = np.zeros(len(s), dtype=np.int64)
        if kind == 0:
            flags, nbytes, ckind = _by_name(sub["name"], kernel_flags), z, z
        else:
            flags, nbytes, ckind = z, sub["bytes"].to_numpy(dtype=np.int64), _by_name(sub["name"], _copy_kind)
        parts.append((s, e, dev, stream, sub["corr"].to_numpy(dtype=np.int64), z + kind, nbytes, ckind, flags))
        name_parts.append(sub["name"].to_numpy(dtype=object) if kind == 0 else np.full(len(s), None, dtype=object))
    cols = [np.concatenate([p[i] for p in parts]) if parts else _EMPTY for i in range(9)]
    s, e, dev, stream, corr, kind, nbytes, ckind, flags = cols

    # process and graph membership from the launch call with the same correlation id
    grp = np.full(len(s), -1 if main_pid is None else group_base + main_pid, dtype=np.int64)
    graph = np.zeros(len(s), dtype=np.int64)
    if len(calls.corr):
        o = np.argsort(calls.corr, kind="stable")
        pos = np.clip(np.searchsorted(calls.corr[o], corr), 0, len(o) - 1)
        hit = (calls.corr[o][pos] == corr) & (corr >= 0)
        grp = np.where(hit, calls.grp[o][pos], grp)
        graph = np.where(hit & (kind == 0) & (calls.what[o][pos] == GRAPH_LAUNCH), 1, 0)
    if main_pid is None:  # no launch calls at all: one group per device, as Nsight without processes
        grp = group_base + dev
    items = Items(grp, s, e, dev, stream, corr, kind, nbytes, ckind, flags, graph)
    groups = {int(g): int(g - group_base) for g in np.unique(grp)}
    codes, uniq = pd.factorize(pd.Series(np.concatenate(name_parts) if name_parts else np.zeros(0, dtype=object)))
    return Activity(items, calls if len(calls.start) else None, _ranges(df, cat, base_ns, group_base, range_names),
                    item_name=codes.astype(np.int64), names=dict(enumerate(map(str, uniq)))), groups


def _ranges(df: pd.DataFrame, cat: pd.Series, base_ns: int, group_base: int, names) -> pd.DataFrame:
    sel = cat.isin(RANGE_CATS).to_numpy()
    ann = df.loc[sel]
    name = ann["name"].astype(str).str.strip()
    transfer = _by_name(name, lambda x: bool(sr.TRANSFER_RANGE_RE.search(x)), dtype=bool) & ~name.isin(names).to_numpy()
    keep = name.isin(names).to_numpy() | transfer
    ann, name = ann[keep], name[keep]
    return pd.DataFrame({
        "grp": group_base + _ints(ann["pid"]), "tid": _ints(ann["tid"]),
        "start": base_ns + np.round(ann["t0_us"].to_numpy(dtype="float64") * 1000).astype(np.int64),
        "end": base_ns + np.round(ann["t1_us"].to_numpy(dtype="float64") * 1000).astype(np.int64),
        "name": name.to_numpy(), "transfer": transfer[keep]})


def concat(acts: list[Activity]) -> Activity:
    """One activity of several rank files (their groups already distinct)."""
    if len(acts) == 1:
        return acts[0]
    items = Items(**{k: np.concatenate([getattr(a.items, k) for a in acts]) for k in acts[0].items.__dict__})
    calls = [a.calls for a in acts if a.calls is not None]
    calls = Calls(**{k: np.concatenate([getattr(c, k) for c in calls]) for k in calls[0].__dict__}) if calls else None
    names, ids, base = {}, [], 0  # each file's name codes shifted past the previous files'
    for a in acts:
        ids.append(np.where(a.item_name >= 0, a.item_name + base, -1))
        names.update({k + base: v for k, v in (a.names or {}).items()})
        base += len(a.names or {})
    return Activity(items, calls, pd.concat([a.ranges for a in acts], ignore_index=True), sum((a.notes for a in acts), []),
                    item_name=np.concatenate(ids), names=names)
