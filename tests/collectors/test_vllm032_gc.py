"""A real vLLM 0.32 operator log with its GC debugger on (``VLLM_GC_DEBUG=1``) and the scrapes of the same
minute (tests/fixtures/vllm032/gc_pause, README there): each ``GC took X ms`` line is a pause the engine
timed itself. Expected values are the lines' own numbers, summed by hand (quoted beside each)."""
from pathlib import Path

import numpy as np
import pytest

from mixdiag.collectors import load
from mixdiag.vllm_testbed.truth import read_faults

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "gc_pause"


def test_every_gc_line_is_a_timed_pause_and_the_stats_windows_sum_them():
    tl = load(str(FIX / "vllm.log"))
    g = tl.series[tl.series["name"] == "vllm_log:gc_pause_s"]
    assert len(g) == 18
    assert (g["labels"] == "generation=2").sum() == 8 and (g["labels"] == "generation=0").sum() == 10
    rows = tl.steps.sort_values("t_end_s")
    # stats windows ending 13:30:34 and 13:30:44: collections stamped 26-34 (0.141 + 0.043 + 286.254 +
    # 261.173 + 270.189 + 0.046 + 0.048 ms) and 36-43 (272.900 + 0.039 + 313.717 + 255.691 + 0.036 + 0.046 ms)
    np.testing.assert_allclose(rows["host_pause_s"].to_numpy(), [0.817894, 0.842429], rtol=1e-9)


def test_a_scrape_interval_holding_a_pause_carries_it_and_the_others_a_measured_zero():
    tl = load([str(FIX / "scrapes"), str(FIX / "vllm.log")])
    iv = tl.steps[tl.steps["granularity"] == "interval"].sort_values("t_end_s")
    pause = iv["host_pause_s"].to_numpy(dtype=float)
    assert np.isfinite(pause).all()
    truth = [r for r in read_faults(FIX / "truth" / "faults.csv") if r.cause == "host_stall"]
    for r in truth:   # the interval in which the pause ended holds the engine's timing of it (to 10 ms)
        k = int(np.searchsorted(iv["t_end_s"].to_numpy(), r.t_end_s))
        assert pause[k] == pytest.approx(r.t_end_s - r.t_start_s, abs=0.01)
    # 0.547 s (two collections) + 0.270 s (one) + the young collections stamped 13:30:29-34: nothing else
    assert pause.sum() == pytest.approx(0.286254 + 0.261173 + 0.270189 + 0.000043 + 0.000046 + 0.000048, abs=1e-6)
