"""``mixdiag tune`` on a real vLLM 0.32 capture, no server: client records beside vLLM's own
unix-stamped iteration records (tests/fixtures/vllm032/tune, cut from a testbed run at 512-token steps)."""
import json
from pathlib import Path

import numpy as np
import pandas as pd

from mixdiag.cli import main
from mixdiag.collectors import load
from mixdiag.collectors.logs.log_lines import strip_container_prefix
from mixdiag.tuning import cost_model

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "tune"


def test_unix_seconds_prefix_is_the_line_time():
    line, t = strip_container_prefix("1796141814.375048 Engine 000: Iteration(2740): 0 context requests")
    assert t == 1796141814.375048 and line.startswith("Engine 000:")
    # a number that is not a plausible unix time stays part of the line
    assert strip_container_prefix("512 tokens") == ("512 tokens", None)


def test_iteration_records_have_their_elapsed_time_as_duration():
    tl = load(FIX / "iterations.log")
    assert tl.meta["clock"] == "unix"
    rows = cost_model.step_rows(tl.steps)
    raw = [float(x.split("iteration elapsed time: ")[1].split(" ms")[0]) / 1e3
           for x in (FIX / "iterations.log").read_text().splitlines() if " 0 context tokens, 0 generation" not in x]
    assert len(rows) == len(raw)
    assert np.allclose(np.sort((rows["t_end_s"] - rows["t_start_s"]).to_numpy()), np.sort(raw), atol=1e-6)


def test_tune_reads_client_records_beside_the_iteration_log(capsys):
    assert main(["tune", str(FIX / "client.jsonl"), str(FIX / "iterations.log"), "--knob", "chunk_size=256,512,1024",
                 "--current", "chunk_size=512", "--json", "--jobs", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # requests measured from the client records, step costs fitted on the engine's own steps
    assert doc["workload"]["quality"] == {"output_tokens": "measured", "arrivals": "measured",
                                          "prompt_tokens": "measured"}
    assert doc["cost_model"]["kind"] == "fitted" and doc["cost_model"]["steps"] > 500
    assert any(n.startswith("requests from the token events of client") for n in doc["notes"])
    assert not any(n.startswith("current setting not recorded") for n in doc["notes"])
    assert [r["label"] for r in doc["settings"] if r["current"]] == ["chunk_size=512"]
    assert doc["measured_current"]["itl_p99_s"] > 0 and doc["measured_current"]["ttft_p99_s"] > 0
    # a long prompt (3812 tokens) is in the window: smaller chunks delay its first token
    by = {r["label"]: r for r in doc["settings"]}
    assert by["chunk_size=256"]["ttft_p99_s"] > by["chunk_size=1024"]["ttft_p99_s"]


def test_budget_cut_chunks_attend_to_the_earlier_chunks_of_their_prompt():
    # a 1100-token prompt at a 512 budget with 12 decodes: 500 + 500 + 100 (+ decodes), then decode only
    rows = pd.DataFrame({"prefill_tokens": [500.0, 500.0, 100.0, 0.0, 60.0],
                         "decode_rows": [12.0, 12.0, 12.0, 13.0, 13.0]})
    shapes = cost_model.estimated_shapes(rows, kv_tokens=10_000)
    assert [s.prefill_ctx for s in shapes] == [0.0, 500 * 500, 1000 * 100, 0.0, 0.0]
    assert [s.prefill_sq for s in shapes] == [250000.0, 250000.0, 10000.0, 0.0, 3600.0]
