"""diagnosis/labels.py: label-column answers computed per distinct value (or per shared object) equal
the per-row pandas comparison."""
import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis.labels import as_labels, equal, label_in
from mixdiag.schema import repeat_label

COLUMNS = [
    pd.Series(repeat_label(6, "step"), dtype=object),                        # one shared object (a log)
    pd.Series(np.array(["st" + "ep" for _ in range(6)], dtype=object)),      # equal strings, distinct objects
    pd.Series(np.array(["step", "interval", None, np.nan, "step", "x"], dtype=object)),
    pd.Series(np.full(4, np.nan, dtype=object)),                             # one NaN object everywhere
    pd.Series(np.array(["step", "interval"] * 3, dtype=object))[::2],        # a strided view
    pd.Series(["step", "interval", "step"]),                                 # pandas' own string dtype
    pd.Series([], dtype=object),
    # past label_arrays.MIN_ROWS: a few labels compared once each (missing values, equal str at other addresses)
    pd.Series(np.array([("step", "interval", None, np.nan, "st" + "ep", "FULL")[i % 6] for i in range(6000)], dtype=object)),
    pd.Series(np.array([str(i % 4000) for i in range(6000)], dtype=object)),  # not a label column: per row
]


@pytest.mark.parametrize("col", COLUMNS)
@pytest.mark.parametrize("value", ["step", "interval", "unknown"])
def test_equal_is_the_per_row_comparison(col, value):
    got = equal(col, value)
    assert got.dtype == bool and got.tolist() == (col == value).fillna(False).astype(bool).tolist()


def test_label_helpers_agree_with_astype_str():
    col = COLUMNS[2]
    assert as_labels(col, "nan").tolist() == col.fillna("nan").astype(str).tolist()
    assert label_in(col, ["step", "x"]).tolist() == col.fillna("").astype(str).isin(["step", "x"]).tolist()
