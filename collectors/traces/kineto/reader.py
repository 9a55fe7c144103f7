"""PyTorch-profiler (Kineto / Chrome trace) JSON -> Timeline.

Decoding: :mod:`.events`. With mixdiag's own ``step`` ranges (docs/contracts.md §2) the
steps, kinds and tokens come from their messages: ``user_annotation`` ranges, phase sub-ranges,
``cuda_runtime``/``cuda_driver`` launches linked to ``kernel`` rows by ``args.correlation``, and
``cpu_op`` counts per step. Any other trace (an engine we did not write) goes through the same
foreign-engine path as Nsight exports (:mod:`.activity` -> :mod:`..steps.foreign`): engine
step range names, else the engine thread's copy + synchronize pattern, else GPU gaps; kinds and
tokens inferred from copy sizes, graph mode, KV transfer, comm share and - for per-rank files read
together (:func:`read_ranks`) - rank skew. Clock: ``ts`` is microseconds after
``baseTimeNanoseconds`` (unix) when the trace records it, else relative. A file cut mid-way is read
up to the last whole event and flagged partial.
"""
from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from mixdiag import wire
from mixdiag.collectors.provenance import source_entry
from mixdiag.collectors.traces.steps import frame as foreign_frame
from mixdiag.collectors.traces.steps.activity_frame import activity_frame
from mixdiag.collectors.traces.steps.foreign import GRAPH_LAUNCH, method_notes, reconstruct
from mixdiag.collectors.traces.kineto.activity import concat, read_activity
from mixdiag.collectors.traces.kineto.events import KinetoFile
from mixdiag.collectors.traces.steps.ranges import ENGINE_STEP_NAMES
from mixdiag.collectors.traces.steps.reconstruct import (PHASE_COLUMNS, STEP_STATS, attach_step_stats, graph_counts,
                                                   graph_modes, leading_phases, parse_step_messages)
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

FORMAT = "kineto-json"
EXTENSIONS = (".json", ".json.gz")
_SNIFF = re.compile(rb'"(traceEvents|schemaVersion|displayTimeUnit)"\s*:')
_GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)")
_KERNEL_LAUNCH = re.compile(r"^(cudaLaunch\w*Kernel|cuLaunch\w*Kernel)")
_PHASES = tuple(PHASE_COLUMNS) + (wire.FORWARD, wire.SAMPLE)


def sniff(head: bytes, name: str) -> bool:
    """A JSON object with Chrome-trace keys (gzip-compressed ``*.json.gz`` too)."""
    if head[:2] == b"\x1f\x8b":
        if not name.endswith(".json.gz"):
            return False
        try:  # the head is a prefix of the stream: inflate what is there
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 65536)
        except zlib.error:
            return False
    return head.lstrip()[:1] in (b"{", b"[") and _SNIFF.search(head[:65536]) is not None


def read(source, *, instance: str | None = None, step_gap_s: float | None = None, step_range: str | None = None,
         device_activity: bool = True, **options) -> Timeline:
    """Read one trace file (``.json`` or ``.json.gz``), or a list of one job's per-rank files (then
    steps are matched across ranks for the rank skew). ``step_gap_s``: GPU idle time that separates
    steps in the gap heuristic (default: from the trace's gap distribution); ``step_range``: a
    range name that marks steps."""
    if isinstance(source, (list, tuple)):
        return read_ranks(source, instance=instance, step_gap_s=step_gap_s, step_range=step_range,
                          device_activity=device_activity)
    path = Path(os.fspath(source))
    f = KinetoFile(path)
    base = instance or path.name.split(".")[0] + ("" if f.rank is None else f":rank{f.rank}")
    steps, step_source = _annotated_steps(f.df[f.df["cat"] == "user_annotation"])
    if step_source == "kineto-mixdiag" and not step_range:
        return _mixdiag(f, path, base, steps, device_activity)
    return _foreign([f], [path], base, step_gap_s, step_range, device_activity)


def read_ranks(paths, *, instance: str | None = None, step_gap_s: float | None = None,
               step_range: str | None = None, device_activity: bool = True) -> Timeline:
    """One job's per-rank Kineto files (torch writes one per process) read together: the same
    steps as :func:`read` per rank, plus ``rank_skew`` from the ranks' compute per matched step."""
    paths = [Path(os.fspath(p)) for p in paths]
    if not paths:
        raise UserError("no Kineto files given")
    files = [KinetoFile(p) for p in paths]
    return _foreign(files, paths, instance or paths[0].name.split(".")[0], step_gap_s, step_range, device_activity)


