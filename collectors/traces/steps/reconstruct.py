"""Step reconstruction shared by the trace collectors (Nsight Systems SQLite, Kineto JSON).

Three ways to find steps in a trace, best first:

1. mixdiag's own ``step`` ranges (docs/contracts.md §2): ``step <n> kind=... prefill_tokens=...
   decode_reqs=... decode_rows=... graph=...`` with extra `` key=value`` fields tolerated;
2. an engine's own range naming (:data:`ENGINE_STEP_RANGES`, vLLM/SGLang) - heuristic;
3. gaps between GPU work (:func:`split_on_gaps`) - heuristic.

The graph mode of a step is read from what was launched (:func:`graph_mode`), never guessed.
"""
from __future__ import annotations

import numpy as np

from mixdiag import wire
from mixdiag.schema import GRAPH_MODES, STEP_KINDS
from mixdiag.wire import StepMessage

#: Sub-ranges of a step (contracts §2) -> the steps column their duration fills.
PHASE_COLUMNS: dict[str, str] = {
    wire.SCHEDULE: "schedule_s",
    wire.PREPARE_INPUTS: "prepare_s",
    wire.KV_TRANSFER: "kv_transfer_s",
}

#: Range names engines other than ours put around one forward step, outermost first (the first
#: name present wins). Steps found this way carry no composition (kind "unknown") and are marked
#: heuristic in meta. "gpu_model_runner: forward" is vLLM V1's ``record_function_or_nullcontext``
#: name (vllm/v1/worker/gpu_model_runner.py); the others follow the engines' method names and are
#: not confirmed against live captures.
ENGINE_STEP_RANGES: tuple[str, ...] = (
    "execute_model",                # vLLM worker/model runner method
    "gpu_model_runner: forward",    # vLLM V1 record_function naming
    "ModelRunner.forward",          # SGLang model runner
    "forward_batch_generation",     # SGLang TP worker
)

#: Default gap (seconds of GPU idleness) that separates two steps in the gap heuristic.
DEFAULT_STEP_GAP_S = 0.0005


def parse_step_message(text: str | None) -> StepMessage | None:
    """Parse a contracts-§2 step message; None if ``text`` is not one.

    Lenient about drift: unknown ``key=value`` fields land in ``extra``; a kind or graph value
    outside the schema's choices becomes "unknown"; a malformed integer field becomes None.
    """
    return wire.parse_step_message(text, STEP_KINDS, GRAPH_MODES)


def parse_step_messages(texts) -> "pd.DataFrame":
    """:func:`parse_step_message` over many messages at once (vectorised regex extraction).

    Returns a frame aligned with ``texts``: ``step`` (NaN where not a step message), ``kind``,
    ``graph``, and the integer fields as float (NaN where absent or malformed).
    """
    import pandas as pd

    s = pd.Series(texts, dtype="string").str.strip()
    out = pd.DataFrame(index=s.index)
    out["step"] = pd.to_numeric(s.str.extract(wire.STEP_HEAD_RE, expand=False), errors="coerce").astype("float64")
    tail = s.str.replace(rf"^{wire.STEP}\s+\d+", "", regex=True)
    kind = tail.str.extract(wire.field_re("kind"), expand=False)
    out["kind"] = kind.where(kind.isin(STEP_KINDS), "unknown").astype(object)
    graph = tail.str.extract(wire.field_re("graph"), expand=False).str.upper()
    out["graph"] = graph.where(graph.isin(GRAPH_MODES), "unknown").astype(object)
    for name in wire.STEP_INT_FIELDS:
        raw = tail.str.extract(wire.field_re(name, r"(\d+)"), expand=False)
        out[name] = pd.to_numeric(raw, errors="coerce").astype("float64")
    return out


#: The ``step_stats`` range (contracts §2): values known only after a step's forward.
STEP_STATS = wire.STEP_STATS
#: step_stats fields -> steps column (all float; NaN where a message lacks the field).
STATS_COLUMNS: dict[str, str] = {name: name for name in wire.STATS_FIELDS}


def parse_step_stats(texts) -> "pd.DataFrame":
    """``step_stats <n> key=value ...`` messages, vectorised; aligned with ``texts``.

    Returns ``step`` (NaN where not a step_stats message), one float column per
    :data:`STATS_COLUMNS` field (NaN where absent or malformed) and ``per_rank_tokens`` (the raw
    comma list, or None).
    """
    import pandas as pd

    s = pd.Series(texts, dtype="string").str.strip()
    out = pd.DataFrame(index=s.index)
    out["step"] = pd.to_numeric(s.str.extract(wire.STEP_STATS_HEAD_RE, expand=False),
                                errors="coerce").astype("float64")
    tail = s.str.replace(rf"^{STEP_STATS}\s+\d+", "", regex=True)
    for key, col in STATS_COLUMNS.items():
        raw = tail.str.extract(wire.field_re(key, wire.NUMBER_RE), expand=False)
        out[col] = pd.to_numeric(raw, errors="coerce").astype("float64")
    prt = tail.str.extract(wire.field_re(wire.PER_RANK_TOKENS, wire.INT_LIST_RE), expand=False)
    out["per_rank_tokens"] = prt.astype(object).where(prt.notna(), None)
    return out


