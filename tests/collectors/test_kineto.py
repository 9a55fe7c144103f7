"""Kineto (PyTorch profiler) collector: a trace recorded here with torch.profiler, CUDA launch
events in Kineto's own shape for graph modes, and cut/empty/foreign files."""
import gzip
import json
import time

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from mixdiag.collectors.traces.kineto import reader as kineto
from mixdiag.errors import UserError

PLAN = [("prefill", 64, 0, "NONE"), ("decode", 0, 4, "FULL"), ("mixed", 16, 4, "PIECEWISE"), ("decode", 0, 4, "FULL")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real Kineto trace of a small loop annotated with the contract's range names."""
    path = tmp_path_factory.mktemp("kineto") / "trace.json"
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i, (kind, pre, dec, graph) in enumerate(PLAN):
            msg = (f"step {i} kind={kind} prefill_tokens={pre} decode_reqs={dec} decode_rows={dec} graph={graph}"
                   + (" spec_tokens=0" if i == 2 else ""))  # a later-added field must not break parsing
            with record_function(msg):
                with record_function("schedule"):
                    time.sleep(0.001)
                with record_function("forward"):
                    for _ in range(pre // 16 + 1):
                        x = torch.tanh(x @ x)
                with record_function("sample"):
                    x.argmax()
    prof.export_chrome_trace(str(path))
    return path


def test_recorded_trace_steps_kinds_and_phases(recorded):
    t_read = time.time()
    tl = kineto.read(recorded)
    s = tl.steps
    assert list(s["step"]) == [0, 1, 2, 3]
    assert list(s["kind"]) == [k for k, *_ in PLAN]
    assert list(s["prefill_tokens"]) == [p for _, p, _, _ in PLAN]
    assert list(s["decode_rows"]) == [d for _, _, d, _ in PLAN]
    # No CUDA activity on CPU: graph mode is the engine's planned decision, never a replay.
    assert list(s["graph_mode"]) == [g for *_, g in PLAN] and s["graph_replayed"].isna().all()
    assert (s["schedule_s"] >= 0.001).all() and (s["forward_s"] > 0).all()
    assert (s["cpu_ops"] >= 2).all() and (s["gpu_kernels"] == 0).all()
    assert tl.meta["clock"] == "unix" and abs(s["t_start_s"].iloc[0] - t_read) < 60
    src = tl.meta["sources"][0]
    assert src["step_source"] == "kineto-mixdiag" and src["lines_skipped"] == 0 and not src["partial"]
    events = json.loads(recorded.read_text())["traceEvents"]
    assert src["lines_total"] == len(events)
    assert src["lines_ignored"] == sum(e.get("ph") != "X" for e in events) > 0
    assert src["lines_parsed"] == sum(e.get("ph") == "X" for e in events)


def test_gzip_trace_reads_the_same(recorded, tmp_path):
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(recorded.read_bytes()))
    assert kineto.sniff(gz.read_bytes()[:4096], str(gz))
    assert kineto.read(gz).steps["kind"].tolist() == kineto.read(recorded).steps["kind"].tolist()


def test_cut_trace_is_read_up_to_the_cut_and_flagged(recorded, tmp_path):
    data = recorded.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * 0.7)])
    full = kineto.read(recorded)
    tl = kineto.read(cut)
    src = tl.meta["sources"][0]
    assert tl.meta["partial"] is True and src["partial"] is True
    assert any("JSON cut" in n for n in src["notes"])
    assert 0 < src["lines_total"] < full.meta["sources"][0]["lines_total"]
    assert len(tl.steps) <= len(full.steps)


def _ev(name, cat, ts, dur, tid=1, pid=7, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def _cuda_trace(path, with_steps=True):
    """Kineto's event shapes for CUDA work: runtime calls and kernels linked by ``correlation``."""
    ev = []
    msgs = ["step 0 kind=prefill prefill_tokens=8 decode_reqs=0 decode_rows=0 graph=NONE",
            "step 1 kind=decode prefill_tokens=0 decode_reqs=2 decode_rows=2 graph=FULL",
            "step 2 kind=mixed prefill_tokens=8 decode_reqs=2 decode_rows=2 graph=PIECEWISE"]
    if with_steps:
        ev += [_ev(m, "user_annotation", 1000 * i, 900) for i, m in enumerate(msgs)]
    corr = iter(range(100, 200))

    def launch(ts, graph=False, kernels=1):
        c = next(corr)
        ev.append(_ev("cudaGraphLaunch" if graph else "cudaLaunchKernel", "cuda_runtime", ts, 5, corr=c))
        for j in range(kernels):
            ev.append(_ev(f"k{c}_{j}", "kernel", ts + 20 + 10 * j, 8, pid=0, tid=7, corr=c))

    launch(100), launch(200)                                  # step 0: eager
    launch(1100, graph=True, kernels=3), launch(1500)         # step 1: graph, eager sampling after
    launch(2100, graph=True), launch(2200), launch(2300, graph=True, kernels=2)  # step 2: pieces
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
                                "traceEvents": ev + [{"ph": "X", "name": "broken"}]}))
    return path


