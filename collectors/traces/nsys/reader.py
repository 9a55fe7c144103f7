"""Nsight Systems SQLite exports (``nsys export --type sqlite``, schema 3.2x) -> Timeline.

Steps come from mixdiag's NVTX ``step`` ranges (kind and token counts from the message,
docs/contracts.md §2); without them from an engine's own step range names, else from idle gaps
in the GPU work - both heuristic, and ``meta`` says so. Per step: the kernels it launched
(NVTX projection by correlationId + process), its CUDA-graph mode from what it launched, and SM
activity from ``GPU_METRICS`` when the capture sampled it. See :mod:`.db`,
:mod:`.nvtx`, :mod:`.kernels`.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from mixdiag.collectors.traces.nsys.db import GRAPH_TRACE, KERNEL, NVTX, RUNTIME, SQLITE_MAGIC, STRINGS, NsysDb, pid_of
from mixdiag.collectors.traces.nsys.kernels import (_enclosing_range, launch_names, project, runtime_graph_launches,
                                             sm_active_samples, window_means)
from mixdiag.collectors.traces.steps.activity_frame import activity_frame, launch_index
from mixdiag.collectors.traces.steps import frame as foreign_frame
from mixdiag.collectors.traces.steps.evidence import ep_ranks_basis, sm_rank_skew
from mixdiag.collectors.traces.steps.foreign import method_notes, reconstruct
from mixdiag.collectors.traces.nsys.activity import MEMCPY_TABLE, read_activity
from mixdiag.collectors.traces.nsys.nvtx import find_steps
from mixdiag.collectors.traces.steps.ranges import ENGINE_STEP_NAMES
from mixdiag.collectors.provenance import source_entry
from mixdiag.collectors.traces.steps.reconstruct import PHASE_COLUMNS, graph_modes
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

FORMAT = "nsys-sqlite"
EXTENSIONS = (".sqlite", ".sqlite3", ".db")


def sniff(head: bytes, name: str) -> bool:
    """An SQLite file (the first 16 bytes are SQLite's magic)."""
    return head.startswith(SQLITE_MAGIC)


#: Exports with at least this many GPU rows show a progress bar while their rows are read.
PROGRESS_MIN_ROWS = 500_000


def read(source, *, instance: str | None = None, step_gap_s: float | None = None, step_range: str | None = None,
         progress: bool | None = None, device_activity: bool = True, **options) -> Timeline:
    """Read one export. ``step_gap_s``: GPU idle time that separates steps in the gap heuristic
    (default: from the trace's gap distribution); ``step_range``: a range name that marks steps;
    ``progress``: a tqdm bar on stderr while GPU rows are read (default: when stderr is a terminal
    and the export holds >= :data:`PROGRESS_MIN_ROWS` rows); ``device_activity``: keep every kernel,
    graph row and copy in the Timeline's ``activity`` frame (the breakdown's input)."""
    path = Path(os.fspath(source))
    db = NsysDb(path)
    try:
        return _read(db, path, instance or path.stem.split(".")[0], step_gap_s, step_range, progress,
                     device_activity)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: truncated or corrupt SQLite export ({' '.join(str(e).split())[:200]})") from None
    finally:
        db.close()


def _bar(db: NsysDb, count_rows, progress: bool | None):
    """A tqdm bar over the export's GPU rows (``count_rows()``, counted only when a bar may show) on
    stderr, or None."""
    import sys

    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    rows = count_rows()
    if rows < (1 if progress else PROGRESS_MIN_ROWS):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=rows, desc=f"{db.path.name}: GPU rows", unit="rows", unit_scale=True, file=sys.stderr,
                leave=False, dynamic_ncols=True, mininterval=0.5)


