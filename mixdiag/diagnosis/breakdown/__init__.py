"""The kernel and idle breakdown by step class (what users otherwise open nsys-ai or HTA for).

``breakdown(timeline, result) -> Breakdown``: pure functions over the Timeline's ``activity`` frame
(:mod:`mixdiag.device_activity`) and the diagnosis result's step classes, spikes and episodes. One
module per concept: :mod:`.classes` (which steps form which class), :mod:`.ranks` (one device's
timeline and the class windows), :mod:`.intervals` (union / intersection / measure), :mod:`.kernels`,
:mod:`.idle` (utilisation and the host / kernel / other idle split), :mod:`.comm` (communication and
overlap), :mod:`.memcpy`, :mod:`.stragglers`; :mod:`.result` holds the typed output. Rendering lives in
the report room (``mixdiag/report_breakdown.py``).

May import: mixdiag.device_activity, mixdiag.diagnosis.config, numpy, pandas (the diagnosis room).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag import device_activity as da
from mixdiag.diagnosis.breakdown.classes import step_classes
from mixdiag.diagnosis.breakdown.comm import comm_overlap
from mixdiag.diagnosis.breakdown.idle import utilisation
from mixdiag.diagnosis.breakdown.kernels import top_kernels
from mixdiag.diagnosis.breakdown.memcpy import copies
from mixdiag.diagnosis.breakdown.ranks import rank_views
from mixdiag.diagnosis.breakdown.result import Breakdown
from mixdiag.diagnosis.breakdown.stragglers import stragglers
from mixdiag.diagnosis.config import BreakdownConfig

__all__ = ["Breakdown", "breakdown"]

NOT_KEPT = ("no device activity rows: the steps show traced kernels, but no per-kernel rows were kept (a run "
            "directory saved without them, or a trace whose steps were merged into another input's): no breakdown")


def _codes(col: pd.Series, vocabulary: tuple[str, ...]) -> np.ndarray:
    """Index into ``vocabulary`` of each categorical value (categories may come in any order)."""
    table = np.array([vocabulary.index(str(c)) if str(c) in vocabulary else -1 for c in col.cat.categories],
                     dtype=np.int8)  # a handful of values: int8 keeps the per-row gathers small
    return table[col.cat.codes.to_numpy()] if len(table) else np.zeros(len(col), dtype=np.int8)


def breakdown(timeline, result, config: BreakdownConfig = BreakdownConfig()) -> Breakdown:
    """Kernels, utilisation and idle split, comm overlap, copies and stragglers per instance, rank and
    step class of ``timeline`` as diagnosed in ``result`` (a :class:`~mixdiag.diagnosis.result.Diagnosis`)."""
    act = timeline.activity
    if not len(act):
        st = timeline.steps
        if "gpu_kernels" in st and (pd.to_numeric(st["gpu_kernels"], errors="coerce") > 0).any():
            return Breakdown(notes=(NOT_KEPT,))  # kernels were traced, their rows were not kept: say so
        return Breakdown()
    episodes = getattr(getattr(result, "regimes", None), "episodes", None)
    classes = step_classes(result.steps, episodes)
    views = rank_views(act, classes)
    role = _codes(act["role"], da.ROLES)
    kind = _codes(act["kind"], da.KINDS)
    names = [str(n) for n in act["name"].cat.categories]
    name_code = act["name"].cat.codes.to_numpy().astype(np.int64)
    util = utilisation(views, classes.names)
    kern = top_kernels(views, classes.member, kind, name_code, names, classes.names, config.top_kernels)
    comm = comm_overlap(views, role, classes.names)
    ck = act["copy_kind"]
    mem = copies(views, classes.member, role == 2, ck.cat.codes.to_numpy(), [str(c) for c in ck.cat.categories],
                 act["stream"].to_numpy(), act["bytes"].to_numpy(), classes.names)
    strag, summary, strag_notes = stragglers(views, role, name_code, names, classes, config.straggler_ratio)
    notes, partial = _notes(act, util, kind, role)
    return Breakdown(kern, util, comm, mem, strag, summary, "ok", tuple(notes + strag_notes), partial)


def _notes(act: pd.DataFrame, util: pd.DataFrame, kind: np.ndarray, role: np.ndarray) -> tuple[list[str], bool]:
    """What limits the numbers: work outside steps, gaps whose launch is unknown, graphs hiding kernels."""
    notes, partial = [], False
    outside = int((act["step"].to_numpy() < 0).sum())
    if outside:
        notes.append(f"{outside} of {len(act)} device rows belong to no step: they count in 'all' only")
    whole = util[util["step_class"] == "all"]
    idle, other = float(whole["idle_s"].sum()), float(whole["other_idle_s"].sum())
    if idle > 0 and other > 0.01 * idle:
        partial = True
        notes.append(f"{other / idle:.0%} of idle time is 'other': the trace lacks the launch calls of the work "
                     "after those gaps, so host and kernel wait cannot be told apart there")
    if (kind == 1).any():
        notes.append("CUDA graphs traced as one row per replay: their kernels and their comm/compute split are "
                     "not in the trace (nsys --cuda-graph-trace=node shows them)")
    if not (role == 1).any():
        notes.append("no communication kernels: no comm overlap and no stragglers to report")
    return notes, partial
