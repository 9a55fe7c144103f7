"""vllm_log: every real fixture with hand-counted lines, and the line kinds of formats.md §1.2."""
import io
import math
import time
from pathlib import Path

import pytest

from mixdiag.collectors.logs import vllm_log
from mixdiag.errors import UserError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# Counted by reading each file: stats lines, Iteration lines, ignored (headers, uvicorn, ERROR lines).
FIXTURES = [
    # name,              total, stats, iterations, ignored
    ("vllm_log_19680.txt", 2, 1, 0, 1),
    ("vllm_log_3094.txt", 2, 1, 0, 1),
    ("vllm_log_31193.txt", 4, 0, 3, 1),
    ("vllm_log_37307.txt", 7, 5, 0, 2),
    ("vllm_log_6790.txt", 9, 4, 0, 5),
]


@pytest.mark.parametrize("name,total,stats,iters,ignored", FIXTURES)
def test_fixture_counts(name, total, stats, iters, ignored):
    tl = vllm_log.read(FIX / name, year=2025)
    src = tl.meta["sources"][0]
    assert (src["lines_total"], src["lines_parsed"], src["lines_skipped"], src["lines_ignored"]) == \
        (total, stats + iters, 0, ignored)
    g = tl.steps["granularity"].value_counts().to_dict()
    assert g.get("interval", 0) == stats and g.get("step", 0) == iters


def test_fixture_values():
    tl = vllm_log.read(FIX / "vllm_log_37307.txt", year=2026)
    s = tl.steps
    assert list(s["waiting_reqs"]) == [90, 84, 78, 72, 66] and list(s["running_reqs"]) == [10, 16, 22, 28, 34]
    assert list(s["kv_usage"]) == pytest.approx([0.193, 0.309, 0.425, 0.542, 0.654])
    # second line: 10 s after the first, 23999.9 prompt tok/s -> ~240k prompt tokens (estimated)
    assert s["t_end_s"][1] - s["t_start_s"][1] == 10.0 and s["prefill_tokens"][1] == pytest.approx(239999.0)
    assert tl.meta["signals"]["vllm_log_37307"]["prefill_tokens"] == "estimated"
    assert s["itl_mean_s"][0] == pytest.approx(10 / 18.1)  # Running / generation throughput
    assert tl.meta["signals"]["vllm_log_37307"]["itl_mean_s"] == "estimated"
    tl = vllm_log.read(FIX / "vllm_log_3094.txt", year=2024)
    row = tl.steps.iloc[0]
    assert (row["running_reqs"], row["waiting_reqs"], row["kv_usage"]) == (2, 3, pytest.approx(0.821))  # Pending
    tl = vllm_log.read(FIX / "vllm_log_31193.txt", year=2025)
    assert list(tl.steps["iteration"]) == [515, 516, 517] and set(tl.steps["kind"]) == {"decode"}
    assert list(tl.steps["decode_reqs"]) == [20, 20, 20]
    assert list(tl.steps["elapsed_s"]) == pytest.approx([0.01099, 0.01095, 0.01079])
    tl = vllm_log.read(FIX / "vllm_log_6790.txt", year=2024)
    assert set(tl.steps["kind"]) == {"idle"}  # 0.0 prompt and generation throughput


@pytest.mark.parametrize("ctx_req,ctx_tok,gen_req,kind", [
    (1, 100, 3, "mixed"), (1, 100, 0, "prefill"), (0, 0, 5, "decode"), (0, 0, 0, "idle"),
])
def test_iteration_kind(ctx_req, ctx_tok, gen_req, kind):
    line = (f"(EngineCore_DP0 pid=1) INFO 03-01 10:00:00 [core.py:349] Iteration(7): {ctx_req} context requests, "
            f"{ctx_tok} context tokens, {gen_req} generation requests, {gen_req} generation tokens, "
            "iteration elapsed time: 2.50 ms\n")
    tl = vllm_log.read(io.StringIO(line), year=2025, instance="v")
    assert tl.steps["kind"][0] == kind and tl.steps["prefill_tokens"][0] == ctx_tok


