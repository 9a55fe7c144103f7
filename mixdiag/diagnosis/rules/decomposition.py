"""Several causes at once: each row's latency excess over the healthy reference split across causes by the
evidence measured in that row, and the episodes of :mod:`~mixdiag.diagnosis.detection.regimes` named by the
causes that carry their excess.

The split is a non-negative least-squares fit, per instance, of the per-token excess on per-cause features,
weighted by how many token gaps each row stands for (LatencyPrism's separation of workload from anomaly,
in its simplest form). Each feature is a cost the engines really pay, measured by the collectors:

* mixing - prompt tokens computed in a step that also decoded (a chunk's attention and MLP rows lengthen
  the forward every decode row waits for; interval rows: prompt tokens per second of the interval);
* prefill_stall - prompt tokens of a prefill-only step while decodes were running and got no token;
* ep_hotspot - how far expert (or rank) imbalance stands above the instance's own low-side level (the slowest
  expert-parallel rank sets the all-to-all's pace);
* pd_transfer - seconds (else bytes) of PD KV transfer the step waited on;
* graph_fallback - a decode step that ran eager where the instance usually replays graphs, counted only
  where the graph mode was measured (a planned mode is no evidence);
* kv_pressure - requests preempted for lack of KV blocks (their recompute is prefill work again);
* host_stall - the measured host gap above the usual one, in seconds.

A fitted coefficient is the cost of one unit of that feature in this capture, so a feature that rises
without the latency rising gets none. Per row, what the fitted causes explain is capped at the row's excess;
the rest is ``unknown``: nothing is named by elimination. A signal whose quality is ``estimated`` adds no
feature.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.causes import CAUSES
from mixdiag.diagnosis.config import RegimeConfig
from mixdiag.diagnosis.row_arrays import RowArrays, as_rows
from mixdiag.diagnosis.detection.regimes import (EPISODE_COLUMNS, LatencyView, episode_row, episode_rows,
                                                latency_view, low_side_reference, reference, saturation)
from mixdiag.diagnosis.rules.nested_episodes import nested_runs

#: the causes a row's excess can be split across (unknown takes the rest)
SPLIT_CAUSES = ("mixing", "prefill_stall", "ep_hotspot", "pd_transfer", "graph_fallback", "kv_pressure", "host_stall")
#: an episode is named by its largest cause only when that cause explains at least this share of its excess;
#: below it the evidence is thin and the episode stays unknown (and says why)
NAME_SHARE = 0.25
#: a stretch inside an episode is an episode of another cause only when that cause carries at least this share
#: of the stretch's excess (nested_episodes.py): it overlaps its parent's claim, so it needs a majority, not the
#: plurality that names a stand-alone episode (set on e2 tuning seeds 10-29: at a plurality, 3 of 17 nested
#: interval episodes named mixing where a graph fallback ran, at mixing shares 0.27-0.34)
NESTED_SHARE = 0.5
#: how a nested episode's ``why`` begins (its parent's number follows)
NESTED_WHY = "inside episode "
#: the episodes frame of a Diagnosis: rows bounded by the instance's own step (interval) numbers
STEP_NAMES = {"row_start": "step_start", "row_end": "step_end"}
EPISODE_RESULT_COLUMNS = [STEP_NAMES.get(c, c) for c in EPISODE_COLUMNS] + ["cause", "shares", "why"]


def _num(rows: RowArrays, col: str) -> np.ndarray:
    if not rows.has(col):
        return np.zeros(len(rows))
    v = rows.num(col)
    if len(v) and v.strides == (0,) and not np.isfinite(v[0]):  # an unfilled column (RowArrays.num): zeros
        return np.zeros(len(v))  # that are not written hold no memory until a consumer writes its own copy
    return np.where(np.isfinite(v), v, 0.0)


def _flag(rows: RowArrays, col: str) -> np.ndarray:
    return rows.flag(col)


def _not_estimated(rows: RowArrays, qcol: str) -> np.ndarray:
    if not rows.has(qcol):
        return np.ones(len(rows), dtype=bool)
    return ~rows.label_in(qcol, ["estimated"], na="nan")  # astype(str) of a missing value: "nan"


def _relative_excess(v: np.ndarray) -> np.ndarray:
    """How far a ratio signal stands above the instance's own low-side level (0 where at or below it)."""
    ok = np.isfinite(v) & (v > 0)
    if ok.sum() < 3:
        return np.zeros(len(v))
    centre, _ = low_side_reference(v[ok])
    base = max(centre, 1.0)
    return np.where(ok, np.clip(v / base - 1.0, 0, None), 0.0)


