"""vLLM's JSON log records (``--logging-config.formatter json``) read as its text lines
(collectors/logs/vllm_json.py)."""
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.logs import vllm_json, vllm_log

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
_TEXT = re.compile(r"^\((?P<proc>[^)\s]+) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) (?P<mo>\d\d)-(?P<d>\d\d) "
                   r"(?P<hms>\d\d:\d\d:\d\d) \[(?P<file>[\w.]+):\d+\] (?P<msg>.*)$")


def _as_json(text: str, year: int) -> str:
    """A text log's records as vLLM's JsonFormatter writes them (asctime: logging's default format)."""
    out = []
    for line in text.splitlines():
        m = _TEXT.match(line)
        if m is None:
            out.append(line)  # another program's output stays a plain line
            continue
        out.append(json.dumps({"asctime": f"{year}-{m['mo']}-{m['d']} {m['hms']},000", "levelname": m["level"],
                               "name": "vllm." + m["file"].removesuffix(".py"), "processName": "MainProcess",
                               "process": int(m["pid"]), "message": m["msg"], "vllm_process_name": m["proc"]}))
    return "\n".join(out) + "\n"


def test_real_vllm_032_json_records():
    tl = vllm_log.read(ROOT / "logs" / "vllm_log_json032.txt", instance="v")
    src = tl.meta["sources"][0]
    assert src["lines_skipped"] == 0 and not src["partial"]
    assert any(n.startswith("JSON log: 9 record(s)") for n in src["notes"])
    assert tl.meta["clock_zone"] == "naive" and "year_assumed" not in tl.meta  # the records carry the year
    rows = tl.steps.sort_values("t_end_s")
    assert list(rows["running_reqs"]) == [8.0, 8.0, 8.0]
    assert (rows["t_end_s"] % 1 > 0).any()  # milliseconds kept
    assert rows["expert_imbalance"].dropna().round(4).tolist()[-2:] == [round(1400 / 812.5, 4), round(900 / 812.5, 4)]
    assert rows["graph_none_steps"].dropna().tolist()[-2:] == [2.0, 3.0]


def test_the_real_032_operator_log_reads_the_same_as_json(tmp_path):
    text = (ROOT / "vllm032" / "vllm.log").read_text()
    p = tmp_path / "vllm.json.log"
    p.write_text(_as_json(text, 2026))
    a = vllm_log.read(ROOT / "vllm032" / "vllm.log", instance="v", year=2026)
    b = vllm_log.read(p, instance="v")
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    cols = ["name", "labels", "t_s", "value"]
    pd.testing.assert_frame_equal(a.series[cols].reset_index(drop=True), b.series[cols].reset_index(drop=True))


@pytest.mark.parametrize("head, yes", [
    ('{"asctime": "2026-12-02 07:35:10,113", "levelname": "INFO", "message": "x"}\n', True),
    ('\n\n{"asctime": "2026-12-02 07:35:10,113", "message": "x"}\n', True),
    ('{"level": "info", "msg": "x"}\n', False),  # another program's JSON
    ('Triton is installed\n{"asctime": "2026-12-02 07:35:10,113", "message": "x"}\n', True),
    ('(APIServer pid=1) INFO 12-02 07:35:10 [a.py:1] x\n{"asctime": "2026-12-02 07:35:10,1", "message": "x"}\n'
     '(APIServer pid=1) INFO 12-02 07:35:11 [a.py:1] y\n', False),  # text with one JSON line in it
    ("(APIServer pid=1) INFO 12-02 07:35:10 [loggers.py:1] Engine 000: ...\n", False),
    ("{not json\n", False),
])
def test_looks_json(head, yes):
    assert vllm_json.looks_json(head) is yes


def test_a_multi_line_message_is_one_prefixed_line_per_line():
    rec = {"asctime": "2026-01-02 03:04:05,006", "levelname": "INFO", "name": "vllm.x", "process": 7,
           "message": "a\nb", "vllm_process_name": "EngineCore_DP0"}
    text, year, n = vllm_json.to_text(json.dumps(rec) + "\nplain line\n")
    assert (year, n) == (2026, 1)
    assert text.splitlines() == ["(EngineCore_DP0 pid=7) INFO 01-02 03:04:05.006 [vllm.x:0] a",
                                 "(EngineCore_DP0 pid=7) INFO 01-02 03:04:05.006 [vllm.x:0] b", "plain line"]
