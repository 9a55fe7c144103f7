"""A host stall on interval rows from SGLang's own count of GPU idle time between forwards
(``sglang:gpu_overlap_wait_seconds_total``, PR #19982: a GapTimer on the forward stream): an interval
whose GPU waited on the host far beyond its usual share, holding most of the ITL excess, is
``host_stall`` (collectors/prometheus/dialect_columns.py, detection/host_wait.py, rules/interval_rules.py).
Without the counter the same interval stays ``unknown`` - never a cause by elimination."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.prometheus.scrape_reader import read_scrapes
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.detection.host_wait import wait_excess
from mixdiag.schema import Timeline


def _rows(wait_at_25: float | None, with_wait: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    rows = []
    for i in range(40):
        r = dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="unknown",
                 running_reqs=16.0, itl_count=600.0, itl_p50_s=0.02, itl_mean_s=0.021,
                 itl_p99_s=0.40 if i == 25 else 0.03 + 0.002 * (i % 3), prefill_tokens=50.0)
        if with_wait:
            r["gpu_wait_s"] = (wait_at_25 if i == 25 else 0.02) + abs(float(rng.normal(0, 0.003)))
        rows.append(r)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("wait, with_wait, cause", [
    (0.38, True, "host_stall"),   # the GPU idled 0.36 s beyond its usual 0.02 s: the stall holds the excess
    (0.03, True, "unknown"),      # within the usual spread: nothing measured
    (None, False, "unknown"),     # no counter: nothing measures host time
])
def test_interval_host_stall_from_gpu_wait(wait, with_wait, cause):
    got = diagnose(Timeline(_rows(wait, with_wait), None, meta={})).spikes.set_index("step")
    assert got.at[25, "cause"] == cause


def test_wait_beyond_the_usual_share():
    sig = pd.DataFrame({"t_start_s": [0.0, 1.0, 2.0, 3.0, 4.0], "t_end_s": [1.0, 2.0, 3.0, 4.0, 5.0],
                        "gpu_wait_s": [0.01, 0.01, 0.31, 0.01, 0.5], "running_reqs": [5, 5, 5, 5, 0]})
    ex, sigma = wait_excess(sig, None)
    assert np.allclose(ex[:4], [0.0, 0.0, 0.3, 0.0]) and np.isnan(ex[4])   # idle with nothing running: no stall


def _scrape(t: float, wait: float, itl_sum: float, itl_count: int) -> tuple[float, str]:
    lab = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"'
    return t, "\n".join([
        "# TYPE sglang:gpu_overlap_wait_seconds counter",
        f'sglang:gpu_overlap_wait_seconds_total{{{lab},category="forward"}} {wait}',
        "# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{{{lab}}} 8",
        "# TYPE sglang:inter_token_latency_seconds histogram",
        f'sglang:inter_token_latency_seconds_bucket{{{lab},le="0.04"}} {itl_count}',
        f'sglang:inter_token_latency_seconds_bucket{{{lab},le="+Inf"}} {itl_count}',
        f"sglang:inter_token_latency_seconds_sum{{{lab}}} {itl_sum}",
        f"sglang:inter_token_latency_seconds_count{{{lab}}} {itl_count}", ""])


def test_sglang_scrapes_give_the_interval_wait():
    tl = read_scrapes([_scrape(100.0, 1.0, 2.0, 100), _scrape(101.0, 1.25, 4.0, 200)], instance="sg")
    iv = tl.steps[tl.steps["granularity"] == "interval"]
    assert iv["gpu_wait_s"].tolist() == pytest.approx([0.25])


def _iv(waits, passes) -> pd.DataFrame:
    n = len(waits)
    return pd.DataFrame({"t_start_s": np.arange(n, dtype=float), "t_end_s": np.arange(1, n + 1, dtype=float),
                         "gpu_wait_s": waits, "graph_full_steps": passes, "graph_none_steps": [0.0] * n,
                         "running_reqs": [8.0] * n})


def test_wait_is_usual_per_forward_not_per_second():
    """Intervals of slow forwards (an EP hotspot: 12 passes a second) wait less per second than those of
    fast decodes (40 a second) at the same 1 ms per forward; per second, the fast ones read as excess."""
    rng = np.random.default_rng(1)
    passes = np.array([12.0] * 20 + [40.0] * 10)
    waits = passes * 0.001 * (1 + rng.normal(0, 0.02, 30))
    ex, sigma = wait_excess(_iv(waits, passes), None)
    assert not ((ex > 0) & (ex >= 3 * sigma)).any()
    per_second, _ = wait_excess(_iv(waits, passes).drop(columns=["graph_full_steps", "graph_none_steps"]), None)
    assert per_second[20:].min() > 0.02        # without pass counts, per second: the reading that misled


def test_a_stall_over_most_of_the_capture_still_stands_out():
    """A stall covering 60 % of the intervals: the usual wait and its noise are read on the low side."""
    rng = np.random.default_rng(2)
    passes = np.full(30, 30.0)
    waits = passes * 0.001 * (1 + rng.normal(0, 0.05, 30))
    waits[6:24] += 0.35                                             # 18 of 30 intervals stalled
    ex, sigma = wait_excess(_iv(waits, passes), None)
    stands = ex >= 3 * sigma
    assert stands[6:24].all() and not stands[:6].any() and not stands[24:].any()
