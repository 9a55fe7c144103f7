"""``host_stopped_s`` (the OS saw the engine process stopped or starved of CPU: mixdiag's host sampler) as
host-stall evidence beside the engine's own GC timing: the interval rule names it with the OS as its witness, a
step reads the stand-stills on its own span (never an interval's, lent to every step), and the evidence line says
who measured what."""
import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.evidence.host_wait_fusion import fuse_host_pause
from mixdiag.report import evidence_summary
from mixdiag.schema import Timeline


def _intervals(stopped_at: dict[int, float], n: int = 20) -> pd.DataFrame:
    return pd.DataFrame([dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval",
                              kind="decode", running_reqs=8.0, output_tokens=400.0, itl_count=400.0, itl_p50_s=0.01,
                              itl_p99_s=0.01, itl_tail_floor_s=0.3 if i in stopped_at else 0.01,
                              host_stopped_s=stopped_at.get(i, 0.0)) for i in range(n)])


def test_an_os_measured_stop_names_its_interval_host_stall():
    sp = diagnose(Timeline(_intervals({7: 0.31}), None, meta={})).spikes.set_index("step")
    assert list(sp.index) == [7]
    ev = sp.loc[7, "evidence"]
    assert sp.loc[7, "cause"] == "host_stall" and ev["host_stopped_s"] == pytest.approx(0.31)
    assert "OS saw the engine process" in ev["reason"] and "garbage" not in ev["reason"]


def test_a_long_token_with_no_stand_still_measured_stays_unnamed():
    rows = _intervals({})
    rows.loc[7, "itl_tail_floor_s"] = 0.3
    sp = diagnose(Timeline(rows, None, meta={})).spikes
    assert not (sp["cause"] == "host_stall").any()   # never by elimination


def test_a_step_reads_the_stand_stills_on_its_own_span():
    """Ten 50 ms steps in one 1 s interval whose GC pause is 0.27 s: every step may have spanned it (the GC is timed
    per interval only); the OS's 0.2 s stop was placed on steps 3-6 by time, and only they carry it."""
    f = pd.DataFrame({"granularity": "step", "t_start_s": 0.05 * np.arange(10), "t_end_s": 0.05 * np.arange(1, 11),
                      "host_stopped_s": [0.0] * 3 + [0.05] * 4 + [0.0] * 3})
    iv = pd.DataFrame({"t_start_s": [-0.5], "t_end_s": [0.5], "host_pause_s": [0.27], "host_stopped_s": [0.2]})
    fuse_host_pause(f, f["granularity"] == "step", iv)
    np.testing.assert_allclose(f["fused_interval_host_stopped_s"], [0.0] * 3 + [0.05] * 4 + [0.0] * 3)
    np.testing.assert_allclose(f["fused_interval_host_pause_s"], 0.27 + f["host_stopped_s"].to_numpy())


@pytest.mark.parametrize("ev,want", [
    ({"host_stopped_s": 0.31, "gap_share_of_excess": 1.0}, "engine process stopped 310.0 ms (OS-sampled) (100% of excess)"),
    ({"host_pause_s": 0.27, "host_stopped_s": 0.05}, "GC pause 270.0 ms (engine-timed), engine process stopped 50.0 ms (OS-sampled)"),
    ({"interval_host_pause_s": 0.2, "interval_host_stopped_s": 0.2}, "engine process stopped 200.0 ms (OS-sampled)"),
])
def test_the_evidence_line_says_who_measured_the_stand_still(ev, want):
    assert evidence_summary("host_stall", ev) == want