def attach_step_stats(steps, stats, tid: str, t0: str, t1: str):
    """Fill the :data:`STATS_COLUMNS` and ``kv_transfer_s`` of ``steps`` from trace ranges.

    ``steps`` has columns ``group`` (process key), ``step`` and the thread/time columns named by
    ``tid``/``t0``/``t1``; ``stats`` holds the candidate ranges (``name`` or message text in
    column ``text``, same group/time columns). A ``step_stats <n>`` range fills step ``n`` of its
    process; a ``kv_transfer`` range counts toward the first step range starting at or after its
    end on the same thread (the engine receives KV before it schedules); their summed duration
    lands in ``kv_transfer_dur`` (units of ``t0``/``t1``; 0 on steps whose stats say no bytes
    arrived, since the range then timed only the engine's per-step poll).
    Steps without a step_stats range keep NaN: nothing is invented. Returns ``(steps, fields)``
    where ``fields`` is the set of step_stats fields the trace carried.
    """
    import pandas as pd

    steps = steps.copy()
    for col in STATS_COLUMNS.values():
        steps[col] = np.nan
    fields: set[str] = set()
    if stats is None or stats.empty or steps.empty:
        return steps, fields
    parsed = parse_step_stats(stats["text"].to_numpy())
    ok = parsed["step"].notna().to_numpy()
    if ok.any():
        p = parsed[ok].reset_index(drop=True)
        p["group"] = stats["group"].to_numpy()[ok]
        p["step"] = p["step"].astype("int64")
        p = p.drop_duplicates(["group", "step"], keep="first").drop(columns="per_rank_tokens")
        for key, col in STATS_COLUMNS.items():
            if p[col].notna().any():
                fields.add(key)
        merged = steps[["group", "step"]].merge(p, on=["group", "step"], how="left")
        for col in STATS_COLUMNS.values():
            steps[col] = merged[col].to_numpy()
        # kv_transfer_s: 0 on steps whose stats say they were measured, plus each kv_transfer range.
        has = merged["kv_transfer_bytes"].notna().to_numpy()
        kv = np.where(has, 0.0, np.nan)
        xfer = stats[stats["text"].to_numpy() == wire.KV_TRANSFER]
        for (g, th), x in xfer.groupby(["group", tid]):
            sel = np.flatnonzero((steps["group"].to_numpy() == g) & (steps[tid].to_numpy() == th))
            if not len(sel):
                continue
            order = sel[np.argsort(steps[t0].to_numpy()[sel], kind="stable")]
            starts = steps[t0].to_numpy()[order]
            pos = np.searchsorted(starts, x[t1].to_numpy(), side="left")
            hit = pos < len(order)
            dur = (x[t1] - x[t0]).to_numpy(dtype="float64")
            for i, d in zip(order[pos[hit]], dur[hit]):
                kv[i] = (0.0 if np.isnan(kv[i]) else kv[i]) + d
        # The engine polls its connector every step: a kv_transfer range on a step that received
        # no bytes timed the poll, not a transfer.
        bytes_ = merged["kv_transfer_bytes"].to_numpy(dtype="float64")
        steps["kv_transfer_dur"] = np.where(bytes_ > 0, kv, np.where(bytes_ == 0, 0.0, np.nan))
    return steps, fields


#: Phases the engine opens before a step's ``step`` range (in this order): they belong to it.
LEADING_PHASES = (wire.KV_TRANSFER, wire.SCHEDULE)