def test_graph_mode_from_launches(tmp_path):
    tl = kineto.read(_cuda_trace(tmp_path / "cuda.json"))
    s = tl.steps
    assert list(s["graph_mode"]) == ["NONE", "FULL", "PIECEWISE"]
    assert list(s["graph_replayed"]) == [0.0, 1.0, 1.0]
    assert list(s["gpu_kernels"]) == [2, 4, 4]
    assert s["t_start_s"].iloc[1] == pytest.approx(1_700_000_000 + 0.001)
    src = tl.meta["sources"][0]
    assert src["lines_skipped"] == 1 and "broken" in src["skipped_examples"][0]
    assert tl.meta["signals"][tl.instances[0]]["graph_mode"] == "measured"


def test_without_step_ranges_kernel_gaps_are_marked_heuristic(tmp_path):
    tl = kineto.read(_cuda_trace(tmp_path / "nosteps.json", with_steps=False))
    assert len(tl.steps) == 3 and tl.steps["gpu_kernels"].sum() == 10
    assert list(tl.steps["graph_mode"]) == ["NONE", "FULL", "PIECEWISE"]
    assert tl.meta["sources"][0]["heuristic"] is True and set(tl.steps["kind"]) == {"unknown"}


def test_bare_event_list_and_late_base_time(tmp_path):
    ev = [_ev("step 0 kind=decode prefill_tokens=0 decode_reqs=1 decode_rows=1 graph=FULL", "user_annotation", 10, 5),
          "garbage", _ev("step 1 kind=mixed prefill_tokens=3 decode_reqs=1 decode_rows=1 graph=PIECEWISE",
                         "user_annotation", 20, 5)]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(ev))
    tl = kineto.read(bare)
    assert tl.meta["clock"] == "relative" and list(tl.steps["kind"]) == ["decode", "mixed"]
    assert tl.meta["sources"][0]["lines_skipped"] == 1 and not tl.meta["partial"]
    late = tmp_path / "late.json"
    late.write_text(json.dumps({"traceEvents": ev[:1], "baseTimeNanoseconds": 1_600_000_000_000_000_000}))
    assert kineto.read(late).steps["t_start_s"].iloc[0] == pytest.approx(1_600_000_000 + 10e-6)


@pytest.mark.parametrize("content,message", [
    (b"", "empty file"),
    (b'{"hello": [1, 2, 3]}', "not a Kineto/Chrome trace"),
    (b'{"schemaVersion": 1, "traceEv', "not a readable Kineto trace"),
])
def test_bad_input_is_one_line_user_error(tmp_path, content, message):
    p = tmp_path / "t.json"
    p.write_bytes(content)
    with pytest.raises(UserError, match=message):
        kineto.read(p)


def test_sniff():
    assert kineto.sniff(b'{\n  "schemaVersion": 1,\n  "traceEvents": [', "x.json")
    assert not kineto.sniff(b'{"a": 1}', "x.json") and not kineto.sniff(b"SQLite format 3\x00", "x.json")


def test_engine_trace_and_engine_records_agree_per_step(tmp_path):
    """Acceptance: a Kineto trace of a reference-engine run and the engine's own records of the
    same run give the same per-step kinds (and token counts, planned graph modes)."""
    import subprocess
    import sys

    from mixdiag.collectors import engine_run

    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "mixdiag", "run", "--scenario", "mixed-default", "--seed", "7",
                        "--max-steps", "8", "--profile", "0:8", "--out", str(run), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-500:]
    trace = kineto.read(run / "trace.json").steps.set_index("step")
    records = engine_run.read(run).steps.set_index("step")
    assert len(trace) == 8 and list(trace.index) == list(records.index)
    assert set(trace["kind"]) >= {"prefill", "mixed"}
    for col in ("kind", "prefill_tokens", "decode_reqs", "decode_rows", "graph_mode"):
        assert trace[col].tolist() == records[col].tolist(), col
    # Same clock: the step ranges sit inside the engine's own step timing (which includes scheduling).
    assert (trace["t_start_s"] - records["t_start_s"]).abs().max() < 0.5


def test_engine_step_names_are_a_marked_heuristic(tmp_path):
    ev = [_ev("gpu_model_runner: forward", "user_annotation", 1000 * i, 500) for i in range(3)]
    ev += [_ev("cudaLaunchKernel", "cuda_runtime", 1000 * i + 10, 5, corr=i) for i in range(3)]
    ev += [_ev(f"k{i}", "kernel", 1000 * i + 50, 20, pid=0, tid=7, corr=i) for i in range(3)]
    p = tmp_path / "vllm.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tl = kineto.read(p)
    src = tl.meta["sources"][0]
    assert src["step_source"] == "kineto-engine-naming" and src["heuristic"] is True
    assert list(tl.steps["step"]) == [0, 1, 2] and set(tl.steps["kind"]) == {"unknown"}
    assert list(tl.steps["gpu_kernels"]) == [1, 1, 1] and set(tl.steps["graph_mode"]) == {"NONE"}


