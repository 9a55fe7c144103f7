"""``diagnose()`` on any Timeline the schema admits: no internal error (issue 22).

Inputs drawn: step and interval rows, epoch clocks (t ~ 1.7e9 s), constant series, single rows,
NaN and inf in the latency and evidence columns, empty token tables, tokens without steps. The
property: the diagnosis and its reports finish, or a UserError/SchemaError with a one-line message
is raised; the counts add up (``by_cause`` sums to the spikes listed, the headline agrees).
"""
import json
import math

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixdiag.diagnosis import diagnose
from mixdiag.errors import UserError
from mixdiag.report import render
from mixdiag.schema import SchemaError, Timeline

ODD = [math.nan, math.inf, 0.0, 1e-12, 1e9]        # values a latency/evidence column may hold
KINDS = ["decode", "mixed", "prefill", "idle", "unknown"]
PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(tl: Timeline) -> None:
    """The property: a diagnosis whose counts add up, and reports that render; or a one-line refusal."""
    try:
        d = diagnose(tl)
        text = render(d)
        doc = json.loads(json.dumps(d.to_json(), default=str))
    except (UserError, SchemaError) as e:
        assert str(e) and "\n" not in str(e)
        return
    n = len(d.spikes)
    assert sum(d.by_cause.values()) == n == d.headline.n_spikes
    assert sum(doc["by_cause"].values()) == n and isinstance(text, str) and text


@st.composite
def step_timelines(draw):
    """Step rows of one or two instances, on a 0 or epoch clock, with odd values mixed in."""
    n = draw(st.integers(1, 80))
    t0 = draw(st.sampled_from([0.0, 1.7e9, 1.76e9 + 0.123]))
    constant = draw(st.booleans())
    durs = [0.02] * n if constant else draw(st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.2]), min_size=n, max_size=n))
    inst = draw(st.lists(st.sampled_from(["e0", "e1"]), min_size=n, max_size=n))
    rows, t, step = [], {"e0": t0, "e1": t0}, {"e0": 0, "e1": 0}
    for i in range(n):
        k = inst[i]
        t[k] += gaps[i]
        kind = draw(st.sampled_from(KINDS))
        rows.append(dict(instance=k, step=step[k], t_start_s=t[k], t_end_s=t[k] + durs[i], granularity="step",
                         kind=kind, prefill_tokens=512.0 if kind in ("mixed", "prefill") else 0.0,
                         decode_reqs=draw(st.sampled_from([0.0, 1.0, 8.0, math.nan])),
                         forward_s=draw(st.sampled_from(ODD)), schedule_s=draw(st.sampled_from(ODD)),
                         expert_imbalance=draw(st.sampled_from(ODD)), kv_transfer_s=draw(st.sampled_from(ODD)),
                         kv_usage=draw(st.sampled_from([math.nan, 0.0, 0.5, 1.0])),
                         graph_mode=draw(st.sampled_from(["FULL", "PIECEWISE", "NONE", "unknown"]))))
        t[k] += durs[i]
        step[k] += 1
    steps = pd.DataFrame(rows)
    steps["decode_rows"] = steps["decode_reqs"]
    tokens = None
    if draw(st.booleans()):  # tokens at the steps' ends, one per decode request
        tok = [dict(instance=r["instance"], request_id=f"r{q}", t_s=r["t_end_s"], n_tokens=1, step=float(r["step"]))
               for r in rows for q in range(int(r["decode_reqs"]) if r["decode_reqs"] == r["decode_reqs"] else 0)]
        tokens = pd.DataFrame(tok) if tok else None  # none: the schema's empty token table
    return Timeline(steps, tokens, meta={"source": "test"})


@st.composite
def interval_timelines(draw):
    """Scrape-like interval rows only, quantile columns holding NaN/inf/zeros."""
    n = draw(st.integers(1, 40))
    t0 = draw(st.sampled_from([0.0, 1.76e9]))
    p50 = draw(st.lists(st.sampled_from([0.02, 0.02, 0.05, *ODD]), min_size=n, max_size=n))
    p99 = draw(st.lists(st.sampled_from([0.03, 0.2, *ODD]), min_size=n, max_size=n))
    rows = [dict(instance="v", step=i, t_start_s=t0 + i, t_end_s=t0 + i + 1, granularity="interval",
                 kind=draw(st.sampled_from(KINDS)), itl_p50_s=p50[i], itl_p90_s=p99[i], itl_p99_s=p99[i],
                 itl_mean_s=p50[i], itl_count=draw(st.sampled_from([0.0, 1.0, 500.0, math.nan, math.inf])),
                 prefill_tokens=draw(st.sampled_from([0.0, 4096.0, math.nan])), output_tokens=500.0,
                 running_reqs=draw(st.sampled_from([0.0, 8.0, math.nan])), kv_usage=0.5,
                 large_step_share=draw(st.sampled_from([0.0, 0.3, math.nan])), step_source="scrape")
            for i in range(n)]
    return Timeline(pd.DataFrame(rows), meta={"source": "test", "clock": "unix"})


@st.composite
def token_only_timelines(draw):
    """Client tokens without any step rows: streams on a 0 or epoch clock, or none at all."""
    n_req = draw(st.integers(0, 4))
    t0 = draw(st.sampled_from([0.0, 1.76e9]))
    toks = []
    for q in range(n_req):
        gaps = draw(st.lists(st.sampled_from([0.0, 0.02, 0.02, 0.3]), min_size=1, max_size=30))
        for t in np.cumsum(gaps):
            toks.append(dict(instance="c", request_id=f"r{q}", t_s=t0 + float(t), n_tokens=1))
    return Timeline(tokens=pd.DataFrame(toks) if toks else None, meta={"source": "test"})


@PROPS
@given(step_timelines())
def test_step_timelines_never_crash(tl):
    check(tl)


@PROPS
@given(interval_timelines())
def test_interval_only_timelines_never_crash(tl):
    check(tl)


@PROPS
@given(token_only_timelines())
def test_token_only_and_empty_timelines_never_crash(tl):
    check(tl)


def test_empty_timeline_is_no_spikes():
    d = diagnose(Timeline(meta={"source": "test"}))
    assert len(d.spikes) == 0 and sum(d.by_cause.values()) == 0


def test_a_hundred_thousand_spikes_on_an_epoch_clock():
    # One big example (the periodicity tail once overflowed past ~1000 spikes): 250 000 steps at
    # t ~ 1.7e9 s; of every 5, one is a 3x slower mixed step with a prefill and one a 3x slower
    # decode step with no evidence: 10^5 spikes, half mixing, half unknown.
    n = 250_000
    i = np.arange(n)
    mixed = i % 5 == 0
    dur = np.where(mixed | (i % 5 == 2), 0.06, 0.02) + 1e-4 * (i % 3)
    t_end = 1.7e9 + np.cumsum(dur + 0.001)
    steps = pd.DataFrame(dict(instance="e0", step=i, t_start_s=t_end - dur, t_end_s=t_end, granularity="step",
                              kind=np.where(mixed, "mixed", "decode"), prefill_tokens=np.where(mixed, 512.0, 0.0),
                              decode_reqs=8.0, decode_rows=8.0, graph_mode="FULL"))
    d = diagnose(Timeline(steps, meta={"source": "test"}))
    assert len(d.spikes) == 100_000
    assert sum(d.by_cause.values()) == len(d.spikes) == d.headline.n_spikes
    assert d.by_cause["mixing"] == d.by_cause["unknown"] == 50_000
