"""sglang_log: every real fixture with hand-counted lines, and every format variant of formats.md §2.1."""
import io
import math
from pathlib import Path

import pytest

from mixdiag.collectors.logs import sglang_log
from mixdiag.errors import UserError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# Counted by reading each file: total lines, Prefill rows, Decode rows, retraction lines, ignored
# (the two '# source/# note' header lines, uvicorn access lines, a bare timestamp, 'Benchmark...').
FIXTURES = [
    # name,                total, prefill, decode, events, ignored, instances, clock
    ("sglang_log_11648.txt", 7, 5, 0, 0, 2, 5, "unix"),
    ("sglang_log_13023.txt", 21, 9, 8, 0, 4, 1, "unix"),
    ("sglang_log_14050.txt", 8, 6, 0, 0, 2, 1, "relative"),
    ("sglang_log_20766.txt", 10, 0, 8, 0, 2, 8, "unix"),
    ("sglang_log_22166.txt", 12, 3, 1, 0, 8, 1, "unix"),
    ("sglang_log_2255.txt", 9, 7, 0, 0, 2, 1, "unix"),
    ("sglang_log_4184.txt", 13, 0, 0, 11, 2, 8, "unix"),
    ("sglang_log_6017.txt", 9, 0, 7, 0, 2, 7, "unix"),
    ("sglang_log_7707.txt", 5, 0, 3, 0, 2, 3, "unix"),
]


@pytest.mark.parametrize("name,total,prefill,decode,events,ignored,n_inst,clock", FIXTURES)
def test_fixture_counts(name, total, prefill, decode, events, ignored, n_inst, clock):
    tl = sglang_log.read(FIX / name)
    src = tl.meta["sources"][0]
    assert (src["lines_total"], src["lines_parsed"], src["lines_skipped"], src["lines_ignored"]) == \
        (total, prefill + decode + events, 0, ignored)
    kinds = tl.steps["kind"].value_counts().to_dict()
    assert kinds.get("prefill", 0) == prefill and kinds.get("decode", 0) == decode
    assert len(tl.instances) == n_inst and tl.meta["clock"] == clock
    assert tl.meta["mixed_chunk"] is None and any("assumed mixed chunk off" in n for n in src["notes"])


def test_fixture_values_13023():
    tl = sglang_log.read(FIX / "sglang_log_13023.txt")
    s = tl.steps
    dec = s[s["kind"] == "decode"]
    # cuda graph False for the first two decode lines, True after the batch shrank
    assert list(dec["graph_mode"]) == ["NONE", "NONE"] + ["FULL"] * 6
    # a Decode line's flag is the one the logged forward ran with (the model runner replays exactly when
    # can_run_graph holds and returns that flag; process_batch_result_decode logs it): measured for that
    # forward, with its replay (this log's Prefill lines print no flag; one that does stays estimated)
    assert (dec["q_graph_mode"] == "measured").all()
    assert list(dec["graph_replayed"]) == [0.0, 0.0] + [1.0] * 6
    assert tl.meta["signals"]["sglang_log_13023"]["graph_mode"] == "measured"
    assert list(dec["decode_reqs"]) == [46, 36, 28, 22, 20, 15, 12, 11]
    assert dec["elapsed_s"].iloc[0] == pytest.approx(46 / 1447.08)  # batch / gen throughput
    assert tl.meta["signals"]["sglang_log_13023"]["elapsed_s"] == "estimated"
    pre = s[s["kind"] == "prefill"]
    assert pre["prefill_tokens"].sum() == 771 + 3341 + 895 + 4096 * 5 + 4096
    assert list(pre["running_reqs"])[:2] == [0, 3] and (pre["decode_reqs"] == 0).all()
    assert s["t_start_s"].iloc[0] == 1762833987.0  # 2025-11-11 04:06:27 read as UTC


