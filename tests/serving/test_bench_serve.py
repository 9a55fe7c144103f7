"""benchmarks/bench_serve.py's verdict: "met" only when both servers stayed below saturation."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "benchmarks" / "bench_serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _summary(itl_p99, tok_s, ttft_p99):
    return {"itl_s": {"p99": itl_p99}, "output_tokens_per_s": tok_s, "ttft_s": {"p99": ttft_p99}}


@pytest.mark.parametrize("mix_ttft, pf_ttft, ratio_ok, below, met", [
    (0.5, 0.8, True, True, True),
    (0.5, 9.0, True, False, False),     # prefill_first saturated: good ratios mean nothing
    (None, 0.8, True, False, False),    # no first token at all
    (0.5, 0.8, False, True, False),
])
def test_target_is_met_only_below_saturation(mix_ttft, pf_ttft, ratio_ok, below, met):
    b = _bench()
    mix = _summary(0.010 if ratio_ok else 0.050, 950.0, mix_ttft)
    pf = _summary(0.050, 1000.0, pf_ttft)
    out = b.judge(mix, pf)
    assert out["below_saturation"] is below and out["target_met"] is met
    assert out["verdict"].startswith("met") is met
    if not below:
        assert "saturated" in out["verdict"]
