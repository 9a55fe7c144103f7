"""Scrapes appended to one file (collectors/prometheus/concatenated.py), on the real vLLM 0.32 scrapes
of tests/fixtures/vllm032 appended as a `curl >> file` loop writes them."""
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from mixdiag.collectors import load
from mixdiag.collectors.prometheus import concatenated

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "scrapes"
FILES = sorted(FIX.glob("*.prom"))


def _stamp(t: float, how: str) -> str:
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    return {"unix": f"{t:.3f}", "hash-unix": f"# {int(t)}", "ms": str(int(round(t * 1000))),
            "iso": d.isoformat(timespec="milliseconds"), "date": d.strftime("%a %b %e %H:%M:%S UTC %Y")}[how]


def _appended(tmp_path, how: str | None) -> Path:
    out = []
    for f in FILES:
        if how:
            out.append(_stamp(float(f.stem), how))
        out.append(f.read_text().rstrip("\n"))
    p = tmp_path / "metrics.txt"
    p.write_text("\n".join(out) + "\n")
    return p


@pytest.mark.parametrize("how", ["unix", "ms", "iso", "date"])
def test_timed_appended_scrapes_read_as_the_directory(tmp_path, how):
    want = load(str(FIX))
    got = load(str(_appended(tmp_path, how)))
    assert got.meta["clock"] == "unix"
    cols = [c for c in want.steps.columns if c != "instance"]
    tol = 1e-3 if how in ("ms", "iso", "date", "hash-unix") else 0  # the stamp's own resolution
    a, b = want.steps[cols].reset_index(drop=True), got.steps[cols].reset_index(drop=True)
    if how == "date":  # whole seconds: times move (and what is spread over time), the counts do not
        keep = [c for c in ("running_reqs", "waiting_reqs", "kv_usage", "output_tokens", "itl_p50_s", "itl_p99_s")
                if c in a]
        a, b = a[keep], b[keep]
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=tol, rtol=0, check_dtype=False)
    (src,) = got.meta["sources"]  # one entry per input
    n = len((tmp_path / "metrics.txt").read_text().splitlines())
    assert src["lines_total"] == n == src["lines_parsed"] + src["lines_skipped"] + src["lines_ignored"]
    assert src["lines_skipped"] == 0 and not src["partial"]


def test_untimed_appended_scrapes_sit_an_assumed_interval_apart(tmp_path):
    tl = load(str(_appended(tmp_path, None)))
    assert tl.meta["clock"] == "relative" and len(tl.steps) == len(FILES) - 1
    assert list(tl.steps["t_end_s"]) == [1.0, 2.0, 3.0]
    assert any("assumed" in n for n in tl.meta["sources"][0]["notes"])
    given = load(str(_appended(tmp_path, None)), interval_s=5.0)
    assert list(given.steps["t_end_s"]) == [5.0, 10.0, 15.0]


def test_two_targets_appended_are_not_a_time_series(tmp_path):
    a = FILES[0].read_text()
    b = "# HELP python_gc_objects_collected_total x\n" + "".join(
        f"other_metric_{i} {i}\n" for i in range(50))
    p = tmp_path / "two.txt"
    p.write_text(a + b)
    assert concatenated.split(p.read_text().splitlines()) is None


@pytest.mark.parametrize("line, t", [
    ("1796141814", 1796141814.0), ("# 1796141814.370", 1796141814.37), ("1796141814370", 1796141814.37),
    ("2026-12-01T16:16:54+00:00", 1796141814.0), ("# 2026-12-01T17:16:54.5+01:00", 1796141814.5),
    ("Tue Dec  1 16:16:54 UTC 2026", 1796141814.0), ("Tue Dec  1 16:16:54 CST 2026", None),
    ("vllm:num_requests_running 3", None), ("# HELP x y", None), ("123", None),
])
def test_line_time(line, t):
    got = concatenated.line_time(line)
    assert got == (None if t is None else pytest.approx(t))