def test_fixture_values_pd_and_retraction():
    tl = sglang_log.read(FIX / "sglang_log_11648.txt")
    row = tl.steps[tl.steps["instance"] == "sglang_log_11648/DP1-TP1-EP1"].iloc[0]
    assert (row["prefill_tokens"], row["prefill_reqs"], row["kv_usage"]) == (331, 4, 0.01)
    tr = tl.series[(tl.series["name"] == "sglang_log:transferring_req")]
    assert sorted(tr["value"]) == [1, 1, 3, 3, 5]
    tl = sglang_log.read(FIX / "sglang_log_4184.txt")
    r = tl.series[tl.series["name"] == "sglang_log:retracted_reqs"]
    assert len(r) == 11 and r["value"].sum() == 11
    ratio = tl.series[tl.series["name"] == "sglang_log:new_token_ratio"]["value"]
    assert sorted(set(ratio)) == [0.1845, 0.1919]  # the value after '->'


VARIANTS = [
    # dot/comma, [iter], DP/TP/EP prefix with millis, npu graph, PD prefill fields, swa usage
    ("[2026-05-01 10:00:00.250 DP1 TP2 EP3] Prefill batch [17], #new-seq: 1, #new-token: 100, #cached-token: 5, "
     "full token usage: 0.10, swa token usage: 0.05, #running-req: 4, #queue-req: 2, #prealloc-req: 1, "
     "#inflight-req: 0, input throughput (token/s): 12.50, npu graph: True",
     {"instance": "v/DP1-TP2-EP3", "kind": "prefill", "prefill_tokens": 100, "prefix_hit_tokens": 5,
      "kv_usage": 0.10, "running_reqs": 4, "graph_mode": "PIECEWISE", "forward_iter": 17, "t_start_s": 1777629600.25}),
    # swapped field order, input throughput before cuda graph, trailing ','
    ("[2026-05-01 10:00:01] Prefill batch, #new-token: 64, #new-seq: 2, input throughput (token/s): 1.00, "
     "cuda graph: False, #queue-req: 0, #running-req: 0, #cached-token: 0, token usage: 0.01,",
     {"kind": "prefill", "prefill_tokens": 64, "prefill_reqs": 2, "graph_mode": "NONE", "q_graph_mode": "estimated",
      "waiting_reqs": 0}),
    # decode with spec accept len/rate and PD decode fields
    ("[2026-05-01 10:00:02 TP0] Decode batch. #running-req: 8, #token: 900, token usage: 0.05, accept len: 2.50, "
     "accept rate: 0.75, pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 1, #retracted-req: 2, "
     "cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 3",
     {"kind": "decode", "decode_reqs": 8, "decode_rows": math.nan, "preempted_reqs": 2, "graph_mode": "FULL",
      "graph_replayed": 1.0, "q_graph_mode": "measured", "waiting_reqs": 3, "elapsed_s": 8 * 2.5 / 100.0}),
    # early-2025 decode: trailing ", " and largest-len
    ("[2025-02-01 00:00:00] Decode batch. #running-req: 3, #token: 10, token usage: 0.00, "
     "gen throughput (token/s): 5.00, largest-len: 7, #queue-req: 0, ",
     {"kind": "decode", "decode_reqs": 3, "decode_rows": 3, "graph_mode": "unknown"}),
    # docker --timestamps prefix, custom app prefix, no SGLang bracket
    ("2026-05-01T10:00:03.500000000Z myapp | Decode batch, #running-req: 5, token usage: 0.20, cuda graph: True, "
     "gen throughput (token/s): 9.0, #queue-req: 1",
     {"instance": "v", "decode_reqs": 5, "t_start_s": 1777629603.5}),
]


@pytest.mark.parametrize("line,want", VARIANTS)
def test_format_variants(line, want):
    tl = sglang_log.read(io.StringIO(line + "\n"), instance="v")
    src = tl.meta["sources"][0]
    assert (src["lines_parsed"], src["lines_skipped"]) == (1, 0), src
    row = tl.steps.iloc[0]
    for k, v in want.items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(row[k]), k
        else:
            assert row[k] == pytest.approx(v) if isinstance(v, float) else row[k] == v, (k, row[k])


@pytest.mark.parametrize("line,reason", [
    ("[2026-05-01 10:00:00] Prefill batch, #new-seq: 1, #new-tok", "cut mid-way"),
    ("[2026-05-01 10:00:00] Prefill batch, #new-seq: 1, #cached-token: 0", "without '#new-token'"),
    ("[2026-05-01 10:00:00] Decode batch, #running-req: many, #queue-req: 0", "bad value"),
    ("Prefill batch, #new-seq: 1, #new-token: 5\x00\x00", "not text"),
])
def test_unreadable_lines_are_counted(line, reason):
    text = line + "\n[2026-05-01 10:00:01] Decode batch, #running-req: 1, #queue-req: 0\n"
    tl = sglang_log.read(io.StringIO(text))
    src = tl.meta["sources"][0]
    assert (src["lines_parsed"], src["lines_skipped"], src["partial"]) == (1, 1, True)
    assert reason in src["skipped_examples"][0]
    assert len(tl.steps) == 1