def leading_phases(steps, phases, tid: str, t0: str, t1: str):
    """Start of each step including its leading phases, and the ``schedule`` duration.

    The engine runs ``kv_transfer`` (PD only) then ``schedule`` before it opens the ``step`` range,
    so a step's own host work precedes its range. Per process/thread: the last ``schedule`` range
    ending by the step's start (and starting after the previous step ended) is the step's; the
    last ``kv_transfer`` range ending by that schedule's start (same bound) precedes it. Returns
    ``(start[n], schedule_dur[n])`` in the units of ``t0``/``t1``; start is the step range's own
    start and schedule_dur NaN where no such range exists.
    """
    n = len(steps)
    start = steps[t0].to_numpy(dtype="float64").copy()
    sched = np.full(n, np.nan)
    if n == 0 or phases is None or phases.empty:
        return start, sched
    names = phases["text"].to_numpy()
    for (g, th), idx in steps.groupby(["group", tid]).groups.items():
        pos = steps.index.get_indexer(idx)
        pos = pos[np.argsort(start[pos], kind="stable")]
        s0 = steps[t0].to_numpy(dtype="float64")[pos]
        prev_end = np.concatenate([[-np.inf], steps[t1].to_numpy(dtype="float64")[pos][:-1]])
        mine = (phases["group"].to_numpy() == g) & (phases[tid].to_numpy() == th)
        lead = s0.copy()
        for name in reversed(LEADING_PHASES):   # schedule first, then the kv_transfer before it
            sel = mine & (names == name)
            if not sel.any():
                continue
            p0, p1 = phases[t0].to_numpy(dtype="float64")[sel], phases[t1].to_numpy(dtype="float64")[sel]
            order = np.argsort(p1, kind="stable")
            p0, p1 = p0[order], p1[order]
            k = np.searchsorted(p1, lead, side="right") - 1
            ok = (k >= 0) & (p0[np.clip(k, 0, None)] >= prev_end)
            if name == wire.SCHEDULE:
                sched[pos[ok]] = (p1 - p0)[k[ok]]
                lead = np.where(ok, p0[np.clip(k, 0, None)], lead)
            else:
                lead = np.where(ok & ~np.isnan(sched[pos]), p0[np.clip(k, 0, None)], lead)
        start[pos] = lead
    return start, sched


def is_engine_step_range(text: str | None) -> bool:
    """True for a range name that some engine puts around one step (heuristic path)."""
    return bool(text) and text.strip() in ENGINE_STEP_RANGES


def graph_mode(graph_launches: int, eager_between: int) -> str:
    """CUDA-graph mode of a step from what it launched.

    No graph launch -> NONE (eager). Graph launches with eager kernels launched between the first
    and the last of them -> PIECEWISE (pieces around eager attention). Otherwise the graph covers
    the model's forward -> FULL (eager work before or after it, e.g. sampling, is allowed).
    """
    if graph_launches <= 0:
        return "NONE"
    return "PIECEWISE" if eager_between > 0 else "FULL"


def graph_modes(graph_launches, eager_between) -> np.ndarray:
    """:func:`graph_mode` of many steps at once (object array of mode names)."""
    g = np.asarray(graph_launches, dtype="float64")
    e = np.asarray(eager_between, dtype="float64")
    return np.where(g <= 0, "NONE", np.where(e > 0, "PIECEWISE", "FULL")).astype(object)


def split_on_gaps(start: np.ndarray, end: np.ndarray, gap: float) -> np.ndarray:
    """Step index of each item of one stream of GPU work sorted by ``start``.

    A new step begins where the item starts more than ``gap`` after every earlier item ended
    (running maximum of ends, so overlapping streams do not open false gaps).
    """
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    run_end = np.maximum.accumulate(end)
    brk = np.empty(n, dtype=bool)
    brk[0] = False
    brk[1:] = (start[1:] - run_end[:-1]) > gap
    return np.cumsum(brk, dtype=np.int64)


def graph_counts(step: np.ndarray, start: np.ndarray, graph_key: np.ndarray, n_steps: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per step: distinct graph launches and eager items started between the first and last one.

    ``graph_key`` is -1 for eager work and a launch identifier (>= 0) for work of a graph launch
    (one graph-trace row, or the kernels of one node-mode launch sharing a correlation id).
    Returns ``(graph_launches[n_steps], eager_between[n_steps])``.
    """
    is_graph = graph_key >= 0
    launches = np.zeros(n_steps, dtype=np.int64)
    eager_between = np.zeros(n_steps, dtype=np.int64)
    if not is_graph.any():
        return launches, eager_between
    gs, gk = step[is_graph].astype(np.int64), graph_key[is_graph].astype(np.int64)
    span = int(gk.max()) + 1
    if span <= 8 * len(gk) + 1024:
        # dense launch ids (correlation ids): a launch lies in one step almost always, so count it
        # there from a per-id table (no sort); only ids spread over several steps are paired up
        lo = np.full(span, np.iinfo(np.int64).max)
        hi = np.full(span, -1, dtype=np.int64)
        np.minimum.at(lo, gk, gs)
        np.maximum.at(hi, gk, gs)
        one = (hi >= 0) & (lo == hi)
        launches += np.bincount(lo[one], minlength=n_steps)
        spread = (hi >= 0) & ~one
        if spread.any():
            m = spread[gk]
            pairs = np.unique(np.stack([gs[m], gk[m]]), axis=1)
            np.add.at(launches, pairs[0], 1)
    else:
        pairs = np.unique(np.stack([gs, gk]), axis=1)
        np.add.at(launches, pairs[0], 1)
    first = np.full(n_steps, np.inf)
    last = np.full(n_steps, -np.inf)
    np.minimum.at(first, step[is_graph], start[is_graph])
    np.maximum.at(last, step[is_graph], start[is_graph])
    eager = ~is_graph
    inside = eager & (start > first[step]) & (start < last[step])
    np.add.at(eager_between, step[inside], 1)
    return launches, eager_between
