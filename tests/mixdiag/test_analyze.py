import json
import sys
from pathlib import Path

import pytest

from mixdiag.cli import main
from mixdiag.diagnosis import diagnose
from mixdiag.report import evidence_summary, render

sys.path.insert(0, str(Path(__file__).parent))
from diag_cases import EXPECTED, build  # noqa: E402


@pytest.fixture
def run_dir(tmp_path):
    return build().save(tmp_path / "run")


def test_analyze_json_document(run_dir, capsys):
    assert main(["analyze", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"steps", "itl", "spikes", "by_cause"}
    assert set(doc["steps"]) >= {"total", "by_kind"} and set(doc["itl"]) >= {"p50_s", "p99_s", "max_s"}
    assert {s["step"]: s["cause"] for s in doc["spikes"]} == EXPECTED
    for s in doc["spikes"]:
        assert set(s) == {"instance", "step", "t_s", "t_start_s", "t_end_s", "itl_s", "baseline_s", "cause",
                          "confidence", "evidence", "missing_signals", "shares"}
        assert s["t_start_s"] <= s["t_end_s"]
        assert not s["shares"] or abs(sum(s["shares"].values()) - 1) < 0.01  # shares of the row's excess


def test_analyze_human_report_and_html(run_dir, tmp_path, capsys):
    out_html = tmp_path / "r.html"
    assert main(["analyze", str(run_dir), "--html", str(out_html), "-q"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert "7 TPOT spikes" in first and "several causes" in first
    for cause in set(EXPECTED.values()):
        assert cause in out
    text = out_html.read_text()
    assert "<script" in text and "cdn" not in text.lower().split("</script>")[-1]
    assert "Plotly.newPlot" in text or "newPlot" in text
    assert "predicted height" in text and "spike: mixing" in text
    # never overwrites
    assert main(["analyze", str(run_dir), "--html", str(out_html)]) == 2
    assert "exists" in capsys.readouterr().err


def test_missing_input_is_one_line_exit_2(capsys):
    assert main(["analyze", "/no/such/run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no such input") and len(err.strip().splitlines()) == 1


def test_no_input_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["analyze"])
    assert e.value.code == 2
    assert "required" in capsys.readouterr().err


def test_render_lists_top_spikes_and_missing_signals():
    d = diagnose(build(drop=("sm_active",)))
    text = render(d, top=3)
    assert text.count("engine0 ") >= 3
    assert "missing signals: " in text and "sm_active" in text


@pytest.mark.parametrize("cause,ev,want", [
    ("mixing", {"prefill_tokens": 512.0, "decode_rows": 8.0, "graph_mode": "PIECEWISE"}, "prefill 512 tok + decode 8 rows"),
    ("ep_hotspot", {"expert_imbalance": 4.0, "imbalance_rel": 3.2}, "imbalance 4.00"),
    ("host_stall", {"gap_before_s": 0.1, "gap_share_of_excess": 0.9}, "100.0 ms"),
    ("unknown", {"kind": "decode", "reason": "no cause's evidence present"}, "no cause"),
])
def test_evidence_summary(cause, ev, want):
    assert want in evidence_summary(cause, ev)
