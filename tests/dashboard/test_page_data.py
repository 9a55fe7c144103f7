"""Page data of the Timeline and Spike pages: Timeline view, spike detail with the ledger's predicted height."""
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from mixdiag.dashboard.pages.spike import LedgerChoice, ledger_height, spike_detail
from mixdiag.dashboard.pages.timeline import default_instance, timeline_view
from mixdiag.ledger.device_model import device, predict
from mixdiag.diagnosis import diagnose
from mixdiag.ledger.shapes import BatchShape, resolve
from mixdiag.schema import Timeline


@pytest.fixture(scope="module")
def run(faulty_timeline):
    return faulty_timeline, diagnose(faulty_timeline)


def test_timeline_view_is_relative_and_sorted(run):
    tl, d = run
    v = timeline_view(tl, d, "engine0")
    assert v.t0_s == tl.span()[0]
    assert v.itl["t_rel_s"].is_monotonic_increasing and v.itl["t_rel_s"].min() >= 0
    assert len(v.itl) == len(tl.itl())
    assert len(v.spikes) == len(d.spikes)
    assert np.allclose(v.spikes["t_rel_s"] + v.t0_s, d.spikes.sort_values("t_s")["t_s"])
    assert v.sm_quality == "estimated" and v.has_expert and v.has_kv


def test_timeline_view_without_tokens_uses_interval_quantiles():
    steps = pd.DataFrame({"instance": "srv", "step": range(4), "t_start_s": [0.0, 10, 20, 30],
                          "t_end_s": [10.0, 20, 30, 40], "granularity": "interval", "kind": "unknown",
                          "itl_p99_s": [0.02, 0.02, 0.2, 0.02], "itl_p50_s": 0.02})
    tl = Timeline(steps, meta={"clock": "unix"})
    v = timeline_view(tl, diagnose(tl), "srv")
    assert v.itl_label == "ITL P99 per interval (s)"
    assert v.itl["itl_s"].tolist() == [0.02, 0.02, 0.2, 0.02]
    assert v.sm_quality == "absent" and not v.has_expert and not v.has_kv


def test_default_instance_has_most_spikes(make_timeline):
    a = make_timeline(instance="a", period=0)
    b = make_timeline(instance="b", period=20)
    tl = Timeline.concat([a, b])
    assert default_instance(tl, diagnose(tl)) == "b"


def test_spike_detail_of_a_mixed_spike_has_the_ledger_prediction(run):
    _, d = run
    mixed = d.spikes[d.spikes["cause"] == "mixing"].iloc[0]
    det = spike_detail(d, "engine0", int(mixed["step"]), neighbours=3)
    assert det.spike["cause"] == "mixing" and det.measured_s == pytest.approx(mixed["itl_s"])
    assert det.neighbours["step"].tolist() == list(range(int(mixed["step"]) - 3, int(mixed["step"]) + 4))
    assert dict(zip(det.evidence["key"], det.evidence["value"]))["prefill_tokens"] == "512"
    want = predict(resolve("glm-5.3"), BatchShape(prefill_tokens=512, decode_reqs=8, context_len=4096),
                   device("h200"))["height_x"]
    assert det.predicted_x == pytest.approx(want)
    assert det.predicted_s == pytest.approx(want * mixed["baseline_s"]) and det.predicted_key == "ledger"
    assert det.measured_x == pytest.approx(mixed["itl_s"] / mixed["baseline_s"])
    assert "glm-5.3 on h200" in det.prediction_basis


def test_decode_only_spike_has_no_ledger_prediction(run):
    _, d = run
    ep = d.spikes[d.spikes["cause"] == "ep_hotspot"].iloc[0]
    det = spike_detail(d, "engine0", int(ep["step"]))
    assert math.isnan(det.predicted_s) and det.predicted_key is None
    assert "no prefill chunk" in det.prediction_basis


def test_prediction_in_the_evidence_wins(run):
    _, d = run
    sp = d.spikes.copy()
    sp.at[0, "evidence"] = dict(sp.at[0, "evidence"], ledger_predicted_s=0.05)
    d2 = dataclasses.replace(d, spikes=sp)
    det = spike_detail(d2, "engine0", int(sp.at[0, "step"]))
    assert det.predicted_s == 0.05 and det.predicted_key == "ledger_predicted_s"


def test_no_spike_there(run):
    _, d = run
    assert spike_detail(d, "engine0", 1) is None
    assert spike_detail(d, "nope", int(d.spikes.iloc[0]["step"])) is None


def test_ledger_height_counts_speculative_rows():
    row = {"prefill_tokens": 256.0, "decode_reqs": 4.0, "decode_rows": 12.0}
    h, basis = ledger_height(row, LedgerChoice("deepseek-v3.2", "h100", 2048))
    want = predict(resolve("deepseek-v3.2"), BatchShape(prefill_tokens=256, decode_reqs=4, spec_tokens=2,
                                                        context_len=2048), device("h100"))["height_x"]
    assert h == pytest.approx(want) and "deepseek-v3.2 on h100" in basis


def test_timeline_view_carries_the_instance_episodes_on_its_clock(hotspot_timeline):
    d = diagnose(hotspot_timeline)
    v = timeline_view(hotspot_timeline, d, "engine0")
    e = d.regimes.episodes.iloc[0]
    assert len(v.episodes) == 1 and v.episodes.iloc[0]["cause"] == "ep_hotspot"
    assert v.episodes.iloc[0]["t_start_rel_s"] == pytest.approx(e["t_start_s"] - v.t0_s)
    assert v.episodes.iloc[0]["share"] == e["shares"]["ep_hotspot"]
    assert not len(timeline_view(hotspot_timeline, d, "other").episodes)  # another instance's episodes stay out


def test_timeline_view_of_a_real_gc_debug_capture_has_the_pause_panel():
    """Real vLLM 0.32 scrapes + operator log with its GC debugger on (tests/fixtures/vllm032/gc_pause)."""
    from pathlib import Path

    from mixdiag.collectors import load
    fix = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "gc_pause"
    tl = load([str(fix / "scrapes"), str(fix / "vllm.log")])
    v = timeline_view(tl, diagnose(tl), tl.instances[0])
    assert v.has_pause and v.steps["host_pause_s"].max() == pytest.approx(0.547427, abs=1e-6)
    # without the log nothing timed a pause
    tl = load(str(fix / "scrapes"))
    assert not timeline_view(tl, diagnose(tl), tl.instances[0]).has_pause