def _foreign(files: list[KinetoFile], paths: list[Path], base: str, step_gap_s, step_range,
             keep_activity: bool = True) -> Timeline:
    """Steps of engines we did not write (:mod:`..steps.foreign`), as for Nsight exports."""
    unix = all(isinstance(f.base_ns, int) for f in files)
    acts, pids = [], {}
    for i, f in enumerate(files):
        a, g = read_activity(f.df, f.base_ns if unix else 0, group_base=i << 32,
                             range_names=ENGINE_STEP_NAMES + ((step_range,) if step_range else ()))
        acts.append(a)
        pids.update({k: (i, v) for k, v in g.items()})
    act = concat(acts)
    notes = [n for f in files for n in f.notes]
    n_kernels = int((act.items.what == 0).sum())
    steps, step_source = pd.DataFrame(), None
    graph_known = act.calls is not None and bool((act.calls.what <= GRAPH_LAUNCH).any())
    if len(act.items.start):
        gap_ns = None if step_gap_s is None else int(round(float(step_gap_s) * 1e9))
        steps, n, src = reconstruct(act, step_range=step_range, gap_ns=gap_ns, range_names=ENGINE_STEP_NAMES)
        notes += n
        step_source = _SOURCES.get(src, src)
        notes += method_notes(steps, step_range, step_source)
        if step_source == "kineto-engine-naming":
            notes.append("steps from engine range names (heuristic)")
    else:
        notes.append("no step ranges and no kernels: nothing to build steps from")
    names: list[str] = []
    signals = {}
    if len(steps):
        steps = foreign_frame.finish(steps, graph_known)
        groups = sorted(steps["group"].unique())
        labels = [pids.get(int(g), (0, int(g))) for g in groups]
        clash = len({pid for _, pid in labels}) < len(labels)
        mapping = {g: base if len(groups) == 1 else (f"{base}:rank{i}" if clash else f"{base}:pid{pid}")
                   for g, (i, pid) in zip(groups, labels)}
        names = [mapping[g] for g in groups]
        steps["instance"] = steps["group"].map(mapping)
        steps["t_start_s"] = steps["start_ns"].to_numpy(dtype="float64") / 1e9
        steps["t_end_s"] = steps["end_ns"].to_numpy(dtype="float64") / 1e9
        for g, name in zip(groups, names):
            sig = {"steps": "inferred", "sm_active": "absent", "preemption": "absent"}
            sig.update(foreign_frame.signals(steps[steps["group"] == g], graph_known))
            signals[name] = sig
    in_steps = int(steps["gpu_kernels"].sum()) if len(steps) else 0
    total = sum(f.events.count for f in files)
    bad = sum(f.bad for f in files)
    ignored = sum(f.ignored for f in files)
    entry = source_entry(FORMAT, paths[0], total=total, parsed=total - bad - ignored, skipped=bad,
                         lines_ignored=ignored, examples=[x for f in files for x in f.examples][:5],
                         partial=any(f.partial for f in files), notes=notes, step_source=step_source,
                         heuristic=step_source is not None, kernels_total=n_kernels, kernels_in_steps=in_steps,
                         instances=names, **({"rank_files": [str(p) for p in paths]} if len(paths) > 1 else {}))
    meta = {"clock": "unix" if unix else "relative", "sources": [entry], "signals": signals,
            "partial": entry["partial"]}
    cols = [c for c in foreign_frame.COLUMNS if c in steps.columns]
    activity = None
    if len(steps) and keep_activity:
        instance_of = dict(zip(steps["group"].to_numpy().tolist(), steps["instance"].tolist()))
        activity, n = activity_frame(act, act.item_step, instance_of, base, 0)
        entry["notes"] += n
        entry["device_rows"] = len(activity)
    return Timeline(steps[cols] if len(steps) else None, None, None, meta, activity)


_SOURCES = {"nvtx-engine-naming": "kineto-engine-naming"}


