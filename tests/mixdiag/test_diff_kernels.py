"""Step-class kernel times side by side over the breakdown's kernels frame (mixdiag/diagnosis/diff/kernels.py),
on small hand-built frames."""
from pathlib import Path

import pandas as pd
import pytest

from mixdiag.diagnosis.diff.kernels import KERNEL_DIFF_COLUMNS, kernel_diff, kernels_of
from mixdiag.errors import UserError


def _frame(rows):
    df = pd.DataFrame(rows, columns=["instance", "rank", "step_class", "kernel", "time_s"])
    df["share"] = df["time_s"] / df.groupby(["instance", "rank", "step_class"])["time_s"].transform("sum")
    return df


BEFORE = _frame([
    ("e0", 0, "mixed", "fused_moe", 3.0), ("e0", 1, "mixed", "fused_moe", 1.0),   # two ranks: summed
    ("e0", 0, "mixed", "flash_attn", 4.0),
    ("e0", 0, "decode", "fused_moe", 1.0), ("e0", 0, "decode", "all_to_all", 1.0),
])
AFTER = _frame([
    ("e0", 0, "mixed", "fused_moe", 2.0), ("e0", 1, "mixed", "fused_moe", 2.0),
    ("e0", 0, "mixed", "flash_attn", 1.0),
    ("e0", 0, "decode", "fused_moe", 1.0), ("e0", 0, "decode", "nccl_allreduce", 3.0),
])


def _row(out, cls, kernel):
    r = out[(out["step_class"] == cls) & (out["kernel"] == kernel)]
    assert len(r) == 1
    return r.iloc[0]


@pytest.mark.parametrize("cls, kernel, tb, ta, sb, sa, status", [
    ("mixed", "fused_moe", 4.0, 4.0, 0.5, 0.8, "both"),       # same seconds, larger share: attention fell
    ("mixed", "flash_attn", 4.0, 1.0, 0.5, 0.2, "both"),
    ("decode", "all_to_all", 1.0, 0.0, 0.5, 0.0, "gone"),
    ("decode", "nccl_allreduce", 0.0, 3.0, 0.0, 0.75, "new"),
    ("decode", "fused_moe", 1.0, 1.0, 0.5, 0.25, "both"),
])
def test_kernel_diff_sums_ranks_and_recomputes_shares(cls, kernel, tb, ta, sb, sa, status):
    out = kernel_diff(BEFORE, AFTER)
    assert list(out.columns) == KERNEL_DIFF_COLUMNS
    r = _row(out, cls, kernel)
    assert (r.time_before_s, r.time_after_s, r.status) == (tb, ta, status)
    assert r.share_before == pytest.approx(sb) and r.share_after == pytest.approx(sa)
    assert r.change_s == pytest.approx(ta - tb) and r.share_change == pytest.approx(sa - sb)


def test_shares_sum_to_one_per_class_and_rows_sort_by_share_change():
    out = kernel_diff(BEFORE, AFTER)
    for _, g in out.groupby("step_class"):
        assert g["share_before"].sum() == pytest.approx(1.0) and g["share_after"].sum() == pytest.approx(1.0)
        assert list(g["share_change"].abs()) == sorted(g["share_change"].abs(), reverse=True)


def test_identical_frames_change_nothing():
    out = kernel_diff(BEFORE, BEFORE)
    assert (out["change_s"] == 0).all() and (out["share_change"] == 0).all() and set(out["status"]) == {"both"}


@pytest.mark.parametrize("bad, msg", [
    (BEFORE.drop(columns=["step_class"]), "lacks column"),
    (BEFORE.assign(time_s=-1.0), "negative"),
])
def test_bad_frames_are_one_line_errors(bad, msg):
    with pytest.raises(UserError, match=msg):
        kernel_diff(bad, AFTER)


def test_a_capture_without_device_activity_gives_no_frame():
    """A log's timeline holds no device activity: no kernels frame, so the diff says so instead of
    comparing empty tables."""
    from mixdiag.collectors import load
    from mixdiag.diagnosis import diagnose
    tl = load(str(Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "vllm_log_37307.txt"))
    assert kernels_of(tl, diagnose(tl)) is None
