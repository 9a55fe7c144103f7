"""Host stalls in an overlapped scheduler are called at the iteration that stalled (issue 24 item 1).

SGLang's overlap scheduler (``event_loop_overlap``, lmsys blog 2024-12-04 "zero-overhead batch scheduler") launches
batch n+1 before it waits for batch n's sampled ids, so the GPU never idles between healthy steps; a stalled
engine thread launches its batch late and the GPU runs dry *before that batch's kernels*. The stall belongs to
the step whose launch was late, not to the one after it. Traces come from the foreign-trace simulator's
SGLang-like engine (docs/foreign-trace-simulator.md: overlap scheduling, host stall), with and without the
engine's NVTX ranges (steps then come from the sync pattern: the copy-event wait after the next launch).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.foreign_trace import simulate  # noqa: E402

from mixdiag.collectors import load  # noqa: E402
from mixdiag.diagnosis import diagnose  # noqa: E402


@pytest.mark.parametrize("nvtx", [True, False])
def test_overlap_host_stall_is_called_at_its_own_step(tmp_path, nvtx):
    out = tmp_path / "sglang.sqlite"
    truth = simulate("sglang", seed=5, n_steps=160, faults=("host_stall",), nvtx=nvtx, graph_trace="graph",
                     out=out).steps.sort_values("step").reset_index(drop=True)
    d = diagnose(load(out))
    st = d.steps.sort_values("t_start_s").reset_index(drop=True)
    assert len(st) == len(truth)  # one collector step per engine iteration: matched by order
    # the GPU starts and ends of matched steps keep the same spacing on both clocks
    gaps = np.diff(st["t_end_s"].to_numpy()) - np.diff(truth["t_end_ns"].to_numpy()) / 1e9
    assert np.abs(gaps).max() < 1e-6
    stalled = np.flatnonzero((truth["cause"] == "host_stall").to_numpy())
    assert len(stalled) >= 3
    called = st["cause"].to_numpy()
    assert (called[stalled] == "host_stall").all(), called[stalled]
    after = stalled + 1
    after = after[(after < len(st)) & ~np.isin(after, stalled)]
    assert not (called[after] == "host_stall").any()