def features(rows: pd.DataFrame | RowArrays, granularity: str) -> np.ndarray:
    """Per-row, per-cause evidence (rows x len(SPLIT_CAUSES)), zero where the row shows none."""
    rows = as_rows(rows)
    n = len(rows)
    f = np.zeros((n, len(SPLIT_CAUSES)))
    col = {c: i for i, c in enumerate(SPLIT_CAUSES)}
    tokens_ok = _not_estimated(rows, "rq_token_allocation")
    graph_ok = _not_estimated(rows, "rq_graph_mode") & _not_estimated(rows, "q_graph_mode")
    ep_ok = _not_estimated(rows, "rq_expert_imbalance")
    kv_ok = _not_estimated(rows, "rq_kv_transfer")
    def rel(c: str) -> np.ndarray:
        return _relative_excess(_num(rows, c).copy() if rows.has(c) else np.zeros(n))

    # a prompt chunk on this rank or a peer makes its rank slower by design (DP-attention ranks: only the rank
    # holding the chunk runs prefill attention) - that timing skew is mixing's cost, not an expert hotspot's.
    # The routed-token imbalance (max/mean tokens per EP rank, counted by the engine: vLLM's EPLB line,
    # SGLang's balancedness) is no timing: a chunk in the row does not make it, so it is not masked (an
    # interval of 1 s or more nearly always admits some prompt, which zeroed the feature on every interval)
    chunk = _flag(rows, "has_prefill") | (_num(rows, "peer_prefill") > 0)
    skew = np.where(~chunk, np.maximum(rel("rank_skew"), rel("rank_sm_skew")), 0.0)
    f[:, col["ep_hotspot"]] = np.where(ep_ok, np.maximum(rel("expert_imbalance"), skew), 0.0)
    if granularity == "step":
        prefill = _num(rows, "prefill_tokens")
        has_prefill, has_decode = _flag(rows, "has_prefill"), _flag(rows, "has_decode")
        # a decode-only rank that waited in the all-to-all for a peer's prompt chunk pays that chunk's cost
        peer_chunk = np.where(~has_prefill & has_decode & (_num(rows, "peer_prefill") > 0), _num(rows, "peer_prefill_tokens"), 0.0)
        f[:, col["mixing"]] = np.where(tokens_ok, np.where(has_prefill & has_decode, prefill, peer_chunk), 0.0)
        waited = has_prefill & ~has_decode & _flag(rows, "decodes_before")
        f[:, col["prefill_stall"]] = np.where(tokens_ok & waited, prefill, 0.0)
        # transfer seconds charged to the step, or a side-stream transfer running inside its span
        xfer_s = np.maximum(_num(rows, "kv_transfer_s"), _num(rows, "kv_overlap_s"))
        f[:, col["pd_transfer"]] = np.where(kv_ok, np.where(xfer_s > 0, xfer_s, _num(rows, "kv_transfer_bytes") / 1e9), 0)
        # only a decode-only step falls back: a mixed step leaves the FULL graph by design (its cost is mixing's)
        # ... and a rank that left the graph because a peer's same step held a chunk did not fall back either
        fell_back = graph_ok & _flag(rows, "graph_off") & has_decode & ~has_prefill & ~(_num(rows, "peer_prefill") > 0)
        f[:, col["graph_fallback"]] = np.where(fell_back, 1.0, 0.0)
        f[:, col["kv_pressure"]] = _num(rows, "preempted_reqs")
        # the host gap of this row, or of a peer EP rank whose stall every rank waited out in the all-to-all
        f[:, col["host_stall"]] = np.clip(np.maximum(_num(rows, "gap_excess_s"), _num(rows, "peer_gap_excess_s")), 0, None)
    else:
        dur = np.clip(_num(rows, "t_end_s") - _num(rows, "t_start_s"), 1e-3, None)
        work = _num(rows, "prefill_work_tokens")
        work = np.where(work > 0, work, _num(rows, "prefill_tokens"))
        f[:, col["mixing"]] = np.where(tokens_ok, work / dur, 0.0)
        f[:, col["prefill_stall"]] = np.where(_flag(rows, "starved"), work / dur, 0.0)
        f[:, col["pd_transfer"]] = np.where(kv_ok, _num(rows, "kv_transfer_bytes") / 1e9 / dur, 0.0)
        eager = _num(rows, "graph_off_decode_steps")
        # SGLang counts its eager decode passes; vLLM's interval rows say only that the running batch ran without a
        # graph (its CUDA-graph table / largest capture size) with no large chunk beside it (interval_batch.py):
        # one instance has one kind, and the fit scales each feature by its own spread
        vllm_eager = _flag(rows, "eager_decode_interval").astype(float) if rows.has("eager_decode_interval") else 0.0
        f[:, col["graph_fallback"]] = np.where(graph_ok, np.where(eager > 0, eager / dur, vllm_eager), 0.0)
        f[:, col["kv_pressure"]] = _num(rows, "preempted_reqs") / dur
        # interval rows measure host time only where a log's steps sit inside them (evidence/fusion.py: the ITL
        # sum minus the steps' own time, per decode request)
        f[:, col["host_stall"]] = np.clip(np.maximum(_num(rows, "gap_excess_s"), _num(rows, "fused_host_gap_excess_s")),
                                          0, None)
    f[~np.isfinite(f)] = 0.0
    return np.clip(f, 0, None, out=f)  # in place: no second rows x causes array at the regime stage's peak


def nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray, iters: int = 500) -> np.ndarray:
    """argmin_b>=0 sum w (x b - y)^2 by cyclic coordinate descent on the normal equations (a handful of
    features: exact to round-off in a few hundred sweeps; no scipy needed)."""
    k = x.shape[1]
    scale = np.sqrt(np.average(x ** 2, axis=0, weights=w)) if w.sum() > 0 else np.ones(k)
    scale = np.where(scale > 0, scale, 1.0)
    xs = x / scale
    del x  # the caller's copy, this frame's alone: 56 MB a million rows fewer at the peak
    xw = xs * w[:, None]  # once for both products (rows x features: 56 MB a million rows)
    g = xw.T @ xs
    h = xw.T @ y
    del xw
    b = np.zeros(k)
    for _ in range(iters):
        prev = b.copy()
        for j in range(k):
            if g[j, j] <= 0:
                continue
            b[j] = max(0.0, b[j] - (g[j] @ b - h[j]) / g[j, j])
        if np.max(np.abs(b - prev)) <= 1e-12 * max(1.0, np.max(np.abs(b))):
            break
    return b / scale


def split(latency: np.ndarray, centre: np.ndarray, weight: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """Token-seconds of excess per row and cause (rows x (len(SPLIT_CAUSES) + 1), last column unknown).

    Each row's total is its excess ``max(latency - centre, 0) x weight``; the fitted causes take at most that."""
    ok = np.isfinite(latency) & np.isfinite(centre)
    y = np.where(ok, np.clip(latency - centre, 0, None), 0.0)
    out = np.zeros((len(y), feats.shape[1] + 1))
    if not ok.any() or not y.any():
        return out
    present = ((feats != 0) & np.asarray(ok)[:, None]).sum(axis=0) >= 1  # a cause seen on some usable row (no copy of feats)
    beta = np.zeros(feats.shape[1])
    if present.any():
        # (the column pick lays the copy out in Fortran order: the products below sum in that order)
        # every row usable (a log's steps): the columns picked from ``feats`` itself, the same C-ordered
        # source as its row copy, without that 56 MB copy a million rows at the stage's peak
        beta[present] = nnls(feats[:, present] if ok.all() else feats[ok][:, present], y[ok], weight[ok])
    # per-token seconds each cause explains, written into ``out`` itself and weighted there in place (the
    # same products, one array fewer); ``feats`` (the caller's temporary) is freed once read
    contrib = np.multiply(feats, beta, out=out[:, :-1])
    del feats
    total = contrib.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cap = np.where(total > y, y / total, 1.0)
    contrib *= np.where(np.isfinite(cap), cap, 0.0)[:, None]
    explained = contrib.sum(axis=1)
    contrib *= weight[:, None]
    out[:, -1] = (y - explained).clip(0) * weight
    return out


@dataclass
class Regimes:
    """What the regime stage found for every instance: episodes, excess by cause, saturation."""

    episodes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EPISODE_RESULT_COLUMNS))
    excess_s: dict = field(default_factory=dict)  # instance -> {cause: token-seconds of excess}
    reference: dict = field(default_factory=dict)  # instance -> {granularity, reference_s (median), rows}
    saturation: dict = field(default_factory=dict)  # instance -> saturation()
    # instance -> (step numbers in order, token-seconds per row and cause): shares are read on demand
    row_parts: dict = field(default_factory=dict)
    row_t: dict = field(default_factory=dict)  # instance -> end time of each row of row_parts, same order

    def shares_at(self, instance: str, step: int) -> dict[str, float]:
        """Shares of one row's excess by cause ({} when the row had no excess or is not in a view)."""
        got = self.row_parts.get(str(instance))
        if got is None:
            return {}
        steps, parts = got
        i = int(np.searchsorted(steps, step))
        return _shares(parts[i]) if i < len(steps) and steps[i] == step else {}

    def excess_after(self, counted_until: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """Token-seconds of excess per cause of rows newer than ``counted_until[instance]`` (a watcher's
        earlier publications) and the new per-instance newest row time. With ``{}``: ``excess_by_cause()``.
        A row is counted once, with the split of the first diagnosis that held it."""
        until, out = dict(counted_until), {c: 0.0 for c in CAUSES}
        names = SPLIT_CAUSES + ("unknown",)
        for inst, (_, parts) in sorted(self.row_parts.items()):
            t = self.row_t.get(inst)
            if t is None or not len(t):
                continue
            new = parts[t > until.get(inst, -np.inf)].sum(axis=0)
            for i, c in enumerate(names):
                out[c] += float(new[i])
            until[inst] = max(until.get(inst, -np.inf), float(np.nanmax(t)))
        return out, until

    def episodes_after(self, counted_until: dict[str, float]) -> tuple[dict[str, int], dict[str, float]]:
        """Episodes per cause that start after ``counted_until[instance]`` (the end of the last episode a
        watcher counted there), and the new per-instance end. An episode still under way when a window
        closes is counted once, under the cause it had then; its later growth starts before that end. An
        episode inside another (nested_episodes.py) is tracked apart, per instance and cause (key
        ``instance<TAB>cause``): it starts before its parent's end, yet is an episode of its own."""
        until, out = dict(counted_until), {c: 0 for c in CAUSES}
        for r in self.episodes.sort_values("t_start_s", kind="stable").itertuples(index=False):
            inst = str(r.instance)
            key = f"{inst}\t{r.cause}" if str(r.why).startswith(NESTED_WHY) else inst
            if float(r.t_start_s) > until.get(key, -np.inf):
                out[r.cause if r.cause in out else "unknown"] += 1
            until[key] = max(until.get(key, -np.inf), float(r.t_end_s))
        return out, until

    def excess_by_cause(self) -> dict[str, float]:
        """Token-seconds of excess per cause over all instances (every cause a key)."""
        out = {c: 0.0 for c in CAUSES}
        for per in self.excess_s.values():
            for c, v in per.items():
                out[c] = out.get(c, 0.0) + v
        return out


def _shares(seconds: np.ndarray) -> dict[str, float]:
    total = float(seconds.sum())
    if total <= 0:
        return {}
    names = SPLIT_CAUSES + ("unknown",)
    return {names[i]: round(float(v) / total, 4) for i, v in enumerate(seconds) if v > 0}


def _name(shares: dict[str, float]) -> tuple[str, str]:
    named = {c: s for c, s in shares.items() if c != "unknown"}
    if not named:
        return "unknown", "no measured evidence of any cause in its rows"
    best = max(named, key=named.get)
    if named[best] < NAME_SHARE:
        return "unknown", f"the largest cause ({best}) explains only {named[best]:.0%} of its excess"
    return best, ""


def _instance_rows(steps: pd.DataFrame):
    """``(instance, positions)`` per instance in sorted order, its rows by end time (ties in frame order):
    what ``groupby("instance", sort=True)`` then a stable ``sort_values("t_end_s")`` gives, from one sort."""
    codes, names = pd.factorize(steps["instance"], sort=True)
    order = np.lexsort((steps["t_end_s"].to_numpy(dtype="float64"), codes))
    order = order[codes[order] >= 0]  # rows without an instance: in no group
    bounds = np.flatnonzero(np.r_[True, codes[order][1:] != codes[order][:-1], True]) if len(order) else [0]
    return [(names[codes[order[a]]], order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _features(rows: RowArrays, granularity: str, forget: RowArrays | None) -> np.ndarray:
    """:func:`features`, then ``forget``'s converted columns dropped (the features array, passed on as a
    temporary, is then the split's alone to free)."""
    f = features(rows, granularity)
    if forget is not None:
        forget.forget()
    return f


def regimes_of(steps: pd.DataFrame, cfg: RegimeConfig = RegimeConfig()) -> Regimes:
    """Healthy reference, episodes, excess by cause and saturation for every instance of the diagnosis's
    steps frame (the rows with their signals, as ``Diagnosis.steps`` holds them)."""
    out = Regimes()
    if not len(steps):
        return out
    episodes = []
    every = RowArrays(steps)  # columns converted once, sliced per instance (row_arrays.py: a fleet's thousands)
    groups = _instance_rows(steps)
    for k, (inst, pos) in enumerate(groups):
        rows = every.take(pos)
        out.saturation[str(inst)] = saturation(rows, cfg)
        view: LatencyView | None = latency_view(rows)
        if view is None:
            continue
        sub = rows.take(view.positions)
        centre, sigma = reference(view.latency_s, view.strata, view.use, cfg, view.batch)
        # after the last instance nothing reads the converted columns: they are freed before the split's
        # arrays exist (~200 MB a million rows); an instance after this one would convert them again
        parts = split(view.latency_s, centre, view.weight,
                      _features(sub, view.granularity, every if k == len(groups) - 1 else None))
        names = SPLIT_CAUSES + ("unknown",)
        out.excess_s[str(inst)] = {names[i]: float(v) for i, v in enumerate(parts.sum(axis=0))}
        out.reference[str(inst)] = {"granularity": view.granularity, "rows": int(len(view.latency_s)),
                                    "reference_s": float(np.nanmedian(centre)) if np.isfinite(centre).any() else None}
        step_no = sub.raw("step")
        if len(step_no) < 2 or bool(np.all(step_no[1:] >= step_no[:-1])):  # in step order already: no copies
            out.row_parts[str(inst)], out.row_t[str(inst)] = (step_no, parts), view.t_s
        else:
            order = np.argsort(step_no, kind="stable")
            out.row_parts[str(inst)] = (step_no[order], parts[order])
            out.row_t[str(inst)] = view.t_s[order]
        n_eps = 0
        w = view.weight if view.weight is not None else np.ones(len(view.latency_s))
        for r in episode_rows(str(inst), view.t_s, view.latency_s, centre, sigma, cfg, view.weight):
            a, b = r[2], r[3]  # row positions inside the view -> the instance's own step numbers
            sh = _shares(parts[a:b + 1].sum(axis=0))
            cause, why = _name(sh)
            episodes.append((r[0], n_eps, step_no[a], step_no[b], *r[4:], cause, sh, why))
            parent, n_eps = n_eps, n_eps + 1
            # a stretch inside it where another cause leads each row: an episode of that cause too
            for c, d, j in nested_runs(parts, a, b, names.index(cause), NAME_SHARE, cfg):
                inner = _shares(parts[c:d + 1].sum(axis=0))
                if inner.get(names[j], 0.0) < NESTED_SHARE:  # the run as a whole must say so too, by a majority
                    continue
                e = episode_row(str(inst), n_eps, c, d, view.t_s, view.latency_s, centre, w)
                episodes.append((e[0], n_eps, step_no[c], step_no[d], *e[4:], names[j], inner,
                                 f"{NESTED_WHY}{parent} ({cause}): its rows' own evidence names {names[j]}"))
                n_eps += 1
    if episodes:
        out.episodes = pd.DataFrame(episodes, columns=EPISODE_RESULT_COLUMNS)
    return out


def _json_shares(shares: dict) -> dict:
    return {c: float(v) for c, v in sorted(shares.items(), key=lambda x: -x[1])}


def regimes_json(reg: Regimes) -> dict:
    """The regime part of ``analyze --json``: saturation, reference, excess by cause (token-seconds and
    shares) per instance, and the episodes."""
    eps = []
    for r in reg.episodes.itertuples(index=False):
        eps.append({"instance": r.instance, "episode": int(r.episode), "step_start": int(r.step_start),
                    "step_end": int(r.step_end), "t_start_s": float(r.t_start_s), "t_end_s": float(r.t_end_s),
                    "rows": int(r.rows), "reference_s": float(r.reference_s), "median_latency_s": float(r.median_latency_s),
                    "ratio": float(r.ratio), "excess_s": float(r.excess_s), "cause": r.cause,
                    "shares": _json_shares(r.shares), **({"why": r.why} if r.why else {})})
    total = reg.excess_by_cause()
    whole = sum(total.values())
    return {"saturation": reg.saturation, "reference": reg.reference,
            "excess": {"token_seconds": {c: round(v, 6) for c, v in total.items() if round(v, 6) > 0},
                       "shares": {c: round(v / whole, 4) for c, v in total.items() if round(v / whole, 4) > 0}
                       if whole > 0 else {}},
            "episodes": eps}


def regime_sentence(reg: Regimes) -> str:
    """What the verdict says of regimes: saturation first (it explains the level every token pays), then
    the episodes and what carries their excess. Empty when there is nothing to say."""
    parts = []
    sat = [i for i, s in reg.saturation.items() if s.get("saturated")]
    if sat:
        s = reg.saturation[sat[0]]
        parts.append(f"Saturated: {', '.join(sat)} had requests waiting after {s['waiting_share']:.0%} of its rows with "
                     f"the running batch at its limit ({s['running_max']:.0f}); latency there is load, not a fault.")
    if len(reg.episodes):
        by = reg.episodes.groupby("cause")["excess_s"].agg(["count", "sum"]).sort_values("sum", ascending=False)
        desc = ", ".join(f"{int(r['count'])} {c}" for c, r in by.iterrows())
        parts.append(f"{len(reg.episodes)} sustained episode(s) of elevated latency: {desc}.")
    return " ".join(parts)
