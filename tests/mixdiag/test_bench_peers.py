"""benchmarks/bench_peers.py's pure part: which peer summaries mixdiag gives, computed from analyze --json keys."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import peers_caps  # noqa: E402

SPIKES = [{"cause": "mixing", "step": 3}, {"cause": "ep_hotspot", "step": 9}]


def status(rows):
    return {r["summary"]: r["mixdiag"] for r in rows}


def test_without_breakdown_or_diff_says_not_in_this_build():
    rows = peers_caps.capability_rows([{"verdict": "x", "spikes": SPIKES, "by_cause": {}}], diff_available=False)
    got = status(rows)
    assert set(got) == set(peers_caps.SUMMARIES)
    assert got["cause per spike"] == "yes"
    assert all(v == peers_caps.NOT_IN_BUILD for k, v in got.items() if k != "cause per spike")


def test_breakdown_keys_are_found_at_any_depth_and_through_lists():
    doc = {"spikes": SPIKES, "breakdown": {"instances": [{"instance": "e0", "classes": {"decode": {
        "top_kernels": [{"name": "gemm", "share": 0.4}], "gpu_utilization": 0.8,
        "idle": {"host_wait_s": 1.0, "kernel_wait_s": 0.1, "other_s": 0.0},
        "comm": {"time_s": 0.2, "overlap_share": 0.5}}}}]}}
    got = status(peers_caps.capability_rows([doc], diff_available=True))
    assert got["per-GPU top kernels"] == got["GPU utilisation"] == got["idle split host/kernel/other"] == "yes"
    assert got["comm time + overlap"] == "yes" and got["before/after diff"] == "yes"
    assert got["memcpy volume/bandwidth"] == "no" and got["straggler ranks"] == "no"  # present section, absent keys


def test_a_summary_needs_every_one_of_its_keys():
    half = {"breakdown": {"idle": {"host_wait_s": 1.0}}}  # no kernel-wait: not the HTA split
    assert peers_caps.mixdiag_gives("idle split host/kernel/other", [half], False)[0] == "no"
    kernel_wait_only = {"breakdown": {"kernel_wait_s": 1.0}}  # 'kernel_wait' is not a top-kernels table
    assert peers_caps.mixdiag_gives("per-GPU top kernels", [kernel_wait_only], False)[0] == "no"


def test_no_spikes_means_no_cause_evidence():
    assert peers_caps.mixdiag_gives("cause per spike", [{"spikes": []}], False)[0] == "no"
    assert peers_caps.mixdiag_gives("cause per spike", [{"spikes": [{"cause": None}]}], False)[0] == "no"


def test_format_table_aligns_columns():
    text = peers_caps.format_table([{"a": "1", "b": "long value"}, {"a": "22"}], ["a", "b"])
    lines = text.splitlines()
    assert lines[0].startswith("a   b") and lines[2].startswith("1   long value") and lines[3] == "22"
