"""Text and HTML renderings of the device breakdown (mixdiag/report_breakdown.py) and the analyze surfaces."""
from __future__ import annotations

import json
import subprocess
import sys

from mixdiag.diagnosis.breakdown import Breakdown
from mixdiag.report_breakdown import breakdown_html, breakdown_lines
from tests.mixdiag.test_breakdown import ep  # noqa: F401  (the 4-rank EP export, built once per module)
from tests.mixdiag.test_breakdown import ep_export


def test_text_section_lists_classes_kernels_copies_and_the_straggler(ep):  # noqa: F811
    _, b = ep
    text = "\n".join(breakdown_lines(b))
    assert "Device breakdown by step class" in text
    assert "fused_moe_kernel" in text and "H2D" in text
    assert "rank 1's fused_moe_kernel ran 4.1x longer" in text and "waited in ncclDevKernel_AllToAll_RING_LL" in text
    assert breakdown_lines(Breakdown())[-1].startswith("Device breakdown: no device activity")


def test_html_section_is_escaped_tables(ep):  # noqa: F811
    _, b = ep
    page = breakdown_html(b)
    assert page.count("<table>") >= 4 and "<script" not in page
    assert "rank 1&#x27;s fused_moe_kernel ran 4.1x longer" in page
    assert "no device activity" in breakdown_html(Breakdown())


def test_analyze_json_html_and_no_breakdown(tmp_path):
    path = ep_export(tmp_path / "ep4.sqlite")
    cmd = [sys.executable, "-m", "mixdiag", "analyze", str(path)]
    doc = json.loads(subprocess.run(cmd + ["--json", "--html", str(tmp_path / "r.html")], capture_output=True,
                                    text=True, check=True).stdout)
    bd = doc["breakdown"]
    assert bd["status"] == "ok" and len(bd["stragglers"]) == 1 and bd["stragglers"][0]["kernel"] == "fused_moe_kernel"
    assert {r["rank"] for r in bd["utilisation"]} == {0, 1, 2, 3}
    assert "Device breakdown by step class" in (tmp_path / "r.html").read_text()
    plain = json.loads(subprocess.run(cmd + ["--json", "--no-breakdown"], capture_output=True, text=True,
                                      check=True).stdout)
    assert "breakdown" not in plain and plain["by_cause"] == doc["by_cause"]
