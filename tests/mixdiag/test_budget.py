"""The tail-latency budget: excess over baseline by cause sums to the measured excess, agrees with
``by_cause`` and the exporter, and "P99 without a cause" removes exactly that cause's excess."""
import numpy as np
import pandas as pd
import pytest

from mixdiag.causes import CAUSES
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.budget import BUDGET_CAUSES, budget_of
from mixdiag.schema import Timeline

BASE_S = 0.020


def _steps_timeline(n=240, period=30, tokens=True, faults=None, seed=0):
    """8 requests decoding every step; a mixed 105 ms step every ``period`` steps; ``faults``:
    step -> overrides (``dur``/``gap`` in s)."""
    rng = np.random.default_rng(seed)
    rows, toks, t = [], [], 1000.0
    for s in range(n):
        f = dict((faults or {}).get(s, {}))
        if period and s % period == period // 2 and s not in (faults or {}):
            f = dict(kind="mixed", prefill_tokens=512.0, prefill_reqs=1.0, dur=0.105, graph_mode="PIECEWISE")
        t += f.pop("gap", 0.001)
        dur = f.pop("dur", BASE_S * (1 + 0.04 * rng.standard_normal()))
        r = dict(instance="engine0", step=s, t_start_s=t, t_end_s=t + dur, granularity="step", kind="decode",
                 prefill_tokens=0.0, prefill_reqs=0.0, decode_reqs=8.0, decode_rows=8.0, graph_mode="FULL",
                 expert_imbalance=1.2, kv_transfer_bytes=0.0, kv_transfer_s=0.0, preempted_reqs=0.0)
        r.update(f)
        rows.append(r)
        t += dur
        toks += [dict(instance="engine0", request_id=f"r{q}", t_s=t, n_tokens=1, step=float(s)) for q in range(8)]
    return Timeline(pd.DataFrame(rows), pd.DataFrame(toks) if tokens else None, meta={})


def _intervals_from_tokens(tl: Timeline, width_s: float = 1.0) -> Timeline:
    """Scrape-like interval rows made from raw token events the way a Prometheus histogram counts
    them: each gap lands in the interval holding its later token (``t_start < t <= t_end``); the
    row holds the gaps' count, mean (histogram sum / count) and quantiles, and the prompt tokens of
    the steps that ended in it."""
    tok = tl.tokens.sort_values(["request_id", "t_s"])
    gap = tok.groupby("request_id")["t_s"].diff()
    t0 = float(tl.steps["t_start_s"].min())
    k = np.ceil((tok["t_s"] - t0) / width_s).astype(int) - 1
    st_k = np.ceil((tl.steps["t_end_s"] - t0) / width_s).astype(int) - 1
    rows = []
    for i in range(int(k.max()) + 1):
        g = gap[(k == i) & gap.notna()].to_numpy()
        rows.append(dict(instance="srv", step=i, t_start_s=t0 + i * width_s, t_end_s=t0 + (i + 1) * width_s,
                         granularity="interval", kind="unknown", running_reqs=8.0, itl_count=float(len(g)),
                         itl_mean_s=float(g.mean()) if len(g) else np.nan,
                         itl_p50_s=float(np.quantile(g, 0.5)) if len(g) else np.nan,
                         itl_p99_s=float(np.quantile(g, 0.99)) if len(g) else np.nan,
                         prefill_tokens=float(tl.steps.loc[st_k == i, "prefill_tokens"].sum()), preempted_reqs=0.0))
    return Timeline(pd.DataFrame(rows), None, meta={})


def _interval_timeline():
    """Scrapes of the token stream of ``_steps_timeline`` (a mixed step every 45 steps)."""
    return _intervals_from_tokens(_steps_timeline(n=1400, period=45))


