"""The Spike page's device-breakdown panel (page data, callback output) and its figure builder."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from mixdiag.dashboard import figures
from mixdiag.dashboard.pages import sources, spike
from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.dashboard.store import DataStore
from mixdiag.exporter import DiagnosisExporter
from tests.mixdiag.test_breakdown import C, C_SLOW, SLOW_RANK, ep_export

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_panel_names_the_straggler_of_the_chosen_step(tmp_path):
    ep_export(tmp_path / "ep4.sqlite")
    store = DataStore(DashboardConfig.from_data_path(tmp_path), DiagnosisExporter())
    key = sources.on_load(store, "sources-load-btn", "ep4.sqlite", None, None)[0]
    bd = store.get(key["id"]).breakdown()
    row = bd.stragglers.iloc[0]
    panel = spike.on_breakdown(store, key, f"{row['instance']}|{int(row['step'])}")
    text = str(panel)
    assert "spike-breakdown-table" in text
    assert f"rank {SLOW_RANK}'s fused_moe_kernel ran {C_SLOW / C:.1f}x longer" in text
    graphs = [c for c in panel.children if getattr(c, "figure", None) is not None]
    assert graphs and "fused_moe_kernel" in graphs[0].figure.data[0].y


def test_panel_without_device_activity_says_so(tmp_path):
    shutil.copy(FIX / "kineto" / "cpu_only_torch2.13.json", tmp_path / "cpu.json")
    store = DataStore(DashboardConfig.from_data_path(tmp_path), DiagnosisExporter())
    key = sources.on_load(store, "sources-load-btn", "cpu.json", None, None)[0]
    panel = spike.on_breakdown(store, key, "cpu|0")
    assert panel.id == "spike-breakdown-none" and "no device activity" in str(panel.children)
    assert spike.on_breakdown(store, key, None) == ""


def test_kernel_share_figure_groups_classes():
    k = pd.DataFrame({"instance": "i", "rank": 0, "step_class": ["spike", "spike", "decode"],
                      "kernel": ["a", "b", "a"], "time_s": [0.003, 0.001, 0.001], "calls": [3, 1, 2],
                      "share": [0.75, 0.25, 1.0]})
    fig = figures.kernel_share_figure(k, "t")
    assert [t.name for t in fig.data] == ["spike", "decode"] and list(fig.data[0].x) == [0.75, 0.25]
    assert figures.kernel_share_figure(k.iloc[:0]).layout.annotations  # empty: says so