def _read(db: NsysDb, path: Path, base: str, step_gap_s: float | None, step_range: str | None,
          progress: bool | None = None, keep_activity: bool = True) -> Timeline:
    if not (db.has(KERNEL) or db.has(NVTX) or db.has(RUNTIME)):
        raise UserError(f"{path}: not an Nsight Systems export (no {KERNEL}, {RUNTIME} or {NVTX} table)")
    clock, offset_s = db.clock()
    notes: list[str] = []
    partial = False
    if db.has(RUNTIME) and not db.has(STRINGS):
        partial = True
        notes.append("no StringIds table: API and kernel names cannot be resolved")
    nv = find_steps(db)
    notes += nv.notes
    has_kernels = db.has(KERNEL) and db.scalar(f"SELECT 1 FROM {KERNEL} LIMIT 1") is not None
    count_kernels = lambda: int(db.scalar(f"SELECT count(*) FROM {KERNEL}")) if has_kernels else 0  # noqa: E731
    graph_rows = int(db.scalar(f"SELECT count(*) FROM {GRAPH_TRACE}")) if db.has(GRAPH_TRACE) else 0
    cuda_traced = db.has(RUNTIME) and db.has(STRINGS) and bool(any(launch_names(db)))

    foreign = None
    act = None
    kernels_total = 0
    if nv.source == "nvtx-mixdiag" and not step_range:
        kernels_total = count_kernels()
        ranges = nv.ranges
        agg, n = project(db, ranges)
        notes += n
        if not db.has(RUNTIME) and kernels_total:
            partial = True
        steps = _nvtx_steps(ranges, agg, cuda_traced)
        step_source = nv.source
    elif has_kernels or graph_rows:
        bar = _bar(db, lambda: count_kernels() + graph_rows + (
            int(db.scalar(f"SELECT count(*) FROM {MEMCPY_TABLE}")) if db.has(MEMCPY_TABLE) else 0), progress)
        try:
            act = read_activity(db, progress=bar.update if bar else None,
                                step_names=(step_range,) if step_range else ())
        finally:
            if bar:
                bar.close()
        kernels_total = int((act.items.what == 0).sum())
        gap_ns = None if step_gap_s is None else int(round(float(step_gap_s) * 1e9))
        steps, n, step_source = reconstruct(act, step_range=step_range, gap_ns=gap_ns, range_names=ENGINE_STEP_NAMES)
        notes += n
        notes += method_notes(steps, step_range, step_source)
        host_graphs = runtime_graph_launches(db)
        graphs_visible = graph_rows > 0 or bool(len(steps) and steps["graph_launches"].sum() > 0)
        graph_known = (db.has(RUNTIME) or graphs_visible) and not (host_graphs and not graphs_visible)
        if not graph_known:
            notes.append(f"{host_graphs} graph launch calls but no graph GPU rows: graph mode unknown")
        foreign = {"graph_known": graph_known, "copies": db.has(MEMCPY_TABLE),
                   "multi": len(steps) and steps["group"].nunique() > 1}
        if len(steps):
            steps = foreign_frame.finish(steps, graph_known)
    else:
        kernels_total = count_kernels()
        steps = pd.DataFrame(columns=["group", "step"])
        step_source = None
        notes.append("no kernels and no step ranges in this export: nothing to build steps from")

    steps, names = _name_instances(steps, base)
    samples, sm_name = sm_active_samples(db)
    if len(steps):
        t0 = steps["gpu_start_ns"].fillna(steps["start_ns"]).to_numpy(dtype="float64")
        t1 = steps["gpu_end_ns"].fillna(steps["end_ns"]).to_numpy(dtype="float64")
        dev = steps["device"].fillna(-1).to_numpy(dtype="int64")
        steps["sm_active"] = np.clip(window_means(samples, dev, t0, t1), 0.0, 1.0)
        if foreign and foreign["multi"] and "opaque_ns" in steps:
            sm_rank_skew(steps)  # kernels hidden in graphs: the ranks' SM-busy asymmetry instead
            if steps["rank_sm_skew"].notna().any():
                steps["q_expert_imbalance"] = np.where(steps["rank_skew"].notna() | steps["rank_sm_skew"].notna(),
                                                       "inferred", "")
                notes.append("rank skew of graph-replayed steps from each rank's SM-busy time (GPU_METRICS); "
                             f"EP ranks by {ep_ranks_basis(steps)}")
        steps["t_start_s"] = steps["start_ns"].to_numpy(dtype="float64") / 1e9 + offset_s
        steps["t_end_s"] = steps["end_ns"].to_numpy(dtype="float64") / 1e9 + offset_s
    series = _series(samples, steps, base, offset_s)
    if sm_name:
        notes.append(f"SM activity from GPU_METRICS '{sm_name}'")

    in_steps = int(steps["gpu_kernels"].sum()) if len(steps) else 0
    unattributed = kernels_total - in_steps if step_source == "nvtx-mixdiag" else 0
    examples = list(nv.examples)
    if unattributed > 0 and step_source:
        examples.append(f"{unattributed} of {kernels_total} kernels launched outside any step range "
                        f"or without a matching runtime call")
    signals = {inst: _signals(step_source, cuda_traced, sm_name, nv.stats_fields, foreign, steps[steps["instance"] == inst])
               for inst in names}
    # "Lines" are rows: candidate NVTX ranges, kernels, graph-trace rows. Ignored = read but not
    # step material themselves (phase ranges folded into their steps, graph rows of NVTX steps).
    total = nv.rows_read + kernels_total + graph_rows
    parsed = (len(nv.ranges) if step_source == "nvtx-mixdiag" else 0) + in_steps + (graph_rows if foreign else 0)
    skipped = nv.skipped + unattributed
    entry = source_entry(
        FORMAT, path, total=total, parsed=parsed, skipped=skipped, lines_ignored=max(total - parsed - skipped, 0),
        examples=examples, partial=partial, notes=notes,
        step_source=step_source, heuristic=step_source not in (None, "nvtx-mixdiag"),
        **({"step_gap_ms": step_gap_s * 1e3} if step_gap_s is not None and step_source == "kernel-gaps" else {}),
        kernels_total=kernels_total, kernels_in_steps=in_steps, graph_trace_rows=graph_rows,
        projection="correlationId+process" if "globalPid" in db.columns(KERNEL) else "correlationId",
        instances=names, **db.export_info())
    activity = None
    if keep_activity and len(steps):
        if act is None:  # NVTX steps: the projection read no rows per kernel; read them now
            act = read_activity(db)
            act.item_step = nvtx_item_steps(act, nv.ranges)
        instance_of = dict(zip(steps["group"].to_numpy().tolist(), steps["instance"].tolist()))
        activity, n = activity_frame(act, act.item_step, instance_of, base, db.clock_ns())
        entry["notes"] += n
        entry["device_rows"] = len(activity)
    keep = [c for c in _STEP_COLUMNS if c in steps.columns]
    meta = {"clock": clock, "sources": [entry], "signals": signals, "partial": partial}
    return Timeline(steps[keep] if len(steps) else None, None, series, meta, activity)


