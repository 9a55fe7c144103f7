"""dcgm: the README capture, SM-activity choice, overlap mapping onto steps, scrape directories."""
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from mixdiag.collectors.gpu import dcgm
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
UUID = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"


def test_readme_capture_has_no_sm_activity_and_says_so():
    steps = pd.DataFrame({"instance": ["e"], "step": [0], "t_start_s": [0.0], "t_end_s": [1.0],
                          "granularity": ["step"], "kind": ["decode"]})
    tl = dcgm.read(FIX / "dcgm_exporter_readme.txt", steps=steps, t_s=0.5)
    src = tl.meta["sources"][0]
    assert (src["lines_total"], src["lines_parsed"], src["lines_ignored"]) == (11, 3, 8)  # by grep
    assert tl.meta["sm_active_metric"] is None
    assert any("commented out" in n for n in tl.meta["notes"])
    assert set(tl.series["name"]) == {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP"}
    assert tl.series.set_index("name").loc["DCGM_FI_DEV_SM_CLOCK", "labels"] == f"UUID={UUID},gpu=0"
    assert len(tl.steps) == 0  # nothing to map: the steps are not returned as if enriched


@pytest.mark.parametrize("present,metric,fallback,want", [
    (dcgm.SM_METRICS, "auto", True, ("DCGM_FI_PROF_SM_ACTIVE", "measured")),
    (dcgm.SM_METRICS[1:], "auto", True, ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "estimated")),
    (dcgm.SM_METRICS[2:], "auto", True, ("DCGM_FI_PROF_SM_OCCUPANCY", "estimated")),
    (("DCGM_FI_DEV_GPU_UTIL",), "auto", True, ("DCGM_FI_DEV_GPU_UTIL", "estimated")),
    (("DCGM_FI_DEV_GPU_UTIL",), "auto", False, (None, "absent")),
    (dcgm.SM_METRICS, "DCGM_FI_DEV_GPU_UTIL", True, ("DCGM_FI_DEV_GPU_UTIL", "estimated")),
])
def test_choose_metric(present, metric, fallback, want):
    assert dcgm.choose_metric(present, metric, fallback) == want


def test_choose_metric_unknown_forced_field():
    with pytest.raises(UserError, match="not in the DCGM data"):
        dcgm.choose_metric(["DCGM_FI_DEV_GPU_UTIL"], "DCGM_FI_PROF_SM_ACTIVE")


@pytest.mark.parametrize("start,end,want", [
    (0.5, 0.5, 0.2),      # instant inside the first sample's window (-1, 0]... -> next sample (0, 1]
    (0.0, 1.0, 0.2),      # exactly sample 1's window
    (0.5, 1.5, 0.5),      # half 0.2, half 0.8
    (1.0, 3.0, 0.5),      # 0.8 then 0.2
    (10.0, 11.0, math.nan),  # after the last sample
])
def test_overlap_mean(start, end, want):
    t = np.array([0.0, 1.0, 2.0, 3.0])
    v = np.array([0.9, 0.2, 0.8, 0.2])
    got = dcgm.overlap_mean(t, v, np.array([start]), np.array([end]))[0]
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


T = 1_700_000_000  # scrape files are named by unix time; offsets below are seconds after T


def _scrapes(tmp_path, values, util=None):
    """Timed dcgm-exporter scrapes (``<T + t>.prom``) from a real prometheus_client registry."""
    reg = CollectorRegistry()
    g = Gauge("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned.",
              ["gpu", "UUID", "Hostname"], registry=reg)
    u = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", ["gpu", "UUID", "Hostname"], registry=reg)
    for i, (t, per_gpu) in enumerate(values):
        for gpu, val in enumerate(per_gpu):
            g.labels(str(gpu), f"GPU-{gpu}", "node-1").set(val)
            u.labels(str(gpu), f"GPU-{gpu}", "node-1").set(100.0 if util is None else util[i])
        (tmp_path / f"{T + t}.prom").write_bytes(generate_latest(reg))
    return tmp_path


def test_scrape_dir_maps_sm_active_onto_steps(tmp_path):
    d = _scrapes(tmp_path, [(100, (0.1, 0.3)), (101, (0.9, 0.7)), (102, (0.2, 0.2))])
    steps = Timeline(pd.DataFrame({
        "instance": ["e0"] * 3, "step": [0, 1, 2], "t_start_s": [T + 100.2, T + 101.0, T + 101.5],
        "t_end_s": [T + 100.8, T + 101.0, T + 102.0],
        "granularity": ["step"] * 3, "kind": ["decode", "mixed", "decode"]}),
        meta={"sources": [{"format": "x"}], "signals": {"e0": {"kind": "measured"}}})
    tl = dcgm.read(d, steps=steps)
    assert tl.meta["sm_active_metric"] == "DCGM_FI_PROF_SM_ACTIVE"
    assert list(tl.steps["sm_active"]) == pytest.approx([0.8, 0.8, 0.2])  # GPU mean per sample window
    assert tl.meta["signals"]["e0"] == {"kind": "measured", "sm_active": "measured"}
    assert len(tl.meta["sources"]) == 1 + 3