def test_unknown_shape_of_a_series_field_keeps_the_line():
    text = "[2026-05-01 10:00:00] Decode batch, #running-req: 7, #pending-token: 12k, cuda graph: True, #queue-req: 0\n"
    tl = sglang_log.read(io.StringIO(text), instance="s")
    src = tl.meta["sources"][0]
    assert (src["lines_parsed"], src["lines_skipped"]) == (1, 0) and tl.steps["decode_reqs"][0] == 7
    assert any("#pending-token" in n for n in src["notes"])
    assert "sglang_log:pending_token" not in set(tl.series["name"])


SERVER_ARGS = ("[2026-05-01 09:59:00] server_args=ServerArgs(model_path='m', chunked_prefill_size=8192, "
               "enable_mixed_chunk={on}, decode_log_interval=40, cuda_graph_max_bs=160)\n")
PREFILL = "[2026-05-01 10:00:00] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, #running-req: 6, #queue-req: 0\n"
PREFILL_ALONE = "[2026-05-01 10:00:01] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, #running-req: 0, #queue-req: 0\n"


@pytest.mark.parametrize("on,option,kind,decode_reqs,quality", [
    ("True", None, "mixed", 6, "inferred"),      # args in the log say mixed chunk on
    ("False", None, "prefill", 0, "measured"),   # args say off: the 6 decodes were stalled
    ("True", False, "prefill", 0, "measured"),   # the option overrides the log
])
def test_mixed_chunk_inferred_only_when_server_args_say_so(on, option, kind, decode_reqs, quality):
    tl = sglang_log.read(io.StringIO(SERVER_ARGS.format(on=on) + PREFILL + PREFILL_ALONE),
                         enable_mixed_chunk=option, instance="s")
    first, second = tl.steps.iloc[0], tl.steps.iloc[1]
    assert (first["kind"], first["decode_reqs"]) == (kind, decode_reqs)
    assert second["kind"] == "prefill"  # nothing running: nothing to mix
    assert tl.meta["signals"]["s"]["kind"] == quality
    assert tl.meta["server_args"]["chunked_prefill_size"] == 8192
    assert tl.meta["sources"][0]["lines_parsed"] == 3


