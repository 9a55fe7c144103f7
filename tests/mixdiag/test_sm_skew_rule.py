"""Rule 7 from SM-based rank skew (graph-hidden compute): ep_hotspot at a lower confidence than
kernel-level skew, only on decode FULL replays, never for a peer's mixed step or a graph fallback."""
from __future__ import annotations

import pandas as pd
import pytest

from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.rules.step_rules import attribute_step

CTX = InstanceContext(quality={"graph_mode": "measured", "sm_active": "measured", "expert_imbalance": "inferred",
                               "host_time": "measured", "token_allocation": "absent"},
                      graph_norm="FULL", period={})
BASE = dict(latency_s=0.034, baseline_s=0.02, kind="unknown", granularity="step", graph_mode="FULL",
            graph_replayed=1.0, has_prefill=False, has_decode=False, graph_off=False, gap_excess_s=0.0,
            comm_share=0.0, comm_delta=0.0, sm_delta=0.0, rank_skew=float("nan"),
            rank_sm_skew=1.09, sm_skew_delta=0.07)


@pytest.mark.parametrize("case, change, cause, conf", [
    ("FULL replay, ranks' SM-busy time uneven", {}, "ep_hotspot", 0.5),
    ("kernel-level skew outranks it", {"rank_skew": 1.5}, "ep_hotspot", 0.55),
    ("skew at the deployment's usual level", {"sm_skew_delta": 0.01}, "unknown", None),
    ("small asymmetry", {"rank_sm_skew": 1.03}, "unknown", None),
    ("peer rank's mixed step", {"peer_prefill": 1.0}, "mixing", None),
    ("eager decode (graph fallback): kernels visible, no SM proxy",
     {"graph_mode": "NONE", "graph_off": True, "has_decode": True, "decode_rows": 40, "decode_reqs": 40,
      "kind": "decode"}, "graph_fallback", None),
])
def test_sm_skew_rule_table(case, change, cause, conf):
    ctx = CTX
    if "decode_rows" in change:
        # a batch size that replayed FULL elsewhere: graph_fallback only 0.45, below the SM rule's 0.5
        ctx = InstanceContext(quality=CTX.quality | {"token_allocation": "inferred"}, graph_norm="FULL", period={},
                              full_batch_sizes=frozenset({40}))
    a = attribute_step(pd.Series(BASE | change), ctx)
    assert a.cause == cause, (case, a)
    if conf is not None:
        assert a.confidence == pytest.approx(conf), case
    if cause == "ep_hotspot" and "rank_skew" not in change:
        assert a.evidence["rank_skew_method"] == "sm_busy"


def test_sm_skew_on_piecewise_replays_of_a_piecewise_deployment():
    # vLLM with cudagraph_mode=PIECEWISE replays decode steps as piece graphs (attention eager between them);
    # the MoE layers hide inside the pieces, so the SM-busy asymmetry is the evidence there too
    ctx = InstanceContext(quality=CTX.quality | {"token_allocation": "inferred"}, graph_norm="PIECEWISE", period={})
    row = BASE | {"graph_mode": "PIECEWISE", "graph_off": True, "has_decode": True, "decode_rows": 40,
                  "decode_reqs": 40, "kind": "decode"}
    a = attribute_step(pd.Series(row), ctx)
    assert a.cause == "ep_hotspot" and a.confidence == pytest.approx(0.5), a
    # a planned (estimated) piecewise mode is no replay: no SM-skew call
    est = InstanceContext(quality=ctx.quality | {"graph_mode": "estimated"}, graph_norm="PIECEWISE", period={})
    assert attribute_step(pd.Series(row | {"q_graph_mode": "estimated"}), est).cause != "ep_hotspot"
