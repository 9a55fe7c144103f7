"""A log printed in the server's local time, read beside unix-clock inputs of the same run
(collectors/logs/log_zone.py): the real vLLM 0.32 capture of tests/fixtures/vllm032 (its log was
written on a UTC machine), its stamps rewritten as a server in another zone would print them."""
import io
import re
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from mixdiag.collectors import load
from mixdiag.collectors.logs import log_zone
from mixdiag.collectors.logs import vllm_log

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032"
_STAMP = re.compile(r"(INFO|WARNING|DEBUG|ERROR) (\d\d)-(\d\d) (\d\d:\d\d:\d\d)")


def _in_zone(text: str, offset_s: int) -> str:
    """The log as a server whose clock runs ``offset_s`` ahead of UTC would have printed it."""
    def move(m):
        t = datetime(2026, int(m.group(2)), int(m.group(3)), *map(int, m.group(4).split(":")))
        return f"{m.group(1)} {t + timedelta(seconds=offset_s):%m-%d %H:%M:%S}"
    return "".join(_STAMP.sub(move, line, count=1) for line in io.StringIO(text))


@pytest.fixture(scope="module")
def utc_read():
    return load([str(FIX / "scrapes"), str(FIX / "vllm.log")])


@pytest.mark.parametrize("offset_s", [8 * 3600, -5 * 3600, 5 * 3600 + 1800, 14 * 3600])
def test_a_log_in_local_time_joins_its_scrapes(tmp_path, utc_read, offset_s):
    log = tmp_path / "vllm.log"
    log.write_text(_in_zone((FIX / "vllm.log").read_text(), offset_s))
    tl = load([str(FIX / "scrapes"), str(log)])
    assert tl.instances == utc_read.instances  # one server, as when the log was in UTC
    (entry,) = tl.meta["instance_sources"].values()
    assert len(entry["sources"]) == 2
    assert any("log clock: read as local time at UTC" in n for n in entry["clock_notes"])
    assert np.array_equal(np.sort(tl.steps["t_end_s"].to_numpy()), np.sort(utc_read.steps["t_end_s"].to_numpy()))


def test_a_log_already_on_the_unix_clock_is_left_alone(utc_read):
    (entry,) = utc_read.meta["instance_sources"].values()
    assert entry["clock_notes"] == []


def test_a_log_no_zone_places_stays_as_read_and_says_so(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(_in_zone((FIX / "vllm.log").read_text(), 3 * 86400))  # three days off: no zone does that
    tl = load([str(FIX / "scrapes"), str(log)])
    notes = [n for e in tl.meta["instance_sources"].values() for n in e["clock_notes"]]
    assert any("no zone" in n and "left as read" in n for n in notes)
    assert len(tl.meta["instance_sources"]) == 2  # two servers as far as the clocks can tell


def test_a_log_of_another_model_is_not_placed(tmp_path):
    text = _in_zone((FIX / "vllm.log").read_text(), 8 * 3600).replace("tiny-llama", "other-model")
    log = tmp_path / "vllm.log"
    log.write_text(text)
    tl = load([str(FIX / "scrapes"), str(log)])
    assert len(tl.meta["instance_sources"]) == 2
    assert not any(e["clock_notes"] for e in tl.meta["instance_sources"].values())


def test_container_stamped_lines_carry_their_zone():
    line = ("2026-12-01T16:15:07.250000000Z (APIServer pid=1) INFO 12-02 00:15:07 [loggers.py:259] Engine 000: "
            "Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 1 reqs, "
            "Waiting: 0 reqs, GPU KV cache usage: 1.0%\n")
    assert "clock_zone" not in vllm_log.read(io.StringIO(line), instance="v").meta
    plain = line.split("Z ", 1)[1]
    assert vllm_log.read(io.StringIO(plain), instance="v", year=2026).meta["clock_zone"] == "naive"


@pytest.mark.parametrize("zone, name", [(28800, "+08:00"), (-18000, "-05:00"), (19800, "+05:30"), (0, "+00:00")])
def test_zone_names(zone, name):
    assert log_zone._zone_name(zone) == name


@pytest.mark.parametrize("text, zone", [("+08:00", 28800), ("-05:00", -18000), ("+0530", 19800), ("UTC+8", 28800),
                                        ("0", 0), ("-12:00", -43200), ("+14:00", 50400)])
def test_parse_zone(text, zone):
    assert log_zone.parse_zone(text) == zone


@pytest.mark.parametrize("text", ["+15:00", "+08:60", "8h", "", "-13"])
def test_parse_zone_refuses(text):
    with pytest.raises(ValueError):
        log_zone.parse_zone(text)


def test_log_zone_given_places_a_log_read_alone(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(_in_zone((FIX / "vllm.log").read_text(), 8 * 3600))
    utc = load(str(FIX / "vllm.log"))
    tl = load(str(log), log_zone_s=8 * 3600)
    assert np.array_equal(tl.steps["t_end_s"].to_numpy(), utc.steps["t_end_s"].to_numpy())
    assert tl.meta["clock_zone"] == "UTC+08:00"
    assert any("(--log-zone)" in n for n in tl.meta["sources"][0]["notes"])


def test_log_zone_flag_bad_value_is_one_line_error(capsys):
    from mixdiag.cli import main

    assert main(["analyze", str(FIX / "vllm.log"), "--log-zone", "+25:00"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--log-zone" in err[0]
