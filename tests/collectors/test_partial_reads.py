"""Partial reads are reported (issue 22 item 2): a cut exposition, a garbage scrape, bytes that are
not UTF-8, and what `analyze` says about them (warnings, --json `sources[].skipped`, --strict)."""
import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from mixdiag.cli import main
from mixdiag.collectors import load
from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.collectors.logs import vllm_log

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from inputs_tried import stats_log as _stats_log  # noqa: E402  (the input scripts/inputs_tried.py runs too)


def _scrape(i: int) -> str:
    lab = 'engine="0",model_name="m"'
    out = [f"vllm:generation_tokens_total{{{lab}}} {100 * i * i}", f"vllm:num_requests_running{{{lab}}} 3"]
    for le, c in (("0.01", 5), ("0.1", 9), ("+Inf", 10)):
        out.append(f'vllm:inter_token_latency_seconds_bucket{{{lab},le="{le}"}} {c * i}')
    out += [f"vllm:inter_token_latency_seconds_count{{{lab}}} {10 * i}", f"vllm:inter_token_latency_seconds_sum{{{lab}}} {0.3 * i}"]
    return "\n".join(out) + "\n"


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_exposition_cut_at_a_line_end_is_reported_as_cut(tmp_path):
    text = _scrape(3)
    whole, cut = tmp_path / "whole.txt", tmp_path / "cut.txt"
    whole.write_text(text)
    cut.write_text(text[: text.index('le="+Inf"')].rsplit("\n", 1)[0] + "\n")  # ends after the le=0.1 bucket
    assert scrape_reader.read(whole).meta["sources"][0]["partial"] is False
    src = scrape_reader.read(cut).meta["sources"][0]
    assert src["partial"] is True and src["lines_skipped"] == 0
    assert "cut" in src["partial_reasons"][0] and "vllm:inter_token_latency_seconds" in src["partial_reasons"][0]


def test_exposition_cut_mid_line_counts_the_line(tmp_path):
    p = tmp_path / "cut.txt"
    p.write_text(_scrape(3)[:-12])
    src = scrape_reader.read(p).meta["sources"][0]
    assert src["lines_skipped"] == 1 and src["skipped_reasons"] == {"last line has no newline (cut mid-line?)": 1}


def test_garbage_in_a_scrape_directory_is_counted_by_name(tmp_path):
    for i in range(5):
        (tmp_path / f"{1700000000 + 10 * i}.prom").write_text(_scrape(i))
    (tmp_path / "1700000025.prom").write_bytes(b"\x00\x9f\x92\x96garbage\x00\n" * 3)  # a time-named file of bytes
    (tmp_path / "scrape-late.prom").write_text(_scrape(9))  # a scrape that cannot be placed in time
    tl = scrape_reader.read(tmp_path)
    src = {s["path"].rsplit("/", 1)[-1]: s for s in tl.meta["sources"]}
    assert src["1700000025.prom"]["lines_skipped"] == 3 and src["1700000025.prom"]["partial"]
    assert src["scrape-late.prom"]["lines_skipped"] == _scrape(9).count("\n")
    assert "no time" in next(iter(src["scrape-late.prom"]["skipped_reasons"]))
    assert (tl.steps["granularity"] == "interval").sum() == 4  # the good scrapes still give their intervals


@pytest.mark.parametrize("bad_every", [0, 7, 1])  # none, some, every stats line with latin-1 bytes
def test_latin1_bytes_never_cost_a_stats_line(tmp_path, bad_every):
    p = tmp_path / "v.log"
    p.write_bytes(_stats_log(59, bad_every))
    tl = vllm_log.read(p, year=2026)
    src = tl.meta["sources"][0]
    assert len(tl.steps) == 59 and src["lines_skipped"] == 0
    assert tl.steps["kv_usage"].max() == pytest.approx(0.97)  # the kv_pressure row survives
    bad_lines = len(range(0, 59, bad_every)) if bad_every else 0
    assert src["bytes_replaced"] == 2 * bad_lines


def test_binary_lines_stay_skipped_not_ignored(tmp_path):
    p = tmp_path / "v.log"
    p.write_bytes(_stats_log(3, 0) + b"\xff\xfe\xfd\xfc\xfb\n")
    src = vllm_log.read(p, year=2026).meta["sources"][0]
    assert src["lines_skipped"] == 1 and src["skipped_reasons"] == {"not text": 1}


def test_analyze_warns_per_partial_source_and_strict_exits_2(tmp_path):
    p = tmp_path / "engine.log"
    p.write_bytes(_stats_log(30, 0) + b"(APIServer pid=1) INFO 03-17 15:06:00 [loggers.py:259] Engine 000: "
                  b"Avg prompt throughput: 1\n")
    rc, out, err = _cli(["analyze", str(p)])
    assert rc == 0
    warn = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert warn == [ln for ln in warn if ln.startswith(f"warning: {p}: 1 of 31 lines unreadable (first: ")]
    assert len(warn) == 1 and "input not read whole" in out
    rc, out, _ = _cli(["analyze", str(p), "--json"])
    doc = json.loads(out)
    (s,) = doc["sources"]
    assert rc == 0 and s["skipped"] == {"count": 1, "reasons": {"stats line without readable throughputs": 1}}
    rc, out, err = _cli(["analyze", str(p), "--strict"])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: --strict")
    clean = tmp_path / "clean.log"
    clean.write_bytes(_stats_log(30, 0))
    rc, _, err = _cli(["analyze", str(clean), "--strict"])
    assert rc == 0 and "warning:" not in err


def test_ingest_strict_and_ignored_files(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.log").write_bytes(_stats_log(5, 0))
    (d / "notes.bin").write_bytes(b"\x00\x01 nothing known")
    assert load(str(d)).meta["inputs_ignored"] == [str(d / "notes.bin")]
    rc, _, err = _cli(["ingest", str(d)])
    assert rc == 0 and f"warning: {d / 'notes.bin'}: not read (no known format)" in err
    rc, _, err = _cli(["ingest", str(d), "--strict"])
    assert rc == 2 and "not read" in err
