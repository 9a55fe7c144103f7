"""Rows whose token allocation a trace could not read (a graph-level trace hides the attention kernels inside a
FULL replay; an SGLang rank that uploaded no prompt calibrates no copies) beside a few rows it could read: the
measured FULL replays are the decode reference (a FULL graph is keyed on uniform decode - vLLM
CudagraphDispatcher, SGLang cuda_graph_runner), and such rows can spike. Before, the few readable rows - eager
decode steps that waited for a peer's prompt chunk - set the baseline and the unread rows never spiked."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline


def _rows(stall=range(200, 300), chunk=range(400, 420), n=500, seed=2):
    rng = np.random.default_rng(seed)
    rows, t = [], 100.0
    for i in range(n):
        eager = i in chunk   # the peer's chunk: every rank runs eager (one graph mode), decode kernels visible
        gap = 0.0002 + (0.04 if i in stall else 0.0)
        dur = (0.12 if eager else 0.014) * rng.uniform(0.98, 1.02)
        rows.append(dict(instance="rank0", step=i, t_start_s=t + gap, t_end_s=t + gap + dur, granularity="step",
                         kind="decode" if eager else "unknown", prefill_tokens=0.0 if eager else np.nan,
                         decode_rows=np.nan, decode_reqs=np.nan, graph_mode="NONE" if eager else "FULL",
                         graph_replayed=1.0, q_token_allocation="inferred" if eager else "",
                         q_graph_mode="measured"))
        t += gap + dur
    return pd.DataFrame(rows)


def test_full_replays_of_unread_kind_set_the_reference_and_spike():
    d = diagnose(Timeline(_rows(), None, meta={}))
    st = d.steps.set_index("step")
    assert st.loc[0:199, "baseline_s"].max() < 0.02      # the FULL replays' 14 ms, not the eager steps' 120 ms
    assert st.loc[200:299, "is_spike"].all()
    assert (st.loc[200:299, "cause"] == "host_stall").all()
    assert not st.loc[list(range(0, 200)) + list(range(300, 400)), "is_spike"].any()


@pytest.mark.parametrize("q", ["estimated", "inferred"])
def test_an_unmeasured_full_mode_is_no_decode_reference(q):
    # a planned FULL (no replay measured) says nothing about the batch: the readable rows stay the reference
    rows = _rows().assign(q_graph_mode=q)
    d = diagnose(Timeline(rows, None, meta={}))
    st = d.steps.set_index("step")
    assert st.loc[0:199, "baseline_s"].min() > 0.05
