"""spike_rows: each row mapping holds, column for column, what ``sig.iloc[i][col]`` holds (same type,
same value, missing values alike), on the steps frames of real logs (str, float, bool columns)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.detection.spikes import spike_rows

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return type(a) is type(b) and (a is b or a == b)


@pytest.mark.parametrize("name", ["vllm_log_31193.txt", "vllm_log_37307.txt", "sglang_log_22166.txt"])
def test_rows_hold_what_iloc_holds(name):
    sig = diagnose(load(str(FIX / name))).steps
    assert any(isinstance(sig[c].dtype, pd.StringDtype) for c in sig.columns)  # the str path runs
    pos = np.arange(0, len(sig), max(1, len(sig) // 40))
    for i, row in zip(pos, spike_rows(sig, pos)):
        want = sig.iloc[i]
        assert list(row) == list(sig.columns)
        bad = [c for c in sig.columns if not _same(row[c], want[c])]
        assert not bad, (i, [(c, row[c], want[c]) for c in bad[:3]])