LOG = """\
2025-12-31T23:59:50.250000000Z (APIServer pid=1) INFO 12-31 23:59:50 [loggers.py:259] Engine 001: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, Preemptions: 2, GPU KV cache usage: 10.0%, Prefix cache hit rate: 0.0%, Corrupted: 0 reqs, MM cache hit rate: 1.0%
(APIServer pid=1) INFO 01-01 00:00:00 [loggers.py:259] Engine 001: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=1) INFO 01-01 00:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 10.00 tokens/s, Drafted throughput: 20.00 tokens/s, Accepted: 100 tokens, Drafted: 200 tokens, Per-position acceptance rate: 0.800, 0.600, 0.400, Avg Draft acceptance rate: 50.0%
(APIServer pid=1) INFO 01-01 00:00:00 [metrics.py:1] KV Transfer metrics: KVConnectorType: NixlConnector, Avg xfer time (ms)=12.5, P90 xfer time (ms)=20.0, Avg MB per transfer=64.0, Throughput (MB/s)=5000.0
(EngineCore_DP0 pid=2) INFO 01-01 00:00:01 [eplb_state.py:1] EPLB step: avg_tokens=12.00, max_tokens=20, balancedness=0.6000
(EngineCore_DP0 pid=2) INFO 01-01 00:00:01 [cuda_graph.py:1] **CUDAGraph Config Settings:**

- Mode: FULL_AND_PIECEWISE
- Capture sizes: [1, 2, 4, 8]

**CUDAGraph Stats:**

| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |
|-----------------|---------------|--------------|--------------|-------|
| 8 | 8 | 0 | FULL | 40 |
| 300 | 300 | 0 | CUDAGraphMode.NONE | 3 |
INFO:     127.0.0.1:1 - "GET /metrics HTTP/1.1" 200 OK
(APIServer pid=1) INFO 01-01 00:00:02 [loggers.py:259] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg gen
"""


def test_every_line_kind_with_year_rollover_and_docker_prefix():
    tl = vllm_log.read(io.StringIO(LOG), instance="v")
    src = tl.meta["sources"][0]
    # parsed: 2 stats + spec + kv + eplb + Mode + Capture + Stats header + table header + separator + 2 rows = 12
    # ignored: Config Settings header line, 3 blank lines, uvicorn; skipped: the cut stats line
    assert (src["lines_total"], src["lines_parsed"], src["lines_ignored"], src["lines_skipped"]) == (18, 12, 5, 1)
    assert src["partial"] is True
    assert sorted(tl.instances) == ["v/engine0", "v/engine1"]
    rows = tl.steps[tl.steps["instance"] == "v/engine1"]
    assert list(rows["kind"]) == ["unknown", "idle"]
    assert rows["t_end_s"].iloc[0] == 1767225590.25  # docker time (UTC, with year and fraction)
    assert rows["t_end_s"].iloc[1] == 1767225600.0  # 2026-01-01 00:00:00: the year rolled over
    assert rows["preempted_reqs"].iloc[0] == 2 and math.isnan(rows["preempted_reqs"].iloc[1])
    ser = tl.series.set_index(["name", "labels"])["value"]
    assert ser[("vllm_log:spec_decode_mean_acceptance_length", "")] == 2.5
    assert ser[("vllm_log:spec_decode_avg_draft_acceptance_rate_pct", "")] == 50.0
    assert ser[("vllm_log:spec_decode_per_position_acceptance_rate", "position=2")] == 0.4
    assert ser[("vllm_log:kv_transfer_avg_xfer_time_ms", "")] == 12.5
    assert ser[("vllm_log:eplb_balancedness", "")] == 0.6
    assert ser[("vllm_log:cudagraph_steps", "mode=FULL,padded_tokens=8,unpadded_tokens=8")] == 40
    assert ser[("vllm_log:cudagraph_steps", "mode=NONE,padded_tokens=300,unpadded_tokens=300")] == 3
    assert tl.meta["cudagraph_config"] == {"Mode": "FULL_AND_PIECEWISE", "Capture sizes": "[1, 2, 4, 8]"}