def _mixdiag(f: KinetoFile, path: Path, base: str, steps: pd.DataFrame, keep_activity: bool = True) -> Timeline:
    """mixdiag's own ``step`` ranges (docs/contracts.md §2): kinds and tokens from the message."""
    df, events, notes, partial = f.df, f.events, list(f.notes), f.partial
    bad, ignored, examples = f.bad, f.ignored, f.examples
    base_ns = f.base_ns
    clock, offset_s = ("unix", int(base_ns) / 1e9) if isinstance(base_ns, int) else ("relative", 0.0)
    step_source = "kineto-mixdiag"
    ann = df[df["cat"] == "user_annotation"]
    launches = df[df["cat"].isin(["cuda_runtime", "cuda_driver"])]
    launches = launches.assign(is_graph=launches["name"].str.match(_GRAPH_LAUNCH),
                               is_kernel=launches["name"].str.match(_KERNEL_LAUNCH))
    launches = launches[launches["is_graph"] | launches["is_kernel"]]
    kernels = df[df["cat"] == "kernel"]
    cuda_traced = len(launches) > 0 or len(kernels) > 0
    steps = _attach(steps, ann[ann["name"].isin(_PHASES)], launches, kernels, df[df["cat"] == "cpu_op"])
    steps["graph_mode"] = (graph_modes(steps["graph_launches"], steps["eager_between"])
                           if cuda_traced else steps["graph_planned"])
    steps["graph_replayed"] = (steps["graph_launches"] > 0).astype(float) if cuda_traced else np.nan
    stats_fields: set[str] = set()
    extra = ann[ann["name"].str.startswith(STEP_STATS + " ") | (ann["name"] == wire.KV_TRANSFER)]
    steps, stats_fields = attach_step_stats(steps, extra.rename(columns={"name": "text", "pid": "group"}),
                                            "tid", "t0_us", "t1_us")
    if "kv_transfer_dur" in steps.columns:
        dur = steps.pop("kv_transfer_dur").to_numpy() / 1e6
        steps["kv_transfer_s"] = np.where(np.isnan(dur), steps["kv_transfer_s"], dur)
    # The step's own kv_transfer and schedule ranges precede its step range: the step starts
    # there (as the engine's records do), so that host work is not read as a gap between steps.
    lead = ann[ann["name"].isin([wire.KV_TRANSFER, wire.SCHEDULE])].rename(columns={"name": "text", "pid": "group"})
    t0, sched = leading_phases(steps, lead, "tid", "t0_us", "t1_us")
    steps["t0_us"] = t0
    steps["schedule_s"] = np.where(np.isnan(sched), steps["schedule_s"], sched / 1e6)

    names: list[str] = []
    if len(steps):
        groups = sorted(steps["group"].unique())
        mapping = {g: base if len(groups) == 1 else f"{base}:pid{g}" for g in groups}
        names = [mapping[g] for g in groups]
        steps["instance"] = steps["group"].map(mapping)
        steps["t_start_s"] = steps["t0_us"] / 1e6 + offset_s
        steps["t_end_s"] = steps["t1_us"] / 1e6 + offset_s
        steps["granularity"] = "step"
    in_steps = int(steps["gpu_kernels"].sum()) if len(steps) else 0
    activity = None
    if keep_activity and len(steps) and len(kernels):
        activity, n = _own_activity(df, base_ns if isinstance(base_ns, int) else 0, steps, launches, mapping, base)
        notes += n
    signals = {n: {"steps": "measured", "kind": "measured", "token_allocation": "measured",
                   "prefill_tokens": "measured", "decode_rows": "measured",
                   "graph_mode": "measured" if cuda_traced else "estimated",
                   "sm_active": "absent",
                   "expert_imbalance": "measured" if "expert_imbalance" in stats_fields else "absent",
                   "kv_transfer": "measured" if "kv_transfer_bytes" in stats_fields else "absent",
                   "preemption": "measured" if "preempted_reqs" in stats_fields else "absent"} for n in names}
    entry = source_entry(FORMAT, path, total=events.count, parsed=events.count - bad - ignored, skipped=bad,
                         lines_ignored=ignored,
                         examples=examples, partial=partial, notes=notes, step_source=step_source,
                         heuristic=False, kernels_total=len(kernels),
                         kernels_in_steps=in_steps, instances=names)
    if activity is not None:
        entry["device_rows"] = len(activity)
    meta = {"clock": clock, "sources": [entry], "signals": signals, "partial": partial}
    cols = [c for c in _STEP_COLUMNS if c in steps.columns]
    return Timeline(steps[cols] if len(steps) else None, None, None, meta, activity)


def _own_activity(df: pd.DataFrame, base_ns: int, steps: pd.DataFrame, launches: pd.DataFrame, mapping: dict,
                  job: str):
    """The activity frame of a trace with mixdiag's step ranges: each kernel's step is the step whose
    range holds its launch call (same correlation id, as :func:`_attach` counts them); copies, whose
    calls are not launches, belong to no step."""
    act, _ = read_activity(df, base_ns)
    lo = _owner(steps, launches)
    corr = launches["corr"].to_numpy(dtype=np.int64)
    ok = (lo >= 0) & (corr >= 0)
    keys, vals = corr[ok], steps["step"].to_numpy(dtype=np.int64)[lo[ok]]
    item_step = np.full(len(act.items.corr), -1, dtype=np.int64)
    if len(keys):
        o = np.argsort(keys, kind="stable")
        pos = np.clip(np.searchsorted(keys[o], act.items.corr), 0, len(o) - 1)
        hit = (keys[o][pos] == act.items.corr) & (act.items.corr >= 0)
        item_step[hit] = vals[o][pos[hit]]
    instance_of = {}
    for g, name in mapping.items():
        try:
            instance_of[int(g)] = name
        except (TypeError, ValueError):
            return None, [f"process id {g!r} is not a number: no device rows kept for the breakdown"]
    return activity_frame(act, item_step, instance_of, job, 0)


