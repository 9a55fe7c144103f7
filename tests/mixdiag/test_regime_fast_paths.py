"""The regime stage's shortcuts for a million rows answer what the plain computation answers: the
rolling-median skip of ``elevated``, unfilled columns read as a broadcast, the split written in place
(hand-built and real logs; each path against its plain form)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_cases as dc  # noqa: E402

from mixdiag.collectors import load  # noqa: E402
from mixdiag.collectors.logs import vllm_log  # noqa: E402
from mixdiag.diagnosis import diagnose  # noqa: E402
from mixdiag.diagnosis.config import RegimeConfig  # noqa: E402
from mixdiag.diagnosis.detection import regimes  # noqa: E402
from mixdiag.diagnosis.row_arrays import RowArrays  # noqa: E402
from mixdiag.diagnosis.rules.decomposition import features, nnls, split  # noqa: E402
from tests.helpers.vllm_mixed_log import mixed_log  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
LOGS = ["vllm_log_31193.txt", "vllm_log_37307.txt", "sglang_log_22166.txt"]


def _plain_elevated(lat, centre, sigma, cfg=RegimeConfig()):
    bar = np.maximum(cfg.ratio * centre, cfg.sigma_k * sigma + centre)
    smooth = pd.Series(lat).rolling(cfg.smooth_rows, center=True, min_periods=cfg.smooth_rows // 2 + 1).median()
    with np.errstate(invalid="ignore"):
        return np.isfinite(smooth.to_numpy()) & np.isfinite(bar) & (smooth.to_numpy() > bar)


@pytest.mark.parametrize("seed", range(40))
def test_elevated_is_the_rolling_median_against_the_bar(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    lat = rng.random(n) * 0.01 + 0.01
    lat[rng.random(n) < rng.random() * 0.6] *= rng.uniform(1, 4)  # from none to most rows slow
    lat[rng.random(n) < 0.05 * (seed % 3)] = np.nan
    lat[rng.random(n) < 0.02 * (seed % 2)] = np.inf
    centre = np.full(n, 0.012)
    centre[rng.random(n) < 0.1 * (seed % 4 == 0)] = np.nan
    sigma = rng.random(n) * 0.001
    assert regimes.elevated(lat, centre, sigma).tolist() == _plain_elevated(lat, centre, sigma).tolist()


def test_the_skip_holds_at_the_edge_of_half_a_window():
    cfg = RegimeConfig()
    need = (cfg.smooth_rows // 2 + 2) // 2  # slow rows a window's median needs at the least
    for slow in (need - 1, need, cfg.smooth_rows // 2 + 1):
        lat = np.full(200, 0.010)
        lat[100:100 + slow] = 0.050
        centre, sigma = np.full(200, 0.010), np.zeros(200)
        assert regimes.elevated(lat, centre, sigma).tolist() == _plain_elevated(lat, centre, sigma).tolist()


def _timelines(tmp_path):
    out = [load(str(FIX / name)) for name in LOGS]
    p = tmp_path / "engine.log"
    p.write_bytes(mixed_log(3000))
    out.append(vllm_log.read(p, instance="v"))
    out.append(dc.build(700, {k: dict(expert_imbalance=4.0, dur=0.050) for k in range(300, 450)}))
    return out


def test_unfilled_columns_read_as_to_numeric_reads_them(tmp_path):
    seen = 0
    for tl in _timelines(tmp_path)[:4]:
        frame = diagnose(tl).steps
        rows = RowArrays(frame)
        for col in frame.columns:
            if frame[col].dtype != np.float64:
                continue
            seen += frame[col].to_numpy().strides == (0,)
            want = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype="float64")
            np.testing.assert_array_equal(rows.num(col), want)
            pos = np.arange(0, len(frame), 2)
            np.testing.assert_array_equal(rows.take(pos).num(col), want[pos])
    assert seen  # the logs leave documented columns unfilled: the broadcast path ran


def _plain_split(latency, centre, weight, feats):
    """decomposition.split before it wrote into its output in place."""
    ok = np.isfinite(latency) & np.isfinite(centre)
    y = np.where(ok, np.clip(latency - centre, 0, None), 0.0)
    out = np.zeros((len(y), feats.shape[1] + 1))
    if not ok.any() or not y.any():
        return out
    present = ((feats != 0) & ok[:, None]).sum(axis=0) >= 1
    beta = np.zeros(feats.shape[1])
    if present.any():
        beta[present] = nnls(feats[ok][:, present], y[ok], weight[ok])
    contrib = feats * beta
    total = contrib.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cap = np.where(total > y, y / total, 1.0)
    contrib *= np.where(np.isfinite(cap), cap, 0.0)[:, None]
    np.multiply(contrib, weight[:, None], out=out[:, :-1])
    out[:, -1] = (y - contrib.sum(axis=1)).clip(0) * weight
    return out


def test_split_and_regimes_are_the_plain_ones_on_real_rows(tmp_path, monkeypatch):
    for tl in _timelines(tmp_path):
        d = diagnose(tl)
        for inst, rows in d.steps.groupby("instance", sort=True):
            view = regimes.latency_view(rows)
            if view is None:
                continue
            centre, _ = regimes.reference(view.latency_s, view.strata, view.use)
            sub = RowArrays(rows).take(view.positions)
            got = split(view.latency_s, centre, view.weight, features(sub, view.granularity))
            want = _plain_split(view.latency_s, centre, view.weight, features(sub, view.granularity))
            assert got.tobytes() == want.tobytes()
        # the whole stage with the median skip off and the converted columns kept: the same JSON
        with monkeypatch.context() as m:
            m.setattr(regimes, "_median_may_exceed", lambda *a: True)
            m.setattr(RowArrays, "forget", lambda self: None)
            plain = diagnose(tl)
        assert d.to_json() == plain.to_json()