def test_stats_field_in_an_unknown_shape_is_left_out_not_the_line():
    line = ("INFO 03-01 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 5.0 tokens/s, Avg generation "
            "throughput: 2.0 tokens/s, Running: 4 reqs, Waiting: 3 reqs (capacity: 2, deferred: 1), "
            "GPU KV cache usage: 50.0%, Prefix cache hit rate: 0.0%\n")
    tl = vllm_log.read(io.StringIO(line), year=2025, instance="v")
    src = tl.meta["sources"][0]
    assert (src["lines_parsed"], src["lines_skipped"]) == (1, 0)
    row = tl.steps.iloc[0]
    assert row["running_reqs"] == 4 and math.isnan(row["waiting_reqs"]) and row["kv_usage"] == 0.5
    assert any("unknown shape" in n for n in src["notes"])


# vLLM 0.32 shapes, formatted from its own format strings: distributed/eplb/eplb_state.py (the EPLB line,
# with the step, the model - here a path holding ":" - and the steps to the next rearrangement) and
# v1/metrics/loggers.py (the stats line's Deferred / KV fetch fields when a KV connector fetches)
V032 = """\
(APIServer pid=1) INFO 03-01 10:00:00 [loggers.py:259] Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 100.0 tokens/s, Running: 8 reqs, Waiting: 3 reqs, Deferred: 1 reqs, KV fetch: 1 waiting to start, 2 in progress, 0 completed waiting, Preemptions: 3, GPU KV cache usage: 45.0%, Prefix cache hit rate: 10.0%
(EngineCore_DP0 pid=2) INFO 03-01 10:00:02 [eplb_state.py:634] EPLB step: 120 for model /m/a:b, c: avg_tokens=812.50, max_tokens=1400, balancedness=0.5804, steps until the next rearrangement: 2877
(APIServer pid=1) INFO 03-01 10:00:10 [loggers.py:259] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 100.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 45.0%
"""


def test_vllm_032_eplb_and_kv_fetch_shapes():
    tl = vllm_log.read(io.StringIO(V032), year=2025, instance="v")
    src = tl.meta["sources"][0]
    assert (src["lines_parsed"], src["lines_skipped"]) == (3, 0)
    assert not any("unknown shape" in n for n in src["notes"])
    ser = tl.series.set_index(["name", "labels"])["value"]
    assert ser[("vllm_log:eplb_avg_tokens", "")] == 812.5 and ser[("vllm_log:eplb_balancedness", "")] == 0.5804
    assert ser[("vllm_log:eplb_step", "")] == 120 and ser[("vllm_log:eplb_steps_to_rearrangement", "")] == 2877
    assert ser[("vllm_log:kv_fetch_waiting_to_start", "")] == 1 and ser[("vllm_log:kv_fetch_in_progress", "")] == 2
    rows = tl.steps
    # the EPLB line (10:00:02) falls in the second stats interval (10:00:00, 10:00:10]
    assert rows["expert_imbalance"].iloc[1] == pytest.approx(1400 / 812.5)
    assert rows["waiting_reqs"].iloc[0] == 3 and rows["preempted_reqs"].iloc[0] == 3


def test_stats_lines_out_of_time_order():
    # found by the fuzzer: intervals run between consecutive lines in time, whatever the line order
    lines = (FIX / "vllm_log_37307.txt").read_text().splitlines()[2:4]
    tl = vllm_log.read(io.StringIO(lines[1] + "\n" + lines[0] + "\n"), year=2026, instance="v")
    s = tl.steps
    assert list(s["waiting_reqs"]) == [90, 84] and (s["t_end_s"] >= s["t_start_s"]).all()
    assert s["t_end_s"][1] - s["t_start_s"][1] == 10.0