def nvtx_item_steps(act, ranges: pd.DataFrame) -> np.ndarray:
    """Step of each item under NVIDIA's projection rule: the NVTX step range on the thread whose
    launch call (same process and correlation id) lies inside it; -1 when none."""
    out = np.full(len(act.items.start), -1, dtype=np.int64)
    li = launch_index(act)
    if not len(ranges) or not (li >= 0).any():
        return out
    has = np.flatnonzero(li >= 0)
    c = act.calls
    row = _enclosing_range(ranges.reset_index(drop=True), c.tid[li[has]], c.start[li[has]], c.end[li[has]])
    steps = ranges["step"].to_numpy(dtype=np.int64)
    out[has] = np.where(row >= 0, steps[np.maximum(row, 0)], -1)
    return out


_STEP_COLUMNS = ["instance", "step", "t_start_s", "t_end_s", "granularity", "kind", "prefill_tokens",
                 "decode_reqs", "decode_rows", "graph_mode", "graph_replayed", "sm_active", "schedule_s",
                 "prepare_s", "forward_s", "kv_transfer_s", "kv_transfer_bytes", "expert_imbalance",
                 "preempted_reqs", "gpu_kernels", "gpu_kernel_s", "graph_launches", "scheduled_tokens",
                 "step_source", "comm_s", "comm_share", "rank_skew", "rank_sm_skew", "rank_comm_spread", "kv_overlap_s", "kv_overlap_bytes", "kv_wait_s",
                 "device_idle_before_s", "q_token_allocation",
                 "q_graph_mode", "q_expert_imbalance", "q_kv_transfer", "q_sm_active"]


