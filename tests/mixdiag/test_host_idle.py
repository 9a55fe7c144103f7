"""A host stall on interval rows is named from the engine process's measured CPU time: the kernel
counted it idle while requests waited (detection/host_idle.py, rules/interval_rules.py), never because
nothing else fits. Without the counter, the same interval stays ``unknown``."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.detection.host_idle import engine_idle
from mixdiag.schema import Timeline


def _rows(cpu_at_25: float | None, p99_at_25: float = 0.45, with_cpu: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        r = dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="unknown",
                 running_reqs=12.0, itl_count=300.0, itl_p50_s=0.02, itl_mean_s=0.022,
                 itl_p99_s=p99_at_25 if i == 25 else 0.03 + 0.002 * (i % 3), prefill_tokens=100.0)
        if with_cpu:
            r["engine_cpu_s"] = (cpu_at_25 if i == 25 else 1.8) + float(rng.normal(0, 0.02))
        rows.append(r)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("cpu, with_cpu, cause", [
    (1.8 * 0.6, True, "host_stall"),   # 0.4 s of the second without CPU: the stall holds the excess
    (1.8 * 0.97, True, "unknown"),     # within the usual spread: no measured idle
    (None, False, "unknown"),          # no counter: nothing measures host time
])
def test_interval_host_stall_from_engine_cpu(cpu, with_cpu, cause):
    tl = Timeline(_rows(cpu, with_cpu=with_cpu), None, meta={})
    got = diagnose(tl).spikes.set_index("step")
    assert got.at[25, "cause"] == cause


def test_engine_idle_against_the_usual_rate():
    sig = pd.DataFrame({"t_start_s": [0.0, 1.0, 2.0, 3.0, 4.0], "t_end_s": [1.0, 2.0, 3.0, 4.0, 5.0],
                        "engine_cpu_s": [2.0, 2.0, 1.0, 2.0, 0.0], "running_reqs": [5, 5, 5, 5, 0]})
    got = engine_idle(sig, None)
    assert got["engine_idle_s"].tolist()[:4] == [0.0, 0.0, 0.5, 0.0]   # usual 2 cores: half a second idle
    assert np.isnan(got["engine_idle_s"].iat[4])                     # nothing ran: no idle to speak of
