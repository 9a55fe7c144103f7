"""`mixdiag ingest`: summary, --json, --out DIR|FILE.csv, never overwriting, one-line errors."""
import json
from pathlib import Path

import pandas as pd
import pytest

from mixdiag.cli import main
from mixdiag.schema import Timeline

NSYS = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"


def ingest(capsys, *args):
    rc = main(["ingest", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_summary_and_out_dir(capsys, tmp_path):
    rc, out, err = ingest(capsys, NSYS / "h100_2gpu_1s.sqlite", "--out", tmp_path / "tl", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["rows"]["steps"] == len(Timeline.load(tmp_path / "tl").steps) > 0
    assert doc["sources"][0]["format"] == "nsys-sqlite" and doc["sources"][0]["lines_total"] == 3442
    assert {"graph_mode", "forward_s"} <= set(doc["filled_columns"]) and "kind" not in doc["filled_columns"]
    assert 0.9 < doc["time_span"]["duration_s"] < 1.1 and doc["clock"] == "unix"
    assert doc["partial"] is False


def test_human_summary_and_csv(capsys, tmp_path):
    rc, out, _ = ingest(capsys, NSYS / "mock.sqlite", "--out", tmp_path / "steps.csv")
    assert rc == 0 and "nsys-sqlite" in out and "columns filled:" in out and "time span:" in out
    assert len(pd.read_csv(tmp_path / "steps.csv")) == 2


@pytest.mark.parametrize("target", ["dir", "csv"])
def test_refuses_to_overwrite(capsys, tmp_path, target):
    out = tmp_path / ("tl" if target == "dir" else "steps.csv")
    assert ingest(capsys, NSYS / "mock.sqlite", "--out", out)[0] == 0
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    rc, _, err = ingest(capsys, NSYS / "mock.sqlite", "--out", out)
    assert rc == 2 and "never overwrites" in err and len(err.strip().splitlines()) == 1
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


def _cut_json(p):
    p.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": '
                 '"step 0 kind=decode", "ts": 1, "dur": 2, "pid": 1, "tid": 1}, {"ph": "X", "na')
    return p


def test_partial_input_is_read_and_flagged(capsys, tmp_path):
    rc, out, _ = ingest(capsys, _cut_json(tmp_path / "cut.json"), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["partial"] is True and doc["rows"]["steps"] == 1


@pytest.mark.parametrize("make", [
    lambda d: (d / "empty.sqlite").write_bytes(b"") or d / "empty.sqlite",
    lambda d: (d / "cut.sqlite").write_bytes((NSYS / "mock.sqlite").read_bytes()[:5000]) or d / "cut.sqlite",
    lambda d: (d / "e").mkdir() or d / "e",
    lambda d: d / "missing.sqlite",
])
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, make):
    rc, out, err = ingest(capsys, make(tmp_path))
    assert rc == 2 and out == "" and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_unknown_format_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["ingest", str(NSYS / "mock.sqlite"), "--format", "pcap"])
    assert e.value.code == 2