def _nvtx_steps(ranges: pd.DataFrame, agg: pd.DataFrame, cuda_traced: bool) -> pd.DataFrame:
    s = pd.concat([ranges.reset_index(drop=True), agg.reset_index(drop=True)], axis=1)
    s["group"] = s["gpid"]
    s["granularity"] = "step"
    for col in ("prefill_tokens", "decode_reqs", "decode_rows"):
        s[col] = pd.to_numeric(s[col], errors="coerce") if col in s else np.nan
    if cuda_traced:
        s["graph_mode"] = graph_modes(s["graph_launches"], s["eager_between"])
        s["graph_replayed"] = (s["graph_launches"] > 0).astype("float64")
    else:  # no CUDA trace: only the engine's own planned decision is known
        s["graph_mode"] = s["graph_planned"].fillna("unknown")
        s["graph_replayed"] = np.nan
    for phase, col in PHASE_COLUMNS.items():
        s[col] = s[f"{phase}_ns"] / 1e9
    # Device time of the step's kernels where measured, else the host forward range.
    s["forward_s"] = ((s["gpu_end_ns"] - s["gpu_start_ns"]) / 1e9).where(s["gpu_kernels"] > 0, s["forward_ns"] / 1e9)
    s["gpu_kernel_s"] = s["gpu_kernel_ns"] / 1e9
    return s


def _name_instances(steps: pd.DataFrame, base: str) -> tuple[pd.DataFrame, list[str]]:
    """One instance per process (or device when the export lacks process ids)."""
    if steps.empty:
        return steps, []
    groups = sorted(steps["group"].unique())
    if len(groups) == 1:
        mapping = {groups[0]: base}
    elif all(int(g) > 0xFFFFFF for g in groups):
        mapping = {g: f"{base}:pid{pid_of(g)}" for g in groups}
    else:
        mapping = {g: f"{base}:gpu{int(g)}" for g in groups}
    steps = steps.assign(instance=steps["group"].map(mapping))
    return steps, [mapping[g] for g in groups]


def _series(samples: pd.DataFrame, steps: pd.DataFrame, base: str, offset_s: float) -> pd.DataFrame | None:
    if samples.empty:
        return None
    owner = {}
    if len(steps):
        for dev, inst in steps.dropna(subset=["device"]).groupby("device")["instance"].first().items():
            owner[int(dev)] = inst
    return pd.DataFrame({
        "instance": [owner.get(int(g), base) for g in samples["gpu"]],
        "name": "gpu_sm_active_ratio",
        "labels": [f"gpu={int(g)}" for g in samples["gpu"]],
        "t_s": samples["t_ns"].to_numpy(dtype="float64") / 1e9 + offset_s,
        "value": samples["value"].to_numpy(dtype="float64"),
    })


def _signals(step_source: str | None, cuda_traced: bool, sm_name: str | None, stats_fields=frozenset(),
             foreign: dict | None = None, steps: pd.DataFrame | None = None) -> dict:
    mixdiag = step_source == "nvtx-mixdiag"
    stats = stats_fields if mixdiag else frozenset()
    out = {
        "steps": "measured" if mixdiag else ("inferred" if step_source else "absent"),
        "kind": "measured" if mixdiag else "absent",
        "token_allocation": "measured" if mixdiag else "absent",  # mixdiag.diagnosis.detection.signals' name for the two below
        "prefill_tokens": "measured" if mixdiag else "absent",
        "decode_rows": "measured" if mixdiag else "absent",
        "graph_mode": "measured" if cuda_traced else ("estimated" if mixdiag else "absent"),
        "sm_active": "measured" if sm_name else "absent",
        # from the step_stats ranges (contracts §2), when the export has them
        "expert_imbalance": "measured" if "expert_imbalance" in stats else "absent",
        "kv_transfer": "measured" if "kv_transfer_bytes" in stats else "absent",
        "preemption": "measured" if "preempted_reqs" in stats else "absent",
    }
    if foreign is not None and steps is not None and len(steps):
        out.update(foreign_frame.signals(steps, foreign["graph_known"]))
    return out
