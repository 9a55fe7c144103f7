"""PyTorch-profiler (Kineto / Chrome trace) JSON -> Timeline.

Events used (``ph == "X"``, by ``cat``): ``user_annotation`` (``record_function`` ranges: the
step and phase names of docs/contracts.md §2), ``cuda_runtime``/``cuda_driver`` (kernel and
graph launches, linked to GPU work by ``args.correlation``), ``kernel`` (GPU work) and ``cpu_op``
(counted per step). Steps come from mixdiag's ``step`` ranges, else an engine's step range names,
else idle gaps between kernels (heuristic); graph mode from the launches, exactly as in
:mod:`.nsys`. Clock: ``ts`` is microseconds after ``baseTimeNanoseconds`` (unix) when the trace
records it, else relative. A file cut mid-way is read up to the last whole event and flagged
partial.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from mixdiag import wire
from mixdiag.collectors.provenance import source_entry
from mixdiag.collectors.traces.trace_steps import (DEFAULT_STEP_GAP_S, ENGINE_STEP_RANGES, PHASE_COLUMNS, STEP_STATS,
                                            attach_step_stats, graph_counts, leading_phases, graph_modes, parse_step_messages,
                                            split_on_gaps)
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


class _Events:
    """The events of a trace, decoded one at a time from the text (no list of every event dict).

    After iteration: ``count`` events decoded, ``cut_at`` the byte where decoding stopped early
    (a file cut mid-way or damaged), else None.
    """

    def __init__(self, text: str, start: int):
        self.text, self.start = text, start
        self.count, self.cut_at = 0, None

    @property
    def closed(self) -> bool:
        """The document ends as it began (``}`` or ``]``): nothing after the events was cut off."""
        head, tail = self.text.lstrip()[:1], self.text.rstrip()[-1:]
        return tail == ("}" if head == "{" else "]")

    def __iter__(self):
        text, pos, n = self.text, self.start, len(self.text)
        dec = json.JSONDecoder()
        while True:
            while pos < n and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= n:
                self.cut_at = pos  # the array never closed
                return
            if text[pos] == "]":
                return
            try:
                ev, pos = dec.raw_decode(text, pos)
            except json.JSONDecodeError:
                self.cut_at = pos
                return
            self.count += 1
            yield ev


def _open(path: Path) -> tuple[_Events, dict]:
    """The trace's event stream and top-level facts (``baseTimeNanoseconds``)."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a Kineto trace")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError):
            with gzip.open(path, "rb") as f:
                raw = _read_truncated_gzip(f)
    if not raw.strip():
        raise UserError(f"{path}: empty file")
    text = raw.decode("utf-8", errors="replace")
    del raw
    head = text.lstrip()[:1]
    m = re.search(r'"traceEvents"\s*:\s*\[', text) if head == "{" else None
    if m is None and head != "[":
        try:
            json.loads(text)
        except json.JSONDecodeError:
            raise UserError(f"{path}: not a readable Kineto trace (invalid JSON, no traceEvents list)") from None
        raise UserError(f"{path}: JSON but not a Kineto/Chrome trace (no traceEvents list)")
    start = m.end() if m else text.index("[") + 1
    top = {}
    base = re.search(r'"baseTimeNanoseconds"\s*:\s*(\d+)', text[:m.start()] if m else "")
    if base is None and m is not None:  # some writers put the key after the events
        tail = text.rfind('"baseTimeNanoseconds"')
        base = re.match(r'"baseTimeNanoseconds"\s*:\s*(\d+)', text[tail:]) if tail > m.start() else None
    if base:
        top["baseTimeNanoseconds"] = int(base.group(1))
    return _Events(text, start), top


def _read_truncated_gzip(f) -> bytes:
    out = bytearray()
    try:
        while chunk := f.read(1 << 20):
            out += chunk
    except (EOFError, OSError):
        pass
    return bytes(out)


def _frame(events) -> tuple[pd.DataFrame, int, int, list[str]]:
    """Well-formed complete events as a frame; count the other kinds (ignored) and show the
    malformed ones (skipped)."""
    rows, bad, other, examples = [], 0, 0, []
    for ev in events:
        if not isinstance(ev, dict):
            bad += 1
            if len(examples) < 5:
                examples.append(f"not an event object: {str(ev)[:80]}")
            continue
        ph = ev.get("ph")
        if ph != "X":
            other += 1  # metadata, instant, flow events: not used, not errors
            continue
        ts, dur, name = ev.get("ts"), ev.get("dur", 0), ev.get("name")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or not isinstance(name, str):
            bad += 1
            if len(examples) < 5:
                examples.append(f"event without numeric ts/dur or name: {json.dumps(ev)[:120]}")
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        corr = args.get("correlation", -1)
        rows.append((name, str(ev.get("cat", "")), float(ts), float(ts) + max(float(dur), 0.0),
                     str(ev.get("pid", "")), str(ev.get("tid", "")), corr if isinstance(corr, int) else -1))
    df = pd.DataFrame(rows, columns=["name", "cat", "t0_us", "t1_us", "pid", "tid", "corr"])
    return df, bad, other, examples