def test_gpu_util_fallback_is_estimated_and_percent_scaled(tmp_path):
    d = _scrapes(tmp_path, [(0, (0.0,)), (1, (0.0,))], util=[50.0, 100.0])
    for name in (f"{T}.prom", f"{T + 1}.prom"):
        (d / name).write_text((d / name).read_text().replace("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_X"))
    steps = pd.DataFrame({"instance": ["e"], "step": [0], "t_start_s": [T + 0.5], "t_end_s": [T + 1.0],
                          "granularity": ["step"], "kind": ["decode"]})
    tl = dcgm.read(d, steps=steps)
    assert tl.meta["sm_active_metric"] == "DCGM_FI_DEV_GPU_UTIL"
    assert tl.steps["sm_active"][0] == pytest.approx(1.0)
    assert tl.meta["signals"]["e"]["sm_active"] == "estimated"
    assert any("not SM activity" in n for n in tl.meta["notes"])


def test_several_instances_need_gpu_map(tmp_path):
    d = _scrapes(tmp_path, [(0, (0.1, 0.9)), (1, (0.2, 0.8))])
    steps = pd.DataFrame({"instance": ["a", "b"], "step": [0, 0], "t_start_s": [T + 0.5] * 2, "t_end_s": [T + 1.0] * 2,
                          "granularity": ["step"] * 2, "kind": ["decode"] * 2})
    tl = dcgm.read(d, steps=steps)
    assert tl.steps["sm_active"].isna().all() and any("gpu_map" in n for n in tl.meta["notes"])
    tl = dcgm.read(d, steps=steps, gpu_map={"a": ["0"], "b": ["1"]})
    assert list(tl.steps["sm_active"]) == pytest.approx([0.2, 0.8])
    src = tl.series["instance"].iloc[0]  # the exporter's instance name qualifies the GPU number
    tl = dcgm.read(d, steps=steps, gpu_map={"a": [f"{src}/1"], "b": ["elsewhere/1"]})
    assert tl.steps["sm_active"][0] == pytest.approx(0.8) and math.isnan(tl.steps["sm_active"][1])


def test_not_dcgm():
    with pytest.raises(UserError, match="no DCGM"):
        dcgm.read(FIX / "sglang_metrics_docs.txt")


def test_sniff():
    assert dcgm.sniff((FIX / "dcgm_exporter_readme.txt").read_bytes(), "m")
    assert not dcgm.sniff((FIX / "vllm_metrics_11117.txt").read_bytes(), "m")


@pytest.mark.prometheus
def test_through_a_real_prometheus(prometheus_server, metrics_endpoint):
    import time

    reg = CollectorRegistry()
    g = Gauge("DCGM_FI_PROF_SM_ACTIVE", "SM active", ["gpu", "UUID", "Hostname"], registry=reg)
    g.labels("0", "GPU-0", "node-1").set(0.25)
    target = metrics_endpoint(reg)
    prom = prometheus_server([target], scrape_interval_s=0.5)
    prom.wait_for_samples("DCGM_FI_PROF_SM_ACTIVE", min_samples=2)
    t_low = time.time()
    g.labels("0", "GPU-0", "node-1").set(0.75)
    prom.wait_until("DCGM_FI_PROF_SM_ACTIVE", lambda r: r and float(r[0]["value"][1]) == 0.75)
    prom.wait_for_samples("DCGM_FI_PROF_SM_ACTIVE", min_samples=2)
    t_high = time.time()
    steps = pd.DataFrame({"instance": ["e"] * 2, "step": [0, 1], "t_start_s": [t_low - 0.6, t_high],
                          "t_end_s": [t_low - 0.6, t_high], "granularity": ["step"] * 2, "kind": ["decode"] * 2})
    tl = dcgm.read(prom.url, steps=steps, selector='{job="mixdiag"}', start=t_low - 3, end=t_high + 1.0, step_s=0.5)
    assert tl.meta["sm_active_metric"] == "DCGM_FI_PROF_SM_ACTIVE"
    assert list(tl.steps["sm_active"]) == pytest.approx([0.25, 0.75])
    assert set(tl.series["instance"]) == {target}