def _measured_excess(tl, d) -> float:
    """The excess computed independently of budget.py: per gap / row, latency minus the row's baseline."""
    st = d.steps.set_index(["instance", "step"])
    if len(tl.tokens):
        tok = tl.tokens.sort_values(["request_id", "t_s"])
        itl = tok.groupby("request_id")["t_s"].diff()
        base = st.loc[list(zip(tok["instance"], tok["step"].astype(int))), "baseline_s"].to_numpy()
        return float(np.nansum(np.maximum(itl.to_numpy() - base, 0)))
    s = d.steps
    if (s["granularity"] == "step").any():
        s = s[s["has_decode"] | s["is_spike"]]
        return float(np.maximum(s["latency_s"] - s["baseline_s"], 0).sum())
    s = s[s["itl_count"] > 0]
    return float(np.maximum(s["itl_count"] * (s["itl_mean_s"] - s["baseline_s"]), 0).sum())


CASES = [  # id, timeline, budget source, cause that dominates the excess
    ("token_gaps", lambda: _steps_timeline(faults={70: dict(expert_imbalance=4.0, dur=0.080),
                                                   190: dict(gap=0.100)}), "token_gaps", "mixing"),
    ("step_latency", lambda: _steps_timeline(tokens=False, faults={130: dict(kv_transfer_bytes=4e6,
                                                                             kv_transfer_s=0.06, dur=0.085)}),
     "step_latency", "mixing"),
    ("interval_itl", _interval_timeline, "interval_itl", None),
]


@pytest.mark.parametrize("name,make,source,top", CASES, ids=[c[0] for c in CASES])
def test_budget_sums_to_measured_excess_and_agrees_with_by_cause(name, make, source, top):
    tl = make()
    d = diagnose(tl)
    (inst, ib), = d.budget.instances.items()
    assert ib.source == source
    parts = sum(cb.excess_s for cb in ib.by_cause.values())
    assert parts == pytest.approx(ib.excess_s) and ib.excess_s > 0
    assert ib.excess_s == pytest.approx(_measured_excess(tl, d), rel=1e-9)
    assert sum(cb.share_of_excess for cb in ib.by_cause.values()) == pytest.approx(1.0)
    assert set(ib.by_cause) == set(BUDGET_CAUSES)
    assert {c: ib.by_cause[c].spikes for c in CAUSES} == d.by_cause
    for c in CAUSES:  # a cause is charged excess only if it has spikes
        assert ib.by_cause[c].excess_s == 0 or d.by_cause[c] > 0
    top = top or max(CAUSES, key=lambda c: ib.by_cause[c].excess_s)
    assert max(CAUSES, key=lambda c: ib.by_cause[c].excess_s) == top and ib.by_cause[top].excess_s > 0
    assert ib.by_cause[top].mean_without_s < ib.mean_s  # removing the dominant cause lowers the mean
    assert ib.by_cause[top].mean_without_s == pytest.approx(ib.mean_s - ib.by_cause[top].excess_s / ib.n_tokens)
    if source == "interval_itl":  # interval quantiles do not compose into a P99: none is claimed
        assert np.isnan(ib.p99_s) and all(np.isnan(cb.p99_without_s) for cb in ib.by_cause.values())
    else:
        assert ib.by_cause[top].p99_without_s < ib.p99_s  # removing the dominant cause lowers P99
        assert ib.p99_floor_s <= ib.by_cause[top].p99_without_s
        for c in CAUSES:  # a cause with no excess changes nothing
            if ib.by_cause[c].excess_s == 0:
                assert ib.by_cause[c].p99_without_s == ib.p99_s and ib.by_cause[c].p99_reduction_s == 0
    js = d.to_json()["budget"]
    assert js["total"]["excess_s"] == pytest.approx(ib.excess_s)
    assert js["instances"][inst]["by_cause"][top]["excess_s"] == pytest.approx(ib.by_cause[top].excess_s)