def read(source, *, instance: str | None = None, step_gap_s: float = DEFAULT_STEP_GAP_S, **options) -> Timeline:
    """Read one trace file (``.json`` or ``.json.gz``)."""
    path = Path(os.fspath(source))
    if not path.exists():
        raise UserError(f"{path}: no such file")
    events, top = _open(path)
    base = instance or path.name.split(".")[0]
    df, bad, ignored, examples = _frame(events)
    notes = []
    if events.cut_at is not None:
        notes.append(f"JSON cut or damaged at byte {events.cut_at}: read {events.count} whole events before it")
    elif not events.closed:
        notes.append("JSON cut after the events: the document is not closed")
    partial = bool(notes)
    base_ns = top.get("baseTimeNanoseconds")
    clock, offset_s = ("unix", int(base_ns) / 1e9) if isinstance(base_ns, int) else ("relative", 0.0)

    ann = df[df["cat"] == "user_annotation"]
    launches = df[df["cat"].isin(["cuda_runtime", "cuda_driver"])]
    launches = launches.assign(is_graph=launches["name"].str.match(_GRAPH_LAUNCH),
                               is_kernel=launches["name"].str.match(_KERNEL_LAUNCH))
    launches = launches[launches["is_graph"] | launches["is_kernel"]]
    kernels = df[df["cat"] == "kernel"]
    cuda_traced = len(launches) > 0 or len(kernels) > 0

    steps, step_source = _annotated_steps(ann)
    if step_source is None and len(kernels):
        steps, step_source = _gap_steps(kernels, launches, step_gap_s * 1e6), "kernel-gaps"
        notes.append(f"no step ranges: steps split where the GPU idled > {step_gap_s * 1e3:g} ms (heuristic)")
    elif step_source == "kineto-engine-naming":
        notes.append("steps from engine range names (heuristic); kinds unknown")
    if step_source is None:
        notes.append("no step ranges and no kernels: nothing to build steps from")
        steps = pd.DataFrame()
    elif step_source != "kernel-gaps":
        steps = _attach(steps, ann[ann["name"].isin(_PHASES)], launches, kernels, df[df["cat"] == "cpu_op"])
        steps["graph_mode"] = (graph_modes(steps["graph_launches"], steps["eager_between"])
                               if cuda_traced else steps["graph_planned"])
        steps["graph_replayed"] = (steps["graph_launches"] > 0).astype(float) if cuda_traced else np.nan
    stats_fields: set[str] = set()
    if step_source == "kineto-mixdiag":
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
    ours = step_source == "kineto-mixdiag"
    signals = {n: {"steps": "measured" if ours else ("inferred" if step_source else "absent"),
                   "kind": "measured" if ours else "absent",
                   "token_allocation": "measured" if ours else "absent",
                   "prefill_tokens": "measured" if ours else "absent",
                   "decode_rows": "measured" if ours else "absent",
                   "graph_mode": "measured" if cuda_traced else ("estimated" if ours else "absent"),
                   "sm_active": "absent",
                   "expert_imbalance": "measured" if "expert_imbalance" in stats_fields else "absent",
                   "kv_transfer": "measured" if "kv_transfer_bytes" in stats_fields else "absent",
                   "preemption": "measured" if "preempted_reqs" in stats_fields else "absent"} for n in names}
    entry = source_entry(FORMAT, path, total=events.count, parsed=events.count - bad - ignored, skipped=bad,
                         lines_ignored=ignored,
                         examples=examples, partial=partial, notes=notes, step_source=step_source,
                         heuristic=step_source not in (None, "kineto-mixdiag"), kernels_total=len(kernels),
                         kernels_in_steps=in_steps, instances=names)
    meta = {"clock": clock, "sources": [entry], "signals": signals, "partial": partial}
    cols = [c for c in _STEP_COLUMNS if c in steps.columns]
    return Timeline(steps[cols] if len(steps) else None, None, None, meta)


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
    for name in ENGINE_STEP_RANGES:
        sel = ann[ann["name"] == name].sort_values(["pid", "t0_us"])
        if len(sel):
            steps = pd.DataFrame({"group": sel["pid"].to_numpy(), "tid": sel["tid"].to_numpy(),
                                  "t0_us": sel["t0_us"].to_numpy(), "t1_us": sel["t1_us"].to_numpy()})
            steps["step"] = steps.groupby("group").cumcount()
            steps["kind"], steps["graph_planned"] = "unknown", "unknown"
            return steps, "kineto-engine-naming"
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


def _gap_steps(kernels: pd.DataFrame, launches: pd.DataFrame, gap_us: float) -> pd.DataFrame:
    """Steps from idle gaps per GPU; graph mode from the launch each kernel came from, when the
    trace holds launch calls at all."""
    graph_corr = set(launches.loc[launches["is_graph"], "corr"].tolist())
    parts = []
    for pid, k in kernels.groupby("pid"):
        k = k.sort_values("t0_us")
        t0 = k["t0_us"].to_numpy()
        s = split_on_gaps(t0, k["t1_us"].to_numpy(), gap_us)
        key = np.array([c if c in graph_corr else -1 for c in k["corr"].to_numpy()], dtype=np.int64)
        n = int(s[-1]) + 1
        g = k.assign(step=s).groupby("step")
        agg = pd.DataFrame({"t0_us": g["t0_us"].min(), "t1_us": g["t1_us"].max(),
                            "gpu_kernels": g.size().astype("float64")})
        agg["gpu_kernel_s"] = (k["t1_us"] - k["t0_us"]).groupby(s).sum().to_numpy() / 1e6
        agg["forward_s"] = (agg["t1_us"] - agg["t0_us"]) / 1e6
        agg["graph_launches"], agg["eager_between"] = graph_counts(s, t0, key, n)
        agg["group"] = pid
        parts.append(agg.reset_index())
    steps = pd.concat(parts, ignore_index=True)
    steps["kind"] = "unknown"
    if len(launches):
        steps["graph_mode"] = graph_modes(steps["graph_launches"], steps["eager_between"])
        steps["graph_replayed"] = (steps["graph_launches"] > 0).astype(float)
    else:  # kernels without their launch calls: what launched them is unknown
        steps["graph_mode"], steps["graph_replayed"] = "unknown", np.nan
    return steps
