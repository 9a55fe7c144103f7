"""`mixdiag diff BEFORE AFTER` end to end: text, --json, --html, --tuned; bad input is one line and exit 2."""
import html as html_mod
import json
import shutil
from pathlib import Path

import pytest

from mixdiag.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_identical_inputs_are_no_change(small_chunk_runs, capsys):
    run = str(small_chunk_runs[128])
    rc, out, err = _run(["diff", run, run, "-q"], capsys)
    assert rc == 0 and out.startswith("No change:") and "time-block bootstrap" in out
    rc, out, _ = _run(["diff", run, run, "--json", "-q"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["no_change"] and doc["comparable"] and doc["headline"].startswith("No change")
    assert {r["verdict"] for r in doc["metrics"]} == {"no change"}


def test_two_runs_json_html_and_a_comma_joined_side(small_chunk_runs, tmp_path, capsys):
    a, b = str(small_chunk_runs[128]), str(small_chunk_runs[64])
    html = tmp_path / "diff.html"
    rc, out, err = _run(["diff", a, b, "--json", "-q", "--html", str(html)], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["before"]["inputs"] == [a] and doc["after"]["inputs"] == [b]
    assert [r["metric"] for r in doc["metrics"]] == ["itl_p50_s", "itl_p99_s", "ttft_p50_s", "ttft_p99_s"]
    assert doc["budget"][-1]["cause"] == "total" and doc["kernels"] is None
    assert doc["kernels_note"] == "no device trace on either side" and doc["prediction"] is None
    text = html.read_text()
    assert 'id="excess"' in text and "Spike excess by cause" in text and html_mod.escape(doc["headline"]) in text
    rc, _, err = _run(["diff", a, b, "--html", str(html)], capsys)  # never overwritten
    assert rc == 2 and "exists" in err
    # one side read from several paths: PATH,PATH (here a run directory and a log of another server)
    log = str(FIX / "logs" / "vllm_log_37307.txt")
    rc, out, _ = _run(["diff", f"{a},{log}", a, "--json", "-q"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["before"]["inputs"] == [a, log] and not doc["comparable"]


def test_tuned_prediction_is_shown(small_chunk_runs, tmp_path, capsys):
    a, b = str(small_chunk_runs[128]), str(small_chunk_runs[64])
    saved = tmp_path / "tune.json"
    rc, out, _ = _run(["tune", a, "--knob", "chunk_size=64", "--jobs", "1", "-q", "--save", str(saved)], capsys)
    assert rc == 0 and saved.exists()
    rc, _, err = _run(["tune", a, "--knob", "chunk_size=64", "--save", str(saved)], capsys)
    assert rc == 2 and "exists" in err  # --save never overwrites
    rc, out, _ = _run(["diff", a, b, "--tuned", str(saved), "--json", "-q"], capsys)
    doc = json.loads(out)
    tune = json.loads(saved.read_text())
    p = doc["prediction"]
    assert rc == 0 and p["recommendation"] == tune["recommendation"]
    itl = {r["metric"]: r for r in p["rows"]}["itl_p99_s"]
    assert itl["predicted"] == tune["recommended"]["itl_p99_s"]
    assert itl["measured"] == doc["after"]["itl_p99_s"]["value"]
    assert itl["error_pct"] == pytest.approx(100 * (itl["predicted"] - itl["measured"]) / itl["measured"])
    rc, out, _ = _run(["diff", a, b, "--tuned", str(saved), "-q"], capsys)
    assert f"Tuned: {p['current']} -> {p['recommendation']}" in out


def test_a_trace_against_itself_diffs_its_kernels_with_no_change(capsys):
    """The device breakdown's kernels frame (real Nsight fixture) feeds the kernel diff: every kernel on
    both sides, nothing moved; logs have no device trace and say so."""
    mock = str(FIX / "nsys" / "mock.sqlite")
    rc, out, _ = _run(["diff", mock, mock, "--json", "-q"], capsys)
    rows = json.loads(out)["kernels"]
    assert rc == 0 and rows and all(r["status"] == "both" and r["change_s"] == 0.0 for r in rows)
    assert sum(r["share_before"] for r in rows if r["step_class"] == "all") == pytest.approx(1.0)
    log = str(FIX / "logs" / "vllm_log_37307.txt")
    rc, out, _ = _run(["diff", log, log, "--json", "-q"], capsys)
    assert rc == 0 and json.loads(out)["kernels_note"] == "no device trace on either side"


def _garbage(tmp):
    p = tmp / "garbage.bin"
    p.write_bytes(bytes(range(256)) * 8)
    return p


def _empty(tmp):
    p = tmp / "empty.log"
    p.write_text("")
    return p


def _not_json(tmp):
    p = tmp / "tune.json"
    p.write_text("{not json")
    return p


@pytest.mark.parametrize("make, extra, msg", [
    (lambda t: t / "missing", [], "no such input"),
    (_garbage, [], "no known format"),
    (_empty, [], "empty file"),
    (None, ["--tuned", "MISSING"], "--tuned"),
    (None, ["--tuned", "NOTJSON"], "not JSON"),
    (None, ["--top", "-1"], "--top"),
])
def test_bad_input_is_one_line_and_exit_2(small_chunk_runs, tmp_path, capsys, make, extra, msg):
    good = str(small_chunk_runs[128])
    bad = str(make(tmp_path)) if make else good
    extra = [str(tmp_path / "nope.json") if x == "MISSING" else str(_not_json(tmp_path)) if x == "NOTJSON" else x
             for x in extra]
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    rc, out, err = _run(["diff", good, bad, *extra], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and msg in err and len(err.strip().splitlines()) == 1, err
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before  # inputs never written


def test_inputs_are_never_written(small_chunk_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_chunk_runs[64], run)
    snap = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["diff", str(run), str(run), "-q"]) == 0
    capsys.readouterr()
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == snap


def test_partial_input_is_analysed_and_flagged(capsys):
    cut = str(FIX / "logs" / "vllm_metrics_11117.txt")  # two histograms without +Inf/_count: read in part
    rc, out, err = _run(["diff", cut, cut, "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["before"]["partial"] == [cut] and "exposition cut" in err
    assert any(c.startswith("BEFORE is partial") for c in doc["caveats"])


def test_a_capture_without_latency_has_nothing_to_compare(capsys):
    log = str(FIX / "logs" / "vllm_log_37307.txt")  # vLLM's 10 s stats lines only: no ITL, no excess
    rc, out, _ = _run(["diff", log, log, "-q"], capsys)
    assert rc == 0 and out.startswith("Nothing to compare:")
