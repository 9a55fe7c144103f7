"""Tail-latency budget by cause: how much of the ITL excess over baseline each cause accounts for,
and what P99 would be without it (docs/analyze.md, section "Budget").

Units, per instance, from the finest latency the diagnosis used:

* **token gaps** (token events): every inter-token gap, charged to one culprit step - the step
  the gap spans when it spans one; when it spans several (the request sat out steps), the
  spiking step among them with the largest latency, else the slowest of them;
* **step latency** (step rows, no tokens): every step that decodes or spiked (every step when no
  row is known to decode), ``latency_s``;
* **interval ITL** (interval rows only): each interval's ITL histogram increments, the sum
  (``itl_mean_s`` x ``itl_count``) and the count.

Units are stream-seconds: time a request waited for its next token. A gap's excess is
``max(0, gap - reference)``; a step's ``max(0, latency - reference)``; an interval's
``max(0, Δsum - Δcount x reference)`` - exact from the histogram, where the interval's P99 would
charge every token at the tail's height (up to ~100x the truth). The reference is the culprit row's
baseline (the healthy per-token latency). An interval without a sum is not measured: no excess,
counted in ``unmeasured_units``. Each total is therefore bounded by the time the streams spent
between tokens (sum of gaps; sum of the histogram sums). The excess goes to the culprit's cause when
the row spiked and to ``none`` (baseline noise below the spike threshold) when it did not, so shares
sum to 1 over the causes plus ``none``.

Counterfactuals: the mean token latency without cause ``c`` (``mean_without_s``) removes ``c``'s
excess from the total token time, exact for every source; "P99 without ``c``" lowers each unit
charged to ``c`` to its reference and recomputes the P99 of the units - only for gaps and steps: an
interval's quantiles do not compose into a P99 of its tokens, so interval budgets give none (NaN).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.causes import CAUSES
from mixdiag.diagnosis.detection.spikes import gap_spans, itl_events, rows_of
from mixdiag.diagnosis.labels import equal, label_column
from mixdiag.diagnosis.tail_quantile import FloorQuantile

#: Budget keys: the closed cause set plus ``none`` (excess of rows that did not spike).
BUDGET_CAUSES = (*CAUSES, "none")
#: Columns of :attr:`Budget.units`: one row per latency unit (gap, step or interval).
UNIT_COLUMNS = ["instance", "t_s", "latency_s", "baseline_s", "excess_s", "weight", "cause"]


@dataclass(frozen=True)
class CauseBudget:
    """One cause's share of one instance's excess."""

    spikes: int
    excess_s: float          # excess token-time charged to the cause (stream-seconds)
    share_of_excess: float   # excess_s / the instance's total excess (0 when there is none)
    tail_share: float        # share of the excess inside units at or above the P99
    p99_without_s: float     # P99 with this cause's excess removed from its units
    p99_reduction_s: float   # p99_s - p99_without_s
    p99_share: float         # p99_reduction_s / p99_excess_s (causes overlap in the tail: no sum to 1)
    mean_without_s: float    # mean token latency with this cause's excess removed (exact)


@dataclass(frozen=True)
class InstanceBudget:
    """The budget of one instance."""

    source: str              # token_gaps | step_latency | interval_itl
    n_units: int
    baseline_s: float        # median baseline of the units
    p99_s: float             # measured P99 of the units
    p99_floor_s: float       # P99 with every unit's excess removed
    p99_excess_s: float      # p99_s - p99_floor_s
    excess_s: float          # total excess token-time (sum over causes and none)
    by_cause: dict[str, CauseBudget]
    token_time_s: float = math.nan  # time the measured units' streams spent between tokens (the bound)
    n_tokens: float = math.nan      # tokens those units cover (gaps; interval ITL counts; steps)
    mean_s: float = math.nan        # token_time_s / n_tokens
    unmeasured_units: int = 0       # units without an exact excess (an interval without an ITL sum)


@dataclass(frozen=True)
class Budget:
    """Per-instance budgets, totals per cause, and the units behind them (for the exporter)."""

    instances: dict[str, InstanceBudget] = field(default_factory=dict)
    units: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=UNIT_COLUMNS), repr=False)

    def excess_by_cause(self) -> dict[str, float]:
        """Total excess (s) per cause over all instances, every budget key present."""
        out = {c: 0.0 for c in BUDGET_CAUSES}
        for ib in self.instances.values():
            for c, cb in ib.by_cause.items():
                out[c] += cb.excess_s
        return out

    def excess_after(self, counted_until: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """Excess per cause of units newer than ``counted_until[instance]`` (a watcher's earlier
        publications) and the new per-instance newest unit time. With ``{}``: every unit."""
        until, out = dict(counted_until), {c: 0.0 for c in BUDGET_CAUSES}
        u = self.units
        for inst, grp in (u.groupby("instance", sort=True) if len(u) else ()):
            t = grp["t_s"].to_numpy(dtype="float64")
            new = grp[t > until.get(str(inst), -math.inf)]
            for c, s in new.groupby("cause", sort=False)["excess_s"]:
                out[c if c in out else "unknown"] += float(s.sum())
            until[str(inst)] = max(until.get(str(inst), -math.inf), float(np.nanmax(t)))
        return out, until

    def to_json(self) -> dict:
        """The ``budget`` key of ``mixdiag analyze --json``."""
        def num(v):
            return None if not math.isfinite(v) else float(v)

        inst = {}
        for name, ib in self.instances.items():
            inst[name] = {"source": ib.source, "n_units": ib.n_units, "baseline_s": num(ib.baseline_s),
                          "p99_s": num(ib.p99_s), "p99_floor_s": num(ib.p99_floor_s),
                          "p99_excess_s": num(ib.p99_excess_s), "excess_s": num(ib.excess_s),
                          "token_time_s": num(ib.token_time_s), "n_tokens": num(ib.n_tokens),
                          "mean_s": num(ib.mean_s), "unmeasured_units": ib.unmeasured_units,
                          "by_cause": {c: {k: (v if isinstance(v, int) else num(v)) for k, v in vars(cb).items()}
                                       for c, cb in ib.by_cause.items()}}
        total = self.excess_by_cause()
        s = sum(total.values())
        return {"instances": inst,
                "total": {"excess_s": s, "by_cause": {c: {"excess_s": v, "share_of_excess": v / s if s > 0 else 0.0}
                                                      for c, v in total.items()}}}


def _culprits(st: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """One step position per gap (-1: the gap spans no step of this frame)."""
    n = len(st)
    out = np.where((hi - lo == 1) & (lo < n), lo, -1)
    spike = st["is_spike"].fillna(False).to_numpy(dtype=bool)
    lat = st["latency_s"].to_numpy(dtype="float64")
    # spiking steps rank above non-spiking ones, then by latency
    score = np.where(spike, 1e9, 0.0) + np.nan_to_num(lat, nan=-1.0)
    for i in np.flatnonzero(hi - lo > 1):  # rare: the request sat out steps
        a, b = lo[i], min(hi[i], n)
        if a < b:
            out[i] = a + int(np.argmax(score[a:b]))
    return out


def _token_units(inst: str, st: pd.DataFrame, tokens: pd.DataFrame, itl: pd.DataFrame | None = None):
    """Units of one instance's token gaps (``itl``: ``itl_events(tokens)`` when detection built it),
    with their cause codes (:func:`_units`)."""
    # only the columns read here: sorting the whole signal frame copies ~100 columns of every step
    st = st[["step", "t_end_s", "is_spike", "latency_s", "baseline_s", "cause"]]
    st = st.sort_values("step", kind="stable").reset_index(drop=True)
    if itl is None:
        itl = itl_events(tokens)  # per request by time, as a string sort would give, at a fraction of its cost
    lo, hi = gap_spans(st, itl)  # the steps each gap spans, as detection charged them (spikes.charge_itl)
    pos = _culprits(st, lo, hi)
    ok = pos >= 0
    p = pos[ok]
    lat = (itl["t_s"] - itl["prev_t_s"]).to_numpy(dtype="float64")[ok]
    # causes factorised on the steps (200 k rows), then spread to the gaps (1.6 M) by position
    codes, names = pd.factorize(st["cause"].to_numpy(dtype=object))
    return _units(inst, itl["t_s"].to_numpy(dtype="float64")[ok], lat, st["baseline_s"].to_numpy(dtype="float64")[p],
                  np.ones(len(p)), st["is_spike"].fillna(False).to_numpy(dtype=bool)[p], (codes[p], names),
                  with_codes=True)


def _row_units(inst: str, rows: pd.DataFrame, weighted: bool) -> pd.DataFrame:
    """Step rows (``weighted`` False): one unit per row, its ``latency_s``. Interval rows: one unit
    per interval with its ITL count as weight and its mean ITL (histogram sum / count) as latency,
    so that ``weight x (latency - reference)`` is exactly ``Δsum - Δcount x reference``; an interval
    without a mean or count has no exact excess (NaN latency: unmeasured)."""
    t = rows["t_end_s"].to_numpy(dtype="float64")
    base = rows["baseline_s"].to_numpy(dtype="float64")
    spike = rows["is_spike"].fillna(False).to_numpy(dtype=bool)
    cause = rows["cause"].to_numpy(dtype=object)
    if not weighted:
        return _units(inst, t, rows["latency_s"].to_numpy(dtype="float64"), base, np.ones(len(rows)), spike, cause)
    def col(c):
        return rows[c].to_numpy(dtype="float64") if c in rows.columns else np.full(len(rows), np.nan)
    count, mean = col("itl_count"), col("itl_mean_s")
    ok = np.isfinite(count) & (count > 0) & np.isfinite(mean)
    has = ~(count == 0)  # an interval that observed no token holds no token time to budget
    inst = inst[has] if isinstance(inst, np.ndarray) else inst
    return _units(inst, t[has], np.where(ok, mean, np.nan)[has], base[has], np.where(ok, count, 0.0)[has],
                  spike[has], cause[has], keep_all=True)


def _units(inst, t, lat, base, weight, spike, cause, keep_all: bool = False, with_codes: bool = False):
    """Units with their excess (``weight x max(0, latency - baseline)``) and cause. Units without a
    latency or baseline are dropped, or with ``keep_all`` kept with no excess (counted unmeasured).
    ``cause``: per unit, or ``(codes, names)`` already factorised. ``with_codes``: also the units' cause
    codes into a list of distinct budget causes (what :func:`_instance_budget` would factorise again)."""
    good = np.isfinite(lat) & np.isfinite(base)
    excess = np.where(good, np.maximum(lat - base, 0.0), 0.0)
    # the few distinct causes are mapped once, not a million strings
    codes, names = cause if isinstance(cause, tuple) else pd.factorize(cause)
    kept = [n if n in BUDGET_CAUSES else "unknown" for n in names] + ["none"]
    distinct = list(dict.fromkeys(kept))
    to_distinct = np.array([distinct.index(k) for k in kept], dtype=np.intp)
    c = to_distinct[np.where(spike & (codes >= 0), codes, len(names))]
    if isinstance(inst, str):  # one instance's units: its name from a one-label dictionary, like the causes
        inst = label_column(np.zeros(len(t), dtype=np.intp), [inst])
    # copy=False: the columns are fresh arrays; stacking them into one block copies a million rows again
    out = pd.DataFrame({"instance": inst, "t_s": t, "latency_s": lat, "baseline_s": base,
                        "excess_s": excess * np.where(good, weight, 0.0), "weight": np.where(good, weight, 0.0),
                        "cause": label_column(c, distinct)}, copy=False)
    if not keep_all and not good.all():
        out, c = out[good], c[good]
    return (out, c, distinct) if with_codes else out


def _instance_budget(u: pd.DataFrame, source: str, spikes: dict[str, int], coded=None) -> InstanceBudget:
    """``coded``: ``(codes, names)`` of ``u["cause"]`` when :func:`_units` gave them."""
    # integer codes: comparing 1 M strings once per cause costs seconds
    codes, names = coded if coded is not None else pd.factorize(u["cause"])
    return _budget_arrays(u["latency_s"].to_numpy(dtype="float64"), u["baseline_s"].to_numpy(dtype="float64"),
                          u["excess_s"].to_numpy(dtype="float64"), u["weight"].to_numpy(dtype="float64"),
                          codes, list(names), source, spikes)


def _budget_arrays(lat: np.ndarray, base: np.ndarray, excess: np.ndarray, weight: np.ndarray, codes: np.ndarray,
                   names: list, source: str, spikes: dict[str, int]) -> InstanceBudget:
    """One instance's budget from its units' columns (``codes`` index ``names``, the causes)."""
    good = np.isfinite(lat) & np.isfinite(base)
    unmeasured = int((~good).sum())
    if unmeasured:  # (every unit measured, the usual case: no copies of a million units)
        lat, base, excess, weight, codes = lat[good], base[good], excess[good], weight[good], codes[good]
    n_tok = float(weight.sum())
    token_time = float((lat * weight).sum())
    mean = token_time / n_tok if n_tok > 0 else math.nan
    quantiles = source != "interval_itl"  # an interval's quantiles do not compose into its tokens' P99
    own = np.where(weight > 0, excess / np.where(weight == 0, 1.0, weight), 0.0)
    bare = lat - own  # every unit at its reference: the floor each "P99 without" stays above
    code_of = {name: k for k, name in enumerate(names)}
    # P99s from one partition of a floor each, then only the values above its P99 rank (tail_quantile.py):
    # removing ``none``'s excess lowers any unit at most to ``bare``; removing another cause's leaves the units
    # charged to ``none`` (the bulk: rows that did not spike) at their latency, a much tighter floor
    at_none = FloorQuantile(bare, 0.99) if quantiles else None
    none = code_of.get("none")
    at = (FloorQuantile(np.where(codes == none, lat, bare), 0.99) if none is not None else at_none) if quantiles \
        else None
    p99 = at.of(lat) if quantiles else math.nan
    floor = at_none.value if quantiles else math.nan
    p99_excess = p99 - floor
    total = float(excess.sum())
    tail = lat >= p99 if len(lat) and quantiles else np.zeros(len(lat), dtype=bool)
    tail_total = float(excess[tail].sum())
    by = {}
    for c in BUDGET_CAUSES:
        k = code_of.get(c)
        m = codes == k if k is not None else None
        ex = float(excess[m].sum()) if m is not None else 0.0
        if not quantiles:
            without = math.nan
        else:  # nothing of the cause's removed: the P99 itself
            without = ((at_none if c == "none" else at).of(np.where(m, bare, lat)) if m is not None and m.any()
                       else p99)
        red = p99 - without
        by[c] = CauseBudget(spikes=int(spikes.get(c, 0)), excess_s=ex, share_of_excess=ex / total if total > 0 else 0.0,
                            tail_share=(float(excess[m & tail].sum()) / tail_total
                                        if m is not None and tail_total > 0 else 0.0),
                            p99_without_s=without, p99_reduction_s=red,
                            p99_share=red / p99_excess if p99_excess > 0 else 0.0,
                            mean_without_s=(token_time - ex) / n_tok if n_tok > 0 else math.nan)
    return InstanceBudget(source=source, n_units=len(lat), baseline_s=float(np.median(base)) if len(base) else math.nan,
                          p99_s=p99, p99_floor_s=floor, p99_excess_s=p99_excess, excess_s=total, by_cause=by,
                          token_time_s=token_time, n_tokens=n_tok, mean_s=mean, unmeasured_units=unmeasured)


def _interval_budgets(rows: pd.DataFrame, counts: dict) -> dict:
    """Budgets of interval-only instances (a fleet's scrapes), each with its units: the units are
    built once for all of them, and each instance's budget reads numpy slices of them."""
    rows = rows.sort_values("instance", kind="stable")
    inst = rows["instance"].astype(str).to_numpy()
    u = _row_units(inst, rows, weighted=True)
    names_u, lat, base, ex, w = (u["instance"].to_numpy(), u["latency_s"].to_numpy(dtype="float64"),
                                 u["baseline_s"].to_numpy(dtype="float64"), u["excess_s"].to_numpy(dtype="float64"),
                                 u["weight"].to_numpy(dtype="float64"))
    codes, names = pd.factorize(u["cause"])
    names = list(names)
    # rows are sorted by instance, so each instance's units are one contiguous run
    runs = {}
    if len(names_u):
        change = np.flatnonzero(np.r_[True, names_u[1:] != names_u[:-1], True])
        runs = {names_u[a]: (int(a), int(b)) for a, b in zip(change[:-1], change[1:])}
    out = {}
    for name in dict.fromkeys(inst):
        a, b = runs.get(name, (0, 0))
        out[name] = (_budget_arrays(lat[a:b], base[a:b], ex[a:b], w[a:b], codes[a:b], names, "interval_itl",
                                    counts.get(name, {})), u.iloc[a:b])
    return out


def budget_of(tokens: pd.DataFrame, steps: pd.DataFrame, spikes: pd.DataFrame, itl: dict | None = None) -> Budget:
    """The budget of a diagnosis: ``steps`` is ``Diagnosis.steps`` (latency, baseline, is_spike and
    cause per row), ``tokens`` the Timeline's token events, ``spikes`` ``Diagnosis.spikes``; ``itl``:
    instance -> ``itl_events`` of its tokens where detection built them (part.Part.itl)."""
    if not len(steps) or "baseline_s" not in steps:
        return Budget()
    counts_all: dict[str, dict[str, int]] = {}
    if len(spikes):
        for (i, c), n in spikes.groupby(["instance", "cause"], sort=False).size().items():
            counts_all.setdefault(str(i), {})[str(c)] = int(n)
    names = steps["instance"].astype(str)
    is_step = equal(steps["granularity"], "step")
    stepped = set(names[is_step].unique())
    uniq = names.unique()
    only_iv = ~names.isin(stepped)
    iv_budgets = _interval_budgets(steps[only_iv], counts_all) if only_iv.any() else {}
    insts, frames = {}, []
    for inst in sorted(set(uniq)):
        if inst in iv_budgets:
            insts[inst], u = iv_budgets[inst]
            frames.append(u)
            continue
        mine = np.ones(len(steps), dtype=bool) if len(uniq) == 1 else (names == inst).to_numpy()
        rows = steps if len(uniq) == 1 else steps[mine]  # one instance: no copy of a million rows
        counts = counts_all.get(inst, {})
        step_rows = rows if is_step[mine].all() else rows[is_step[mine]]
        tok = rows_of(tokens, inst)
        coded = None
        if len(step_rows) and len(tok):
            (u, *coded), source = _token_units(inst, step_rows, tok, (itl or {}).get(inst)), "token_gaps"
        elif len(step_rows):
            dec = step_rows["has_decode"].fillna(False).astype(bool)
            # no decode rows known (a trace without token counts): every step, as the headline P99 does
            keep = (dec | step_rows["is_spike"].fillna(False).astype(bool)) if dec.any() else dec | True
            u, source = _row_units(inst, step_rows[keep], weighted=False), "step_latency"
        else:
            u, source = _row_units(inst, rows, weighted=True), "interval_itl"
        insts[inst] = _instance_budget(u, source, counts, coded)
        frames.append(u)
    if len(frames) == 1:  # one instance: no concatenation copy of a million units
        units = frames[0].reset_index(drop=True)
    else:
        units = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=UNIT_COLUMNS)
    return Budget(instances=insts, units=units)