def test_not_sglang_and_empty(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("hello\nworld\n")
    with pytest.raises(UserError, match="no SGLang scheduler line"):
        sglang_log.read(p)
    tl = sglang_log.read(io.BytesIO(b""))
    assert tl.meta["partial"] is True and len(tl.steps) == 0


def test_sniff():
    assert sglang_log.sniff((FIX / "sglang_log_14050.txt").read_bytes(), "x")
    assert not sglang_log.sniff((FIX / "vllm_log_37307.txt").read_bytes(), "x")


def test_lines_logged_out_of_time_order():
    # found by the fuzzer: a later line with an earlier time (clock step, concatenated logs)
    text = ("[2025-11-11 04:28:02] Decode batch, #running-req: 2, cuda graph: True, gen throughput (token/s): 1.0, #queue-req: 0\n"
            "[2025-11-11 04:06:35] Decode batch, #running-req: 3, cuda graph: True, gen throughput (token/s): 2.0, #queue-req: 0\n")
    tl = sglang_log.read(io.StringIO(text), instance="s")
    assert list(tl.steps["decode_reqs"]) == [2, 3]  # line order kept
    assert tl.steps["t_start_s"].is_monotonic_increasing
    assert any("moved forward" in n for n in tl.meta["sources"][0]["notes"])
    thr = tl.series[tl.series["name"] == "sglang_log:gen_throughput_token_per_s"]
    assert list(thr["value"]) == [2.0, 1.0]  # series samples in time order


def test_expert_balancedness_line():
    text = ("[2026-05-01 10:00:00 DP0 TP0 EP0] [Expert Balancedness] forward_pass_id=12 current_pass_balancedness=0.612 "
            "last_10_average_balancedness=0.700 last_100_average_balancedness=0.750 "
            "last_1000_average_balancedness=0.800 gpu_physical_count_sum=4096\n")
    tl = sglang_log.read(io.StringIO(text), instance="s")
    ser = tl.series.set_index("name")["value"]
    assert ser["sglang_log:eplb_current_pass_balancedness"] == 0.612
    assert ser["sglang_log:eplb_forward_pass_id"] == 12 and tl.instances == ["s/DP0-TP0-EP0"]
    assert tl.meta["sources"][0]["lines_parsed"] == 1


@pytest.mark.parametrize("name", [f[0] for f in FIXTURES if f[2] or f[3]])
def test_fixture_rows_carry_the_new_signals(name):
    tl = sglang_log.read(FIX / name)
    s = tl.steps
    assert (s["step_source"] == "log").all()
    pre = s[s["kind"].isin(["prefill", "mixed"])]
    # #new-seq: requests whose prefill began in the batch
    assert (pre["arrivals"].fillna(-1) == pre["prefill_reqs"].fillna(-1)).all()
    assert set(pre["q_token_allocation"]) <= {"measured", "inferred"}


def test_retraction_and_balancedness_fill_the_rows_they_follow():
    text = ("[2026-05-01 10:00:00] Decode batch, #running-req: 8, #token: 100, token usage: 0.90, cuda graph: True, "
            "gen throughput (token/s): 80.00, #queue-req: 0\n"
            "[2026-05-01 10:00:00] Decode out of memory happened. #retracted_reqs: 2, #new_token_ratio: 0.1474 -> 0.1845\n"
            "[2026-05-01 10:00:01] [Expert Balancedness] forward_pass_id=3 current_pass_balancedness=0.500\n"
            "[2026-05-01 10:00:01] [Expert Balancedness] forward_pass_id=4 current_pass_balancedness=0.250\n"
            "[2026-05-01 10:00:02] Decode batch, #running-req: 6, #token: 80, token usage: 0.70, cuda graph: True, "
            "gen throughput (token/s): 60.00, #queue-req: 2\n")
    tl = sglang_log.read(io.StringIO(text), instance="s")
    s = tl.steps
    assert list(s["preempted_reqs"].fillna(0)) == [2.0, 0.0]
    assert s["expert_imbalance"].iloc[0] == pytest.approx((2.0 + 4.0) / 2)  # 1 / balancedness, averaged
    assert s["q_expert_imbalance"].iloc[0] == "measured"
    assert tl.meta["signals"]["s"]["preempted_reqs"] == "measured"


def test_gc_warning_lines_are_timed_pauses_on_their_rows():
    """SGLang's ``--gc-warning-threshold-secs`` hook (utils.configure_gc_warning) logs a collection that took
    longer than the threshold; its duration is a pause the scheduler timed itself. The line's shape is the
    format string of that hook; the batch lines are 13023's shape."""
    text = ("[2025-03-20 15:27:09 TP0] Decode batch. #running-req: 12, #token: 5632, token usage: 0.04, "
            "gen throughput (token/s): 410.12, #queue-req: 0\n"
            "[2025-03-20 15:27:10 TP0] LONG GARBAGE COLLECTION DETECTED | Generation 2 | Duration: 0.3120s | "
            "# Objects: gen0=41, gen1=0, gen2=1803312 | This may cause latency jitter. Consider calling the "
            "freeze_gc API after sending a few warmup requests.\n"
            "[2025-03-20 15:27:11 TP0] Decode batch. #running-req: 12, #token: 6112, token usage: 0.04, "
            "gen throughput (token/s): 305.40, #queue-req: 0\n")
    tl = sglang_log.read(io.StringIO(text))
    g = tl.series[tl.series["name"] == "sglang_log:gc_pause_s"]
    assert list(g["value"]) == [0.312] and list(g["labels"]) == ["generation=2"]
    # on the log's row the pause's line falls to (log_lines.attach_events), once; the interval join places it
    # by its own stamp (collectors/join_cells.py SUM_POINT_SERIES)
    assert tl.steps["host_pause_s"].sum() == pytest.approx(0.312)
    assert tl.steps["host_pause_s"].notna().sum() == 1
