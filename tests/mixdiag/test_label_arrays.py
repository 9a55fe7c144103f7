"""label_arrays: factorising by object identity gives pandas' own codes and uniques, and a label
column built by code is the column pandas builds from the strings; the vLLM reader's frame is the
same with these paths on (every row count) and off, on real logs."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag import label_arrays
from mixdiag.collectors.logs import vllm_log
from mixdiag.label_arrays import factorize_objects, str_column
from mixdiag.schema import repeat_label
from tests.helpers.vllm_mixed_log import mixed_log

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _objects(values) -> np.ndarray:
    a = np.empty(len(values), dtype=object)
    a[:] = values
    return a


_RNG = np.random.default_rng(0)
ARRAYS = {
    "shared labels": repeat_label(3000, "step"),
    "few labels, some missing": _objects([("decode", "mixed", None, np.nan, "idle")[i] for i in _RNG.integers(0, 5, 3000)]),
    "equal str, distinct objects": _objects(["".join(("de", "code")) if i % 3 else "mixed" for i in range(3000)]),
    "numbers equal across types": _objects([(1, 1.0, True, 0, "1")[i] for i in _RNG.integers(0, 5, 3000)]),
    "all distinct": _objects([str(i) for i in range(3000)]),
    "all NaN": _objects([np.nan] * 3000),
    "strided view": repeat_label(6000, "step")[::2],
    "short": _objects(["a", "b", "a"]),
}


@pytest.mark.parametrize("name", ARRAYS)
def test_factorize_objects_is_pandas_factorize(name):
    a = ARRAYS[name]
    codes, uniq = factorize_objects(a)
    want_codes, want_uniq = pd.factorize(a, use_na_sentinel=True)
    assert codes.tolist() == want_codes.tolist()
    assert [(type(u), u) for u in uniq] == [(type(u), u) for u in want_uniq]


@pytest.mark.parametrize("name", ARRAYS)
def test_str_column_is_the_column_pandas_builds(name):
    a = ARRAYS[name]
    pd.testing.assert_frame_equal(pd.DataFrame({"c": str_column(a)}), pd.DataFrame({"c": a}), check_exact=True)


def _read(path: Path, fast: bool):
    return vllm_log.read(path, instance="v", fast=fast)


@pytest.mark.parametrize("name", [p.name for p in sorted(FIX.glob("vllm_log_*.txt"))] + ["mixed"])
@pytest.mark.parametrize("fast", [True, False])
def test_vllm_frame_is_the_same_with_label_paths_off(name, fast, tmp_path, monkeypatch):
    path = FIX / name
    if name == "mixed":  # every line kind, two DP engines, a few thousand rows
        path = tmp_path / "engine.log"
        path.write_bytes(mixed_log(3000))
    monkeypatch.setattr(label_arrays, "MIN_ROWS", 0)  # the label paths on small fixtures too
    got = _read(path, fast)
    monkeypatch.setattr(label_arrays, "MIN_ROWS", 10 ** 12)  # off: pandas converts str by str
    want = _read(path, fast)
    pd.testing.assert_frame_equal(got.steps, want.steps, check_exact=True)
    pd.testing.assert_frame_equal(got.series, want.series, check_exact=True)
    assert got.meta == want.meta