def test_p99_without_mixing_is_the_p99_of_the_gaps_with_mixing_at_baseline():
    tl = _steps_timeline()
    d = diagnose(tl)
    ib = d.budget.instances["engine0"]
    u = d.budget.units
    lat = np.where(u["cause"] == "mixing", np.minimum(u["latency_s"], u["baseline_s"]), u["latency_s"])
    assert ib.by_cause["mixing"].p99_without_s == pytest.approx(float(np.quantile(lat, 0.99)))
    assert ib.p99_s == pytest.approx(d.itl["p99_s"])  # the token-gap budget's P99 is the headline's
    # 8 mixed steps x 8 requests, each gap ~(0.106 - 0.021) s over baseline
    assert ib.by_cause["mixing"].excess_s == pytest.approx(8 * 8 * 0.085, rel=0.1)


def test_excess_after_counts_only_new_units():
    d = diagnose(_steps_timeline())
    every, until = d.budget.excess_after({})
    assert sum(every.values()) == pytest.approx(d.budget.instances["engine0"].excess_s)
    again, until2 = d.budget.excess_after(until)
    assert sum(again.values()) == 0 and until2 == until


def test_empty_and_no_spike_budgets():
    d = diagnose(_steps_timeline(period=0, n=60))
    ib = d.budget.instances["engine0"]
    assert sum(cb.excess_s for c, cb in ib.by_cause.items() if c != "none") == 0
    assert ib.by_cause["none"].share_of_excess in (0.0, pytest.approx(1.0))
    empty = budget_of(pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    assert empty.instances == {} and empty.to_json()["total"]["excess_s"] == 0
    assert empty.excess_by_cause()["mixing"] == 0 and empty.excess_after({}) == (empty.excess_by_cause(), {})


def _stream_seconds(tokens: pd.DataFrame) -> float:
    """The time the requests spent decoding, from the raw token table alone: per request, its last
    token's time minus its first's."""
    t = tokens.groupby("request_id")["t_s"]
    return float((t.max() - t.min()).sum())


@pytest.mark.parametrize("period", [45, 9, 3])
def test_budget_never_exceeds_the_stream_seconds_that_existed(period):
    """Token gaps and the scrapes of the same stream: the budget is bounded by the decode time the
    raw tokens show, and the interval budget is exactly the excess of the raw gaps in each interval
    over its reference - where P99 x count would charge several times the stream-seconds."""
    tl = _steps_timeline(n=1400, period=period)
    bound = _stream_seconds(tl.tokens)
    gaps = diagnose(tl).budget.instances["engine0"]
    assert 0 < gaps.excess_s <= bound and gaps.token_time_s <= bound + 1e-9
    iv = _intervals_from_tokens(tl)
    d = diagnose(iv)
    ib = d.budget.instances["srv"]
    assert ib.source == "interval_itl" and 0 < ib.excess_s <= bound
    # the truth per interval, from the raw tokens: sum of its gaps minus count x reference, clipped at 0
    tok = tl.tokens.sort_values(["request_id", "t_s"])
    gap = tok.groupby("request_id")["t_s"].diff().to_numpy()
    t = tok["t_s"].to_numpy()
    truth = 0.0
    for r in d.steps.itertuples():
        g = gap[(t > r.t_start_s) & (t <= r.t_end_s) & ~np.isnan(gap)]
        if len(g) and np.isfinite(r.baseline_s):
            truth += max(0.0, g.sum() - len(g) * r.baseline_s)
    assert ib.excess_s == pytest.approx(truth, rel=1e-9)
    assert ib.token_time_s == pytest.approx(np.nansum(gap), rel=1e-9)  # every gap counted once
    # the old charge (each interval's P99 for every token) is no bound at all on a spiky stream
    s = d.steps
    old = float((np.maximum(s["itl_p99_s"] - s["baseline_s"], 0) * s["itl_count"]).sum())
    assert old > bound
    shares = d.to_json()["budget"]["total"]["by_cause"]
    assert sum(v["share_of_excess"] for v in shares.values()) == pytest.approx(1.0)