def test_coloured_terminal_output():
    line = ("(EngineCore_DP0 pid=1) \x1b[32mINFO\x1b[0m 03-01 10:00:00 [core.py:349] Iteration(7): 1 context requests, "
            "64 context tokens, 2 generation requests, 2 generation tokens, iteration elapsed time: 2.50 ms\n")
    tl = vllm_log.read(io.StringIO(line), year=2025, instance="v")
    assert tl.steps["kind"][0] == "mixed" and tl.steps["t_start_s"][0] == 1740823200.0
    assert tl.meta["sources"][0]["lines_skipped"] == 0


def test_scheduler_iteration_details_and_stats_become_series_when_iterating():
    text = ("INFO 05-01 10:00:00 [loggers.py:1] Engine 000: SchedulerIterationDetails(iteration_index=5, "
            "num_ctx_requests=1, num_ctx_tokens=64, num_generation_requests=4, num_generation_tokens=4, "
            "elapsed_ms=3.2, num_encoder_inputs=0, num_encoder_output_tokens=0, is_dummy=False)\n"
            "INFO 05-01 10:00:00 [loggers.py:1] Engine 000: SchedulerIterationDetails(iteration_index=6, "
            "num_ctx_requests=0, num_ctx_tokens=0, num_generation_requests=0, num_generation_tokens=0, "
            "elapsed_ms=0.1, num_encoder_inputs=0, num_encoder_output_tokens=0, is_dummy=True)\n"
            "INFO 05-01 10:00:10 [loggers.py:1] Engine 000: Avg prompt throughput: 6.4 tokens/s, "
            "Avg generation throughput: 0.4 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, "
            "Prefix cache hit rate: 0.0%\n")
    tl = vllm_log.read(io.StringIO(text), year=2026, instance="v")
    assert list(tl.steps["kind"]) == ["mixed"]  # the dummy (DP padding) step computed nothing
    assert list(tl.steps["granularity"]) == ["step"]
    assert tl.series[tl.series["name"] == "vllm_log:running"]["value"].tolist() == [4.0]
    assert tl.meta["sources"][0]["lines_parsed"] == 3


def test_missing_year_is_noted_and_not_vllm_is_user_error(tmp_path):
    tl = vllm_log.read(FIX / "vllm_log_19680.txt")
    assert any("no year" in n for n in tl.meta["sources"][0]["notes"])
    tl = vllm_log.read(FIX / "vllm_log_31193.txt")  # 12-22: never placed in the future
    assert tl.steps["t_start_s"].max() <= time.time()
    p = tmp_path / "x.log"
    p.write_text("nothing here\n")
    with pytest.raises(UserError):
        vllm_log.read(p)


def test_sniff():
    assert vllm_log.sniff((FIX / "vllm_log_31193.txt").read_bytes(), "x")
    assert vllm_log.sniff((FIX / "vllm_log_6790.txt").read_bytes(), "x")
    assert not vllm_log.sniff((FIX / "sglang_log_13023.txt").read_bytes(), "x")


P = "(EngineCore_DP{dp} pid=2010410) INFO 12-22 21:44:{s:02d} [core.py:349] "
A = "(APIServer pid=11574) INFO 12-22 21:44:{s:02d} [loggers.py:259] "


def _iter(dp, s, ctx_tok, gen_req):
    return (P.format(dp=dp, s=s) + f"Iteration({s}): 1 context requests, {ctx_tok} context tokens, "
            f"{gen_req} generation requests, {gen_req} generation tokens, iteration elapsed time: 10.00 ms")