def _dcgm_scrape(sm: dict[str, float]) -> str:
    lines = ["# TYPE DCGM_FI_PROF_SM_ACTIVE gauge"]
    for gpu, v in sm.items():
        lines.append(f'DCGM_FI_PROF_SM_ACTIVE{{gpu="{gpu}",UUID="GPU-{gpu}",Hostname="n1"}} {v}')
    lines.append(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="GPU-0",Hostname="n1"}} 0.99')
    return "\n".join(lines) + "\n"


def test_timed_scrape_directory_fills_interval_sm_active(tmp_path):
    from mixdiag.collectors import load, registry

    d = tmp_path / "dcgm"
    d.mkdir()
    for k, (a, b) in enumerate([(0.1, 0.3), (0.5, 0.7), (0.9, 0.9), (0.2, 0.2)]):
        (d / f"{1_700_000_000 + k}.prom").write_text(_dcgm_scrape({"0": a, "1": b}))
    assert registry.detect(d) == "dcgm"
    tl = load(str(d))
    st = tl.steps
    # interval (t_{k-1}, t_k] takes the exporter's average ending at t_k, GPUs averaged
    assert list(st["sm_active"].round(6)) == [0.6, 0.9, 0.2]
    assert tl.meta["signals"]["dcgm"]["sm_active"] == "measured"
    assert tl.meta["sm_active_metric"] == "DCGM_FI_PROF_SM_ACTIVE"


@pytest.mark.parametrize("text,want", [
    ("a:8000=0,a:8000=1,b:8000=n1:9400/0", {"a:8000": ["0", "1"], "b:8000": ["n1:9400/0"]}),
    ("", {}),
])
def test_parse_gpu_map(text, want):
    assert dcgm.parse_gpu_map(text) == want


@pytest.mark.parametrize("bad", ["a:8000", "=0", "a="])
def test_parse_gpu_map_bad(bad):
    with pytest.raises(UserError, match="--gpu-map"):
        dcgm.parse_gpu_map(bad)


def test_fill_intervals_with_gpu_map():
    steps = pd.DataFrame({"instance": ["vllm:8000"] * 2, "step": [0, 1], "t_start_s": [0.0, 1.0],
                          "t_end_s": [1.0, 2.0], "granularity": ["interval"] * 2, "kind": ["unknown"] * 2})
    series = pd.DataFrame({"instance": ["n1:9400"] * 4, "name": ["DCGM_FI_PROF_SM_ACTIVE"] * 4,
                           "labels": ["gpu=0", "gpu=1", "gpu=0", "gpu=1"], "t_s": [1.0, 1.0, 2.0, 2.0],
                           "value": [0.2, 0.9, 0.4, 0.9]})
    tl = dcgm.fill_intervals(Timeline(steps, None, series, {}), {"vllm:8000": ["n1:9400/0"]})
    assert list(tl.steps["sm_active"]) == pytest.approx([0.2, 0.4])
    assert tl.meta["signals"]["vllm:8000"]["sm_active"] == "measured"


@pytest.mark.parametrize("fmt,filled", [("prom-http", True), ("prom-endpoint", True), ("prom-text", False)])
def test_load_fills_gpu_series_once_for_url_formats(monkeypatch, fmt, filled):
    """collectors.load (not each reader) maps a Prometheus window's own DCGM series onto its rows."""
    from types import SimpleNamespace

    from mixdiag.collectors import load, registry

    steps = pd.DataFrame({"instance": ["n1:9400"] * 2, "step": [0, 1], "t_start_s": [0.0, 1.0],
                          "t_end_s": [1.0, 2.0], "granularity": ["interval"] * 2, "kind": ["unknown"] * 2})
    series = pd.DataFrame({"instance": ["n1:9400"] * 2, "name": ["DCGM_FI_PROF_SM_ACTIVE"] * 2,
                           "labels": ["gpu=0"] * 2, "t_s": [1.0, 2.0], "value": [0.3, 0.6]})
    fake = SimpleNamespace(FORMAT=fmt, sniff=lambda head, name: False,
                           read=lambda src, **kw: Timeline(steps, None, series, {"clock": "unix"}))
    monkeypatch.setattr(registry, "module", lambda f: fake)
    tl = load("http://n1:9400/metrics", format=fmt)
    assert bool(tl.steps["sm_active"].notna().any()) is filled
    if filled:
        assert list(tl.steps["sm_active"]) == pytest.approx([0.3, 0.6])
        assert sum("sm_active of" in n for n in tl.meta["notes"]) == 1
