"""A year-less vLLM log fused with unix-clock scrapes of the same run takes the scrapes' year."""
from datetime import datetime, timezone

import pytest

from mixdiag.collectors import load
from mixdiag.collectors.logs import vllm_log

LINE = ("(EngineCore_DP0 pid=1) INFO {md} {hms} [core.py:349] Iteration(1): 0 context requests, 0 context tokens, "
        "4 generation requests, 4 generation tokens, iteration elapsed time: 10.00 ms\n")
SCRAPE = "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{model_name=\"m\"}} {v}\n"


@pytest.mark.parametrize("scrape_time,md,hms,want_year", [
    ("2023-11-04T14:09:00Z", "11-04", "14:09:07", 2023),
    ("2024-01-01T00:00:05Z", "12-31", "23:59:59", 2023),  # a run across New Year: the log starts the year before
])
def test_log_year_from_the_scrapes(tmp_path, scrape_time, md, hms, want_year):
    scrapes = tmp_path / "scrapes"
    scrapes.mkdir()
    t0 = datetime.strptime(scrape_time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    for i in range(3):
        (scrapes / f"scrape-{int(t0) + 5 * i}.prom").write_text(SCRAPE.format(v=10 * i))
    log = tmp_path / "server.log"
    log.write_text(LINE.format(md=md, hms=hms))
    alone = vllm_log.read(log)
    assert "year_assumed" in alone.meta
    tl = load([str(log), str(scrapes)])
    st = tl.steps[tl.steps["granularity"] == "step"]
    got = datetime.fromtimestamp(float(st["t_start_s"].iloc[0]), tz=timezone.utc)
    assert got.year == want_year and got.strftime("%m-%d %H:%M:%S") == f"{md} {hms}"


@pytest.mark.parametrize("written,md,want_year", [
    ("2021-03-01T00:00:00Z", "01-15", 2021),   # written after the line's date that year
    ("2021-01-10T00:00:00Z", "01-15", 2020),   # written before it: the line is from the year before
    ("2021-01-10T00:00:00Z", "12-20", 2020),
])
def test_log_alone_takes_its_year_from_the_file_time(tmp_path, written, md, want_year):
    """Read alone, a year-less log lies before the file's modification time, not merely before now."""
    import os
    log = tmp_path / "server.log"
    log.write_text(LINE.format(md=md, hms="10:00:00"))
    t = datetime.strptime(written, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    os.utime(log, (t, t))
    tl = vllm_log.read(log)
    assert tl.meta["year_assumed"] == want_year
    got = datetime.fromtimestamp(float(tl.steps["t_start_s"].dropna().iloc[0]), tz=timezone.utc)
    assert got.year == want_year
    notes = [n for s in tl.meta["sources"] for n in s["notes"]]
    assert any(f"assumed {want_year}" in n and "modification time" in n for n in notes)
