"""prom_intervals: counter increases with resets, PromQL-exact bucket quantiles, histogram resets."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixdiag.collectors.prometheus import prom_text, scrape_reader
from mixdiag.collectors.prometheus.prom_common import bucket_quantile, bucket_quantile_bound, counter_increase
from mixdiag.collectors.prometheus.prom_intervals import histogram_increase

A, B = (("k", "a"),), (("k", "b"),)


@pytest.mark.parametrize("prev,cur,want,expect", [
    ({A: 5.0}, {A: 8.0}, None, 3.0),                 # plain increase
    ({A: 5.0}, {A: 2.0}, None, 2.0),                 # reset: all counted since the restart
    ({}, {A: 4.0}, None, 4.0),                       # born between the scrapes
    ({A: 1.0, B: 1.0}, {A: 2.0, B: 4.0}, None, 4.0),  # summed over label sets
    ({A: 1.0, B: 1.0}, {A: 2.0, B: 4.0}, {"k": "b"}, 3.0),
    ({A: 1.0}, {}, None, math.nan),                  # nothing now: unknown, not zero
    ({A: 1.0}, {A: math.nan}, None, math.nan),
])
def test_counter_increase(prev, cur, want, expect):
    got = counter_increase(prev, cur, want)
    assert (math.isnan(got) and math.isnan(expect)) or got == expect


# 4 obs <= 0.1, 4 in (0.1, 0.2], 0 above; rank = q * 8, linear inside the bucket holding the rank when
# both its edges are shown; in the lowest bucket only its bound ("<="), in +Inf the last finite one (">=").
@pytest.mark.parametrize("q,cum,want,how", [
    (0.25, [4, 8, 8, 8], 0.1, "<="),   # PromQL would say 0.05, interpolating up from a 0 no bucket shows
    (0.5, [4, 8, 8, 8], 0.1, "<="), (0.75, [4, 8, 8, 8], 0.15, ""), (1.0, [4, 8, 8, 8], 0.2, ""),
    (0.5, [0, 8, 8, 8], 0.15, ""),   # empty lowest bucket: its bound is the next one's lower edge
    (0.5, [0, 0, 0, 3], 0.3, ">="),  # everything above the last finite bound -> that bound
    (0.5, [0, 0, 0, 0], math.nan, ""),   # no observations
])
def test_bucket_quantile_stays_inside_the_buckets_shown(q, cum, want, how):
    upper = np.array([0.1, 0.2, 0.3, math.inf])
    cum = np.array(cum, dtype=float)
    got, got_how = bucket_quantile_bound(q, upper, cum)
    assert got_how == how
    if math.isnan(want):
        assert math.isnan(got) and math.isnan(bucket_quantile(q, upper, cum))
        return
    assert got == pytest.approx(want) and bucket_quantile(q, upper, cum) == got


def test_a_fragment_from_le_7_5_gives_upper_bounds_not_3_75():
    # issue 22: a fragment whose lowest bucket shown is le="7.5" gave ITL P50 3.75 s
    upper, cum = np.array([7.5, 10.0, 20.0, math.inf]), np.array([90.0, 95.0, 99.0, 100.0])
    assert bucket_quantile_bound(0.5, upper, cum) == (7.5, "<=")
    assert bucket_quantile_bound(0.995, upper, cum) == (20.0, ">=")


def test_histogram_reset_counts_every_bucket_from_zero():
    def scrape(b1, b2, inf, count):
        return (f'x_seconds_bucket{{le="0.1"}} {b1}\nx_seconds_bucket{{le="1.0"}} {b2}\n'
                f'x_seconds_bucket{{le="+Inf"}} {inf}\nx_seconds_count {count}\nx_seconds_sum 1\n')
    # before: 5 fast, 5 slow; after a restart: 7 fast only (the 0.1 bucket ends *higher*: 5 -> 7)
    text0, text1 = scrape(5, 10, 10, 10), scrape(7, 7, 7, 7)
    h = histogram_increase(prom_text.parse(text0).samples, prom_text.parse(text1).samples, "x_seconds")
    assert h["itl_count"] == 7 and h["itl_p99_s"] <= 0.1

@pytest.mark.parametrize("slow_bucket, want", [("1.0", 0.1), ("+Inf", 1.0), ("0.1", 0.0)])
def test_the_slowest_tokens_bucket_floor(slow_bucket, want):
    """One token of 100 in a high bucket moves no quantile; the lower edge of the highest bucket that grew
    says at least one token waited that long (a preempted request's recompute wait)."""
    def scrape(b1, b2, inf):
        return (f'x_seconds_bucket{{le="0.1"}} {b1}\nx_seconds_bucket{{le="1.0"}} {b2}\n'
                f'x_seconds_bucket{{le="+Inf"}} {inf}\nx_seconds_count {inf}\nx_seconds_sum 1\n')
    one = {"0.1": (100, 100, 100), "1.0": (99, 100, 100), "+Inf": (99, 99, 100)}[slow_bucket]
    h = histogram_increase(prom_text.parse(scrape(0, 0, 0)).samples, prom_text.parse(scrape(*one)).samples, "x_seconds")
    assert h["itl_p99_s"] <= 0.1 and h["itl_tail_floor_s"] == want


values = st.lists(st.integers(0, 10_000), min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(values=values, monotone=st.booleans())
def test_interval_increases_property(values, monotone):
    if monotone:
        values = sorted(values)
    pairs = [(float(i), f"mixdiag_engine_generation_tokens_total {v}\n"
                        f'x_seconds_bucket{{le="1.0"}} {v}\nx_seconds_bucket{{le="+Inf"}} {v}\n') for i, v in enumerate(values)]
    tl = scrape_reader.read_scrapes(pairs, instance="p")
    inc = tl.steps["output_tokens"]
    assert len(inc) == len(values) - 1 and (inc >= 0).all()
    if monotone:
        assert inc.sum() == values[-1] - values[0]  # nothing lost, nothing counted twice
    else:
        # a drop is a restart: that interval counts the whole new value, never a negative
        for (a, b), got in zip(zip(values, values[1:]), inc):
            assert got == (b - a if b >= a else b)


def test_engine_gauges_and_graph_dispatches_become_interval_columns():
    """Source names stop here: the diagnosis reads expert_imbalance and graph_*_steps columns."""
    from mixdiag import wire
    from mixdiag.collectors.prometheus.prom_common import TimedScrape
    from mixdiag.collectors.prometheus.prom_intervals import build_timeline

    def scrape(full, piecewise, imb):
        return prom_text.parse(
            f'{wire.GRAPH_DISPATCH_TOTAL}{{mode="FULL"}} {full}\n'
            f'{wire.GRAPH_DISPATCH_TOTAL}{{mode="PIECEWISE"}} {piecewise}\n'
            f'{wire.EXPERT_IMBALANCE_RATIO}{{rank="0"}} {imb}\n{wire.EXPERT_IMBALANCE_RATIO}{{rank="1"}} 1.0\n')
    tl = build_timeline([TimedScrape(0.0, scrape(10, 0, 1.1)), TimedScrape(1.0, scrape(18, 2, 3.5)),
                         TimedScrape(2.0, scrape(30, 2, 1.2))], "e")
    iv = tl.steps.sort_values("step")
    assert iv["graph_full_steps"].tolist() == [8.0, 12.0]
    assert iv["graph_piecewise_steps"].tolist() == [2.0, 0.0]
    assert iv["graph_none_steps"].tolist() == [0.0, 0.0]  # the family is exposed: nothing counted yet
    assert iv["expert_imbalance"].tolist() == [3.5, 1.2]  # max over ranks at the interval's end
    # graph_dispatch_total counts the dispatcher's plan, not replays: estimated (issue 24)
    assert (iv["q_graph_mode"] == "estimated").all()
    assert tl.meta["signals"]["e"]["graph_full_steps"] == "estimated"
    assert tl.meta["signals"]["e"]["graph_mode"] == "estimated"


def test_planned_graph_counts_show_no_decode_leaving_the_graph():
    """A planned NONE count never becomes off-graph decode evidence; the same count measured does."""
    import pandas as pd
    from mixdiag.diagnosis.detection.signals import graph_off_decode_column
    rows = pd.DataFrame({"granularity": ["interval"] * 2, "graph_full_steps": [30.0, 30.0],
                         "graph_piecewise_steps": [0.0, 0.0], "graph_none_steps": [6.0, 6.0],
                         "mixed_steps": [1.0, 1.0], "prefill_steps": [0.0, 0.0],
                         "q_graph_mode": ["estimated", "measured"]})
    off = graph_off_decode_column(rows)["graph_off_decode_steps"]
    assert pd.isna(off.iloc[0]) and off.iloc[1] == 5.0


@pytest.mark.parametrize("after_gap, want", [
    (15.0, [5.0, 3.0]),   # a failed scrape is no restart: the counter goes on from the last answer
    (3.0, [3.0, 15.0]),   # it fell across the gap: a restart, counted from zero (PromQL's increase())
])
def test_a_failed_scrape_between_two_answers_counts_no_steps_twice(after_gap, want):
    # measured: a busy 2-core host made one 0.25 s scrape of the reference engine time out (up == 0),
    # and the next interval counted the whole prefill counter again (3 prefill steps for 1)
    from mixdiag import wire
    from mixdiag.collectors.prometheus import prom_text
    from mixdiag.collectors.prometheus.prom_common import TimedScrape
    from mixdiag.collectors.prometheus.prom_intervals import build_timeline

    def up(v):
        return prom_text.parse(f'{wire.STEPS_TOTAL}{{kind="decode"}} {v}\nup 1\n')

    timed = [TimedScrape(0.0, up(10.0)), TimedScrape(1.0, prom_text.parse("up 0\n")),
             TimedScrape(2.0, up(after_gap)), TimedScrape(3.0, up(after_gap + 3.0 if after_gap > 10 else 18.0))]
    s = build_timeline(timed, "engine").steps
    assert list(s["decode_steps"]) == want
    assert list(s["t_start_s"]) == [0.0, 2.0]  # the row after the gap spans it
