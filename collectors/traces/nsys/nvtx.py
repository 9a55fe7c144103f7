"""Step and phase ranges from ``NVTX_EVENTS`` of an Nsight Systems export.

Only range rows are read (push/pop and start/end: event types 59/60, 70/71, looked up by name
when ``ENUM_NSYS_EVENT_TYPE`` is there), and only those whose message can matter: ``step ...``,
``step_stats ...``,
the phase names of docs/contracts.md §2 and the engine step names of
:data:`~mixdiag.collectors.traces.steps.reconstruct.ENGINE_STEP_RANGES`. The filter runs inside SQLite, so a
table of millions of ``aten::`` ranges is scanned, not loaded. Message = ``text``, else the
registered string ``textId`` -> StringIds (the ``nvtx`` package registers its strings).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag import wire
from mixdiag.collectors.traces.nsys.db import NVTX, PID_MASK, STRINGS, NsysDb
from mixdiag.collectors.traces.steps.reconstruct import (ENGINE_STEP_RANGES, PHASE_COLUMNS, STEP_STATS, attach_step_stats,
                                            leading_phases, parse_step_messages)

RANGE_TYPE_NAMES = ("NvtxPushPopRange", "NvtxStartEndRange", "NvtxtPushPopRange", "NvtxtStartEndRange")
RANGE_TYPE_IDS = (59, 60, 70, 71)
DOMAIN_CREATE = 75
MIXDIAG_DOMAIN = wire.DOMAIN
PHASES = tuple(PHASE_COLUMNS) + (wire.FORWARD, wire.SAMPLE)
# Payload union members, integers first (the ``nvtx`` package stores an int in int64Value, a
# float in doubleValue; C++ payloads use the matching member).
_PAYLOAD = ("int64Value", "uint64Value", "int32Value", "uint32Value", "doubleValue", "floatValue")


@dataclass
class NvtxSteps:
    """Step ranges found in the export (``ranges``: one row per step) and how they were found."""

    ranges: pd.DataFrame          # gpid, tid, start_ns, end_ns, step, kind, prefill_tokens, ... , <phase>_ns
    source: str | None            # "nvtx-mixdiag" | "nvtx-engine-naming" | None (no step ranges)
    rows_read: int = 0
    skipped: int = 0
    examples: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    stats_fields: set = field(default_factory=set)   # step_stats fields the export carried


def range_types(db: NsysDb) -> tuple[int, ...]:
    if {"id", "name"} <= db.columns("ENUM_NSYS_EVENT_TYPE"):
        marks = ",".join("?" * len(RANGE_TYPE_NAMES))
        ids = [r[0] for r in db.conn.execute(
            f"SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ({marks})", RANGE_TYPE_NAMES)]
        if ids:
            return tuple(ids)
    return RANGE_TYPE_IDS


def message_sql(db: NsysDb) -> tuple[str, str]:
    cols = db.columns(NVTX)
    if "textId" in cols and db.has(STRINGS):
        return "COALESCE(n.text, s.value)", f"LEFT JOIN {STRINGS} s ON s.id = n.textId"
    return "n.text", ""


def domain_names(db: NsysDb) -> dict[tuple[int, int], str]:
    """``(domainId, globalPid) -> name`` from NvtxDomainCreate rows (domains are per process)."""
    if not {"domainId", "globalTid"} <= db.columns(NVTX):
        return {}
    msg, join = message_sql(db)
    rows = db.conn.execute(f"SELECT n.domainId, n.globalTid & {PID_MASK}, {msg} FROM {NVTX} n {join} "
                           f"WHERE n.eventType = ?", (DOMAIN_CREATE,)).fetchall()
    return {(int(d), int(p)): str(t) for d, p, t in rows if d is not None and p is not None and t}


def read_ranges(db: NsysDb) -> pd.DataFrame:
    """The candidate range rows (steps, phases, engine step names) as a small frame."""
    cols = db.columns(NVTX)
    msg, join = message_sql(db)
    payload = [c for c in _PAYLOAD if c in cols]
    ipay = f"COALESCE({', '.join('n.' + c for c in payload)})" if len(payload) > 1 else (
        f"n.{payload[0]}" if payload else "NULL")
    dom = "n.domainId" if "domainId" in cols else "0"
    types = range_types(db)
    names = PHASES + ENGINE_STEP_RANGES
    sql = (f'SELECT n.start, n."end", n.globalTid, {dom}, {msg} AS msg, {ipay} FROM {NVTX} n {join} '
           f"WHERE n.eventType IN ({','.join('?' * len(types))}) "
           f"AND (msg LIKE 'step %' OR msg LIKE '{STEP_STATS.replace('_', '!_')} %' ESCAPE '!' "
           f"OR msg IN ({','.join('?' * len(names))}))")
    rows = db.conn.execute(sql, (*types, *names)).fetchall()
    return pd.DataFrame(rows, columns=["start_ns", "end_ns", "tid", "domain", "msg", "payload"])


def find_steps(db: NsysDb) -> NvtxSteps:
    """Step ranges (mixdiag's, else an engine's naming) with their phase durations attached."""
    empty = pd.DataFrame(columns=["gpid", "tid", "start_ns", "end_ns", "step"])
    if not db.has(NVTX) or not {"start", "end", "eventType", "globalTid"} <= db.columns(NVTX):
        return NvtxSteps(empty, None, notes=["no NVTX_EVENTS table: no NVTX ranges in this export"])
    rows = read_ranges(db)
    out = NvtxSteps(empty, None, rows_read=len(rows))
    if rows.empty:
        return out
    open_ = rows["end_ns"].isna()
    if open_.any():
        stop = int(np.nanmax(rows[["start_ns", "end_ns"]].to_numpy(dtype="float64")))
        rows.loc[open_, "end_ns"] = stop
        out.notes.append(f"{int(open_.sum())} NVTX ranges never closed; clamped to the last timestamp")
    rows = rows.astype({"start_ns": "int64", "end_ns": "int64", "tid": "int64"})
    rows["gpid"] = rows["tid"] & PID_MASK
    is_step = rows["msg"].str.match(r"^\s*step\s", na=False)
    steps = _mixdiag_steps(db, rows[is_step], out)
    if len(steps):
        out.source = "nvtx-mixdiag"
    else:
        steps = _engine_named_steps(rows[~is_step])
        if len(steps):
            out.source = "nvtx-engine-naming"
            out.notes.append("steps from engine range names (heuristic): "
                             + ", ".join(sorted(set(steps["msg"]))) + "; kinds unknown")
    if len(steps):
        steps = _attach_phases(steps, rows[rows["msg"].isin(PHASES)])
    if out.source == "nvtx-mixdiag":
        extra = rows[rows["msg"].str.startswith(STEP_STATS + " ", na=False) | (rows["msg"] == wire.KV_TRANSFER)]
        steps, out.stats_fields = attach_step_stats(
            steps.assign(group=steps["gpid"]), extra.rename(columns={"msg": "text", "gpid": "group"}),
            "tid", "start_ns", "end_ns")
        dur = steps.pop("kv_transfer_dur").to_numpy() if "kv_transfer_dur" in steps.columns else None
        if dur is not None:
            steps["kv_transfer_ns"] = np.where(np.isnan(dur), steps["kv_transfer_ns"], dur)
        # the step's own kv_transfer/schedule ranges precede its step range: it starts there
        lead = rows[rows["msg"].isin([wire.KV_TRANSFER, wire.SCHEDULE])].rename(columns={"msg": "text", "gpid": "group"})
        start, sched = leading_phases(steps, lead, "tid", "start_ns", "end_ns")
        steps["start_ns"] = start.astype("int64")
        steps["schedule_ns"] = np.where(np.isnan(sched), steps["schedule_ns"], sched)
        steps = steps.drop(columns="group")
    out.ranges = steps.reset_index(drop=True) if len(steps) else empty
    return out


def _mixdiag_steps(db: NsysDb, rows: pd.DataFrame, out: NvtxSteps) -> pd.DataFrame:
    if rows.empty:
        return rows
    domains = domain_names(db)
    rows = rows.assign(domain_name=[domains.get((int(d), int(p)), "default" if int(d) == 0 else f"domain{int(d)}")
                                    for d, p in zip(rows["domain"].fillna(0), rows["gpid"])])
    ours = rows["domain_name"] == MIXDIAG_DOMAIN
    if ours.any():
        rows = rows[ours]
    elif len(rows):
        out.notes.append("step ranges found outside an NVTX domain named 'mixdiag'; read them anyway")
    parsed = parse_step_messages(rows["msg"].to_numpy())
    bad = parsed["step"].isna().to_numpy()
    if bad.any():
        out.skipped += int(bad.sum())
        for r in rows[bad].head(5).itertuples(index=False):
            out.examples.append(f"NVTX range at {r.start_ns} ns: unparseable step message {r.msg!r}")
    good = rows[~bad].reset_index(drop=True)
    parsed = parsed[~bad].reset_index(drop=True)
    steps = pd.DataFrame({
        "gpid": good["gpid"], "tid": good["tid"], "start_ns": good["start_ns"], "end_ns": good["end_ns"],
        "step": parsed["step"].astype("int64"), "kind": parsed["kind"], "prefill_tokens": parsed["prefill_tokens"],
        "decode_reqs": parsed["decode_reqs"], "decode_rows": parsed["decode_rows"], "graph_planned": parsed["graph"],
        "scheduled_tokens": pd.to_numeric(good["payload"], errors="coerce").astype("float64"), "msg": good["msg"]})
    if steps.empty:
        return steps
    dup = steps.duplicated(["gpid", "step"], keep="first")
    if dup.any():
        out.skipped += int(dup.sum())
        for r in steps[dup].head(3).itertuples(index=False):
            out.examples.append(f"NVTX step {r.step} repeated in process {r.gpid >> 24 & 0xFFFFFF} at {r.start_ns} ns")
        steps = steps[~dup]
    return steps


def _engine_named_steps(rows: pd.DataFrame) -> pd.DataFrame:
    """Outermost engine step name present (ranges of one name, numbered per process)."""
    for name in ENGINE_STEP_RANGES:
        sel = rows[rows["msg"] == name].sort_values(["gpid", "start_ns"])
        if len(sel):
            sel = sel.assign(step=sel.groupby("gpid").cumcount(), kind="unknown", graph_planned="unknown")
            return sel
    return rows.iloc[0:0]


def _attach_phases(steps: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Sum each phase range's duration into the step range that contains it on the same thread."""
    steps = steps.sort_values(["tid", "start_ns"]).reset_index(drop=True)
    for name in PHASES:
        steps[f"{name}_ns"] = np.nan
    if phases.empty:
        return steps
    for tid, idx in steps.groupby("tid").groups.items():
        st = steps.loc[idx]
        starts, ends = st["start_ns"].to_numpy(), st["end_ns"].to_numpy()
        ph = phases[phases["tid"] == tid]
        if ph.empty:
            continue
        pos = np.searchsorted(starts, ph["start_ns"].to_numpy(), side="right") - 1
        inside = (pos >= 0) & (ph["end_ns"].to_numpy() <= ends[np.clip(pos, 0, None)])
        for name in PHASES:
            sel = inside & (ph["msg"].to_numpy() == name)
            if not sel.any():
                continue
            acc = np.zeros(len(st))
            np.add.at(acc, pos[sel], (ph["end_ns"].to_numpy() - ph["start_ns"].to_numpy())[sel])
            hit = np.zeros(len(st), dtype=bool)
            hit[pos[sel]] = True
            col = steps.loc[idx, f"{name}_ns"].to_numpy()
            steps.loc[idx, f"{name}_ns"] = np.where(hit, np.nan_to_num(col) + acc, col)
    return steps