def test_multi_process_server_is_one_engine_per_dp_rank_and_keeps_stats_preemptions():
    lines = [_iter(0, 1, 512, 8), _iter(1, 1, 0, 4), _iter(0, 2, 0, 9), _iter(1, 3, 0, 4),
             A.format(s=5) + "Engine 000: Avg prompt throughput: 51.2 tokens/s, Avg generation throughput: 2.1 tokens/s, "
             "Running: 9 reqs, Waiting: 0 reqs, Preemptions: 3, GPU KV cache usage: 91.0%, Prefix cache hit rate: 0.0%",
             P.format(dp=1, s=6) + "EPLB step: avg_tokens=100.00, max_tokens=250, balancedness=0.4000",
             A.format(s=6) + "Engine 001: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 1.0 tokens/s, "
             "Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%"]
    tl = vllm_log.read(io.StringIO("\n".join(lines) + "\n"), instance="v", year=2025)
    s = tl.steps
    assert sorted(tl.instances) == ["v/engine0", "v/engine1"]
    assert (s["granularity"] == "step").all() and (s["step_source"] == "log").all()
    e0 = s[s["instance"] == "v/engine0"]
    assert list(e0["kind"]) == ["mixed", "decode"]
    assert list(e0["preempted_reqs"].fillna(0)) == [0.0, 3.0]  # not dropped although Iteration lines exist
    e1 = s[s["instance"] == "v/engine1"]
    assert e1["expert_imbalance"].iloc[-1] == pytest.approx(2.5)  # max/avg = 1/balancedness
    assert e1["q_expert_imbalance"].iloc[-1] == "measured"


KV = ("INFO 03-01 10:00:{s:02d} [loggers.py:259] KV Transfer metrics: KVConnectorType: NixlConnector, "
      "Num successful transfers=4, Avg xfer time (ms)=12.5, P90 xfer time (ms)=20.0, Avg post time (ms)=1.0, "
      "P90 post time (ms)=2.0, Avg MB per transfer=8.0, Throughput (MB/s)=640.0, Avg number of descriptors=32")
STATS = ("INFO 03-01 10:00:{s:02d} [loggers.py:259] Engine 000: Avg prompt throughput: 100.0 tokens/s, "
         "Avg generation throughput: 50.0 tokens/s, Running: 5 reqs, Waiting: 0 reqs, GPU KV cache usage: 10.0%, "
         "Prefix cache hit rate: 0.0%")
TABLE = ["INFO 03-01 10:00:{s:02d} [cuda_graph.py:120] **CUDAGraph Stats:**", "",
         "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |",
         "|-----------------|---------------|--------------|--------------|-------|",
         "| 5 | 8 | 3 | FULL | 40 |", "| 2000 | 2000 | 0 | NONE | 2 |", "| 300 | 304 | 4 | PIECEWISE | 3 |"]


def test_kv_transfer_and_graph_table_fill_the_stats_interval():
    lines = [STATS.format(s=0)] + [KV.format(s=5)] + [t.format(s=10) for t in TABLE] + [STATS.format(s=10)]
    tl = vllm_log.read(io.StringIO("\n".join(lines) + "\n"), instance="v", year=2025)
    s = tl.steps
    assert list(s["granularity"]) == ["interval", "interval"]
    last = s.iloc[1]
    assert last["kv_transfer_s"] == pytest.approx(4 * 0.0125) and last["kv_transfer_bytes"] == pytest.approx(32e6)
    assert (last["graph_full_steps"], last["graph_none_steps"], last["graph_piecewise_steps"]) == (40, 2, 3)
    assert last["q_kv_transfer"] == "measured" and last["q_graph_mode"] == "measured"
    assert math.isnan(s.iloc[0].get("kv_transfer_s", math.nan))


def test_kv_transfer_without_a_count_stays_series():
    line = KV.format(s=5).replace("Num successful transfers=4, ", "")
    tl = vllm_log.read(io.StringIO(STATS.format(s=9) + "\n" + line + "\n"), instance="v", year=2025)
    assert "kv_transfer_s" not in tl.steps or tl.steps["kv_transfer_s"].isna().all()
    assert "vllm_log:kv_transfer_avg_xfer_time_ms" in set(tl.series["name"])


def test_year_assumed_is_recorded_for_fusion():
    tl = vllm_log.read(io.StringIO(STATS.format(s=0) + "\n"), instance="v")
    assert isinstance(tl.meta["year_assumed"], int)
    assert "year_assumed" not in vllm_log.read(io.StringIO(STATS.format(s=0) + "\n"), year=2024).meta
