"""detection/signals.row_qualities: per-row signal qualities, one shared string object per value."""
import numpy as np
import pandas as pd

from mixdiag.diagnosis.detection.signals import row_qualities
from mixdiag.schema import validate


def _steps(n=6):
    return validate("steps", pd.DataFrame({
        "instance": ["e"] * n, "step": np.arange(n), "t_start_s": np.arange(n, dtype=float),
        "t_end_s": np.arange(n, dtype=float), "granularity": ["step"] * n, "kind": ["decode"] * n,
        "prefill_tokens": [0.0] * n, "decode_rows": [8.0] * n,
        "graph_mode": ["FULL", "FULL", "unknown", "PIECEWISE", "FULL", "FULL"][:n],
        "graph_replayed": [1.0, 0.0, np.nan, 0.0, 1.0, np.nan][:n],
        "expert_imbalance": [1.2, np.nan, 1.1, np.nan, np.nan, 1.0][:n],
        "q_expert_imbalance": ["", "", "inferred", "", "", "measured"][:n]}))


def test_row_values_follow_the_rule():
    rq = row_qualities(_steps(), {"graph_mode": "measured", "expert_imbalance": "measured",
                                  "token_allocation": "measured"})
    # planned (graph_replayed == 0) FULL/PIECEWISE: estimated; unknown mode: absent
    assert rq["rq_graph_mode"].tolist() == ["measured", "estimated", "absent", "estimated", "measured", "measured"]
    # the row's own q_* wins; an empty cell is absent
    assert rq["rq_expert_imbalance"].tolist() == ["measured", "absent", "inferred", "absent", "absent", "measured"]
    assert rq["rq_sm_active"].tolist() == ["absent"] * 6
    assert rq["rq_token_allocation"].tolist() == ["measured"] * 6


def test_rows_of_one_quality_share_one_object():
    # a million rows x five signals as one new str per row were ~300 MB: one object per distinct value
    rq = row_qualities(_steps(), {"graph_mode": "measured"})
    for col in rq.columns:
        v = rq[col].to_numpy()
        assert len({id(x) for x in v}) == len(set(v)), col
