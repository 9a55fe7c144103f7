"""An :class:`.foreign.Activity` -> the Timeline's ``activity`` frame (:mod:`mixdiag.device_activity`).

Shared by the Nsight and Kineto readers. Each item's launch time is the start of the runtime call
with the same correlation id in the same process (CUPTI links the two by ``correlationId``; Nsight's
projection rule, formats.md §3); its step is the one the reconstruction (or the NVTX projection)
gave it. Source names stop here: the kernel-name classification (comm or compute) is the
collectors' table :mod:`.ranges`, turned into the ``role`` column.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag import device_activity as da
from mixdiag.collectors.traces.steps.foreign import Activity

#: CUPTI_ACTIVITY_MEMCPY_KIND ids (ENUM_CUDA_MEMCPY_OPER; Kineto names map to the same ids)
_COPY = {1: "H2D", 2: "D2H", 8: "D2D", 10: "P2P"}
_COPY_NAMES = ("other",) + tuple(_COPY.values())


def _pair_keys(grp_a: np.ndarray, corr_a: np.ndarray, grp_b: np.ndarray, corr_b: np.ndarray):
    """One int64 per (process, correlation id) for two arrays on a shared process coding."""
    codes, _ = pd.factorize(np.concatenate([grp_a, grp_b]))
    codes = codes.astype(np.int64)
    ka = codes[:len(grp_a)] << 32 | (corr_a & 0xFFFFFFFF)
    kb = codes[len(grp_a):] << 32 | (corr_b & 0xFFFFFFFF)
    return ka, kb


def launch_index(act: Activity) -> np.ndarray:
    """Row of ``act.calls`` that issued each item (same process and correlation id), -1 when none."""
    it = act.items
    out = np.full(len(it.start), -1, dtype=np.int64)
    if act.calls is None or not len(act.calls.start) or not len(it.start):
        return out
    kc, ki = _pair_keys(act.calls.grp, act.calls.corr, it.grp, it.corr)
    if len(kc) and kc.min() >= 0 and kc.max() < 8 * (len(kc) + len(ki)) + 1024:
        # one process with dense correlation ids (the usual export): a direct table, no sort. Only
        # when no key repeats, so "the call of a key" is one row as on the sorted path below.
        table = np.full(int(kc.max()) + 2, -1, dtype=np.int64)
        if np.bincount(kc).max() <= 1:
            table[kc] = np.arange(len(kc))
            got = table[np.where((ki >= 0) & (ki <= kc.max()), ki, len(table) - 1)]
            return np.where(it.corr >= 0, got, -1)
    order = np.argsort(kc, kind="stable")
    pos = np.clip(np.searchsorted(kc[order], ki), 0, len(order) - 1)
    hit = (kc[order][pos] == ki) & (it.corr >= 0)
    out[hit] = order[pos[hit]]
    return out


def activity_frame(act: Activity, item_step: np.ndarray, instance_of: dict, job: str, offset_ns: int,
                   comm_flag: int = 4) -> tuple[pd.DataFrame, list[str]]:
    """The activity frame of the items whose process has an instance (``instance_of``: group -> name),
    times moved onto the Timeline clock by ``offset_ns``; and notes (rows left out, launches unknown)."""
    it = act.items
    notes: list[str] = []
    if not len(it.start) or not instance_of:
        return da.empty(), notes
    groups = np.fromiter(instance_of.keys(), dtype=np.int64)
    keep = np.isin(it.grp, groups)
    if not keep.all():
        notes.append(f"{int((~keep).sum())} device rows of processes without steps are not in the breakdown")
    li = launch_index(act)
    sel = slice(None) if keep.all() else np.flatnonzero(keep)  # all kept (the usual case): views, no copies
    what = it.what[sel]
    call = li[sel]
    n = len(what)
    launch = np.full(n, da.NO_LAUNCH, dtype=np.int64)
    if (call >= 0).any():
        launch[call >= 0] = act.calls.start[call[call >= 0]] + offset_ns
    kern = what == 0
    if kern.any() and (call[kern] < 0).all():
        notes.append("no launch calls for the kernels (no runtime trace): GPU idle time cannot be split into "
                     "host and kernel wait")
    g_codes = np.searchsorted(np.sort(groups), it.grp[sel])
    inst_names = [instance_of[g] for g in np.sort(groups)]
    # role by lookup: what (0 kernel, 1 graph, 2 copy) x comm flag -> compute 0, comm 1, copy 2, opaque 3
    role = np.array([[0, 1], [3, 3], [2, 2]], dtype=np.int8)[what, (it.flags[sel] & comm_flag > 0).astype(np.intp)]
    kind = what.astype(np.int8)  # 0 kernel, 1 graph, 2 memcpy: the Items' own coding is KINDS' order
    lut = np.ones(16, dtype=np.int8)  # copyKind -> category code ('' 0, other 1, H2D 2, D2H 3, D2D 4, P2P 5)
    for i, k in enumerate(_COPY):
        lut[k] = 2 + i
    copy_code = np.where(what == 2, lut[np.clip(it.kind[sel], 0, 15)], 0).astype(np.int8)
    names = act.names or {}
    nid = act.item_name[sel] if act.item_name is not None else np.full(n, -1, dtype=np.int64)
    ncodes, nuniq = pd.factorize(nid)
    name_table = ["" if i < 0 else str(names.get(int(i), f"kernel #{int(i)}")) for i in nuniq]
    frame = pd.DataFrame({
        "instance": da.categorical(g_codes, inst_names),
        "job": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[job]),
        "device": it.dev[sel].astype(np.int32), "stream": it.stream[sel].astype(np.int32),
        "step": item_step[sel],
        "kind": pd.Categorical.from_codes(kind, categories=list(da.KINDS[:3])),
        "role": pd.Categorical.from_codes(role, categories=list(da.ROLES)),
        "name": da.categorical(ncodes, name_table),
        "t_start_ns": it.start[sel] + offset_ns, "t_end_ns": np.maximum(it.end[sel], it.start[sel]) + offset_ns,
        "launch_ns": launch.astype(np.int64),
        "bytes": np.where(what == 2, it.nbytes[sel], 0).astype(np.int64),
        "copy_kind": pd.Categorical.from_codes(copy_code, categories=[""] + list(_COPY_NAMES)),
    }, copy=False)  # the columns are this function's own arrays: no copy into consolidated blocks (~100 MB
    # of fresh pages at 2.5 M rows, a third of the frame's cost); ``step`` may be a view of ``item_step``
    return frame, notes