_STEP_COLUMNS = ["instance", "step", "t_start_s", "t_end_s", "granularity", "kind", "prefill_tokens",
                 "decode_reqs", "decode_rows", "graph_mode", "graph_replayed", "schedule_s", "prepare_s",
                 "forward_s", "kv_transfer_s", "kv_transfer_bytes", "expert_imbalance", "preempted_reqs", "gpu_kernels",
                 "gpu_kernel_s", "graph_launches", "cpu_ops"]


def _annotated_steps(ann: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    cand = ann[ann["name"].str.match(r"^\s*step\s", na=False)]
    parsed = parse_step_messages(cand["name"].to_numpy())
    ok = parsed["step"].notna().to_numpy()
    if ok.any():
        c, p = cand[ok].reset_index(drop=True), parsed[ok].reset_index(drop=True)
        steps = pd.DataFrame({"group": c["pid"], "tid": c["tid"], "t0_us": c["t0_us"], "t1_us": c["t1_us"],
                              "step": p["step"].astype("int64"), "kind": p["kind"],
                              "prefill_tokens": p["prefill_tokens"], "decode_reqs": p["decode_reqs"],
                              "decode_rows": p["decode_rows"], "graph_planned": p["graph"]})
        steps = steps.drop_duplicates(["group", "step"], keep="first")
        return steps.reset_index(drop=True), "kineto-mixdiag"
    return pd.DataFrame(), None


def _owner(steps: pd.DataFrame, ev: pd.DataFrame) -> np.ndarray:
    """Index of the step range containing each event on the same process/thread, or -1."""
    out = np.full(len(ev), -1, dtype=np.int64)
    if ev.empty:
        return out
    for (pid, tid), idx in steps.groupby(["group", "tid"]).groups.items():
        st = steps.loc[idx].sort_values("t0_us")
        sel = np.flatnonzero((ev["pid"].to_numpy() == pid) & (ev["tid"].to_numpy() == tid))
        if not len(sel):
            continue
        t0 = ev["t0_us"].to_numpy()[sel]
        pos = np.searchsorted(st["t0_us"].to_numpy(), t0, side="right") - 1
        ok = (pos >= 0) & (ev["t1_us"].to_numpy()[sel] <= st["t1_us"].to_numpy()[np.clip(pos, 0, None)])
        out[sel[ok]] = st.index.to_numpy()[pos[ok]]
    return out


def _attach(steps, phases, launches, kernels, cpu_ops) -> pd.DataFrame:
    steps = steps.copy()
    n = len(steps)
    owner = _owner(steps, phases)
    for name in _PHASES:
        acc = np.full(n, np.nan)
        sel = (owner >= 0) & (phases["name"].to_numpy() == name)
        if sel.any():
            acc[np.unique(owner[sel])] = 0.0
            np.add.at(acc, owner[sel], (phases["t1_us"] - phases["t0_us"]).to_numpy()[sel] / 1e6)
        steps[f"{name}_s"] = acc
    steps = steps.rename(columns={f"{wire.PREPARE_INPUTS}_s": PHASE_COLUMNS[wire.PREPARE_INPUTS]})
    lo = _owner(steps, launches)
    keep = lo >= 0
    gkey = np.where(launches["is_graph"].to_numpy(), launches["corr"].to_numpy(), -1)
    launches_n, between = graph_counts(lo[keep], launches["t0_us"].to_numpy()[keep], gkey[keep], n)
    steps["graph_launches"], steps["eager_between"] = launches_n, between
    # GPU work: kernels whose launch (same correlation id) lies in the step.
    has_corr = keep & (launches["corr"].to_numpy() >= 0)  # a missing correlation id links nothing
    corr_step = dict(zip(launches["corr"].to_numpy()[has_corr], lo[has_corr]))
    ks = np.array([corr_step.get(c, -1) for c in kernels["corr"].to_numpy()], dtype=np.int64)
    kin = ks >= 0
    count = np.bincount(ks[kin], minlength=n)
    busy = np.bincount(ks[kin], weights=(kernels["t1_us"] - kernels["t0_us"]).to_numpy()[kin], minlength=n)
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    np.minimum.at(first, ks[kin], kernels["t0_us"].to_numpy()[kin])
    np.maximum.at(last, ks[kin], kernels["t1_us"].to_numpy()[kin])
    steps["gpu_kernels"] = count.astype("float64")
    steps["gpu_kernel_s"] = busy / 1e6
    gpu_span = np.where(count > 0, (last - first) / 1e6, np.nan)
    steps["forward_s"] = np.where(count > 0, gpu_span, steps["forward_s"])
    co = _owner(steps, cpu_ops)
    steps["cpu_ops"] = np.bincount(co[co >= 0], minlength=n).astype("float64")
    return steps