#: A tiny run that shows all three post-forward signals within 14 steps: a remote-prefilled prompt
#: whose KV arrives (sync PD) at step 0, a 2-rank EP router skewed in steps 4..9, a 24-block KV pool.
_SIGNALS_SCENARIO = """
name = "trace-signals"
seed = 7
max_steps = 14
[engine]
num_threads = 1
[model]
preset = "tiny"
num_layers = 2
first_k_dense = 0
[cache]
block_size = 16
num_blocks = 24
[scheduler]
policy = "token_budget"
max_num_batched_tokens = 256
[workload]
time_unit = "step"
[[workload.groups]]
name = "chat"
count = 6
arrival = "burst"
start = 1
prompt_len = { dist = "uniform", low = 40, high = 60 }
output_len = { dist = "uniform", low = 40, high = 60 }
[[workload.groups]]
name = "remote"
count = 1
arrival = "fixed"
start = 0
interval = 10
prompt_len = { dist = "fixed", value = 64 }
output_len = { dist = "fixed", value = 4 }
[faults.ep_hotspot]
world_size = 2
hot_rank = 1
strength = 8.0
windows = [[4, 10]]
[faults.pd_transfer]
mode = "sync"
groups = ["remote"]
"""


def test_engine_trace_carries_expert_imbalance_kv_transfer_and_preemption(tmp_path):
    """The step_stats and kv_transfer ranges of a real engine trace give the same post-forward
    values as the engine's records; the last recorded step (profiler stopped before its stats)
    stays NaN rather than invented."""
    import subprocess
    import sys

    from mixdiag.collectors import engine_run

    scen, run = tmp_path / "s.toml", tmp_path / "run"
    scen.write_text(_SIGNALS_SCENARIO)
    p = subprocess.run([sys.executable, "-m", "mixdiag", "run", "--scenario", str(scen), "--profile", "0:14",
                        "--out", str(run), "-q"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-500:]
    tl = kineto.read(run / "trace.json")
    trace = tl.steps.set_index("step")
    records = engine_run.read(run).steps.set_index("step").loc[trace.index]
    sig = tl.meta["signals"][tl.instances[0]]
    assert (sig["expert_imbalance"], sig["kv_transfer"], sig["preemption"]) == ("measured",) * 3
    have = trace["preempted_reqs"].notna()
    assert have.sum() == len(trace) - 1 and not have.iloc[-1]
    t, r = trace[have], records[have]
    assert t["preempted_reqs"].tolist() == r["preempted_reqs"].tolist() and t["preempted_reqs"].sum() > 0
    assert t["kv_transfer_bytes"].tolist() == r["kv_transfer_bytes"].tolist() and t["kv_transfer_bytes"].sum() > 0
    np.testing.assert_allclose(t["expert_imbalance"], r["expert_imbalance"], rtol=1e-3)
    assert t["expert_imbalance"].max() >= 1.9          # the skewed window
    xfer = t["kv_transfer_bytes"] > 0
    assert (t.loc[xfer, "kv_transfer_s"] > 0).all() and (t.loc[~xfer, "kv_transfer_s"] == 0).all()
    # a step starts at its own kv_transfer/schedule ranges, as the engine's records do, so the
    # transfer is not read as host time between steps
    assert (trace["t_start_s"] - records["t_start_s"]).abs().max() < 0.002
    assert trace["schedule_s"].notna().all() and (trace["schedule_s"] > 0).all()


def test_trace_without_step_stats_reports_those_signals_absent(recorded):
    sig = kineto.read(recorded).meta["signals"]
    for s in sig.values():
        assert (s["expert_imbalance"], s["kv_transfer"], s["preemption"]) == ("absent",) * 3


def test_mixdiag_steps_keep_device_rows_with_their_step(tmp_path):
    tl = kineto.read(_cuda_trace(tmp_path / "cuda.json"))
    act = tl.activity
    assert act["step"].value_counts().sort_index().tolist() == list(tl.steps["gpu_kernels"])  # [2, 4, 4]
    assert set(act["instance"]) == set(tl.instances) and (act["launch_ns"] > 0).all()
    # the kernel launched at 1100 us (step 1's graph) starts 20 us after its call, on the unix clock
    k = act[act["name"] == "k102_0"].iloc[0]
    assert k["t_start_ns"] - k["launch_ns"] == 20_000 and k["step"] == 1
    assert len(kineto.read(tmp_path / "cuda.json", device_activity=False).activity) == 0
