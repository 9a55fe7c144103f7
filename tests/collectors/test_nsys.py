"""Nsight Systems SQLite collector: real fixtures (counts checked with independent SQL) and small
exports built from the real DDL for the NVTX-step, projection and graph-mode paths."""
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from helpers.nsys_export import NsysExport, gpid, gtid

from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.errors import UserError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"
GAP_NS = 500_000  # the collector's default step gap (0.5 ms)


def _sql(path, q, params=()):
    with sqlite3.connect(path) as c:
        return c.execute(q, params).fetchall()


# ---- real exports -----------------------------------------------------------------------------
@pytest.mark.parametrize("name,group,clock", [
    ("h100_2gpu_1s.sqlite", "globalPid", "unix"),
    ("mfu_2gpu_before.sqlite", "globalPid", "unix"),
    ("mock.sqlite", "globalPid", "unix"),
    ("healthy_1pct.sqlite", "deviceId", "relative"),
])
def test_real_exports_ingest_with_counts_from_the_file(name, group, clock):
    path = FIX / name
    tl = nsys.read(path, step_gap_s=GAP_NS / 1e9)  # the same gap as the SQL count below
    src = tl.meta["sources"][0]
    kernels = dict(_sql(path, f"SELECT {group}, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY {group}"))
    # Steps per group, counted by SQLite's own window functions: a step starts where a kernel
    # begins more than the gap after every earlier kernel of its group ended.
    steps = dict(_sql(path, f"""SELECT grp, count(*) FROM (
        SELECT {group} AS grp, start - max("end") OVER (PARTITION BY {group} ORDER BY start
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS gap FROM CUPTI_ACTIVITY_KIND_KERNEL)
        WHERE gap IS NULL OR gap > ? GROUP BY grp""", (GAP_NS,)))
    assert len(tl.instances) == len(kernels)
    per_inst = tl.steps.groupby("instance").agg(n=("step", "size"), k=("gpu_kernels", "sum"))
    assert sorted(per_inst["k"].astype(int)) == sorted(kernels.values())
    assert sorted(per_inst["n"]) == sorted(steps.values())
    assert src["lines_total"] == sum(kernels.values()) and src["lines_skipped"] == 0
    assert src["step_source"] == "kernel-gaps" and src["heuristic"] is True
    assert tl.meta["clock"] == clock and not tl.meta["partial"]
    assert set(tl.steps["kind"]) == {"unknown"}
    (first,) = _sql(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    if clock == "unix":
        utc, sysclk = _sql(path, "SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME")[0]
        assert tl.steps["t_start_s"].min() == pytest.approx((utc + first - sysclk) / 1e9, abs=1e-6)
    else:
        assert tl.steps["t_start_s"].min() == pytest.approx(first / 1e9)
    # The graph mode is read from launches: these captures launched no CUDA graph.
    assert set(tl.steps["graph_mode"]) == {"NONE"}


def test_export_metadata_never_copies_host_user_or_paths():
    src = nsys.read(FIX / "h100_2gpu_1s.sqlite").meta["sources"][0]
    assert src["export_schema_version"] == "3.25.0"
    assert "rich-wsl" not in repr(src) and "DESKTOP" not in repr(src)


def test_step_gap_option_changes_the_split():
    fine = nsys.read(FIX / "h100_2gpu_1s.sqlite", step_gap_s=0.0001)
    coarse = nsys.read(FIX / "h100_2gpu_1s.sqlite", step_gap_s=0.01)
    assert len(fine.steps) > len(coarse.steps) >= 2
    assert fine.steps["gpu_kernels"].sum() == coarse.steps["gpu_kernels"].sum() == 3442


# ---- NVTX step ranges, projection, graph mode -------------------------------------------------
T0 = 11_000_000_000  # target clock ns; the session started at 10 s on it
MS = 1_000_000
TID, OTHER = gtid(100, 100), gtid(200, 200)


def _nvtx_export(path, tables=NsysExport.CORE + ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "TARGET_INFO_GPU_METRICS",
                                                  "GPU_METRICS")):
    e = NsysExport(path, tables)
    e.domain(1, "mixdiag", TID)
    msgs = ["step 0 kind=prefill prefill_tokens=512 decode_reqs=0 decode_rows=0 graph=NONE",
            "step 1 kind=decode prefill_tokens=0 decode_reqs=8 decode_rows=8 graph=FULL",
            "step 2 kind=mixed prefill_tokens=100 decode_reqs=4 decode_rows=4 graph=PIECEWISE spec=0 extra=abc"]
    for i, (m, total) in enumerate(zip(msgs, (512, 8, 104))):
        e.nvtx(T0 + 20 * i * MS, T0 + (20 * i + 10) * MS, m, TID, registered=True, domain=1, int64=total)
    e.nvtx(T0 + 70 * MS, T0 + 71 * MS, "step x kind=decode", TID, registered=True, domain=1)  # unparseable
    e.nvtx(T0 + int(0.1 * MS), T0 + int(0.3 * MS), "schedule", TID, registered=True, domain=1)
    e.nvtx(T0 + int(0.3 * MS), T0 + int(0.5 * MS), "prepare_inputs", TID, registered=True, domain=1)
    e.nvtx(T0 + 20 * MS + int(0.1 * MS), T0 + 20 * MS + int(0.4 * MS), "schedule", TID, registered=True, domain=1)
    e.nvtx(T0 + 1 * MS, T0 + 2 * MS, "aten::mm", TID)  # not a step or phase: ignored
    launch, graph = "cudaLaunchKernel_v7000", "cudaGraphLaunch_v10000"
    # step 0: three eager kernels
    for c in (1, 2, 3):
        e.call(T0 + c * MS, T0 + c * MS + 5000, launch, c, TID)
        e.kernel(T0 + (c + 3) * MS, T0 + (c + 3) * MS + 400_000, c, 100)
    # step 1: one graph launch (graph-trace row), then eager sampling
    e.call(T0 + 21 * MS, T0 + 21 * MS + 9000, graph, 4, TID)
    e.graph_trace(T0 + 22 * MS, T0 + 26 * MS, 4, 100)
    e.call(T0 + 25 * MS, T0 + 25 * MS + 5000, launch, 5, TID)
    e.kernel(T0 + 26 * MS, T0 + 27 * MS, 5, 100)
    # step 2: graph, eager, graph (node mode: two kernels share the launch's correlation id), eager
    e.call(T0 + 41 * MS, T0 + 41 * MS + 9000, graph, 6, TID)
    e.graph_trace(T0 + 42 * MS, T0 + 43 * MS, 6, 100)
    e.call(T0 + 42 * MS, T0 + 42 * MS + 5000, launch, 7, TID)
    e.kernel(T0 + 43 * MS, T0 + 44 * MS, 7, 100)
    e.call(T0 + 43 * MS, T0 + 43 * MS + 9000, graph, 8, TID)
    e.kernel(T0 + 44 * MS, T0 + 45 * MS, 8, 100, graph_id=3)
    e.kernel(T0 + 45 * MS, T0 + 46 * MS, 8, 100, graph_id=3)
    e.call(T0 + 47 * MS, T0 + 47 * MS + 5000, launch, 9, TID)
    e.kernel(T0 + 48 * MS, T0 + 49 * MS, 9, 100)
    # outside any step, and another process reusing correlation id 2 (must not land in step 0)
    e.call(T0 + 60 * MS, T0 + 60 * MS + 5000, launch, 10, TID)
    e.kernel(T0 + 61 * MS, T0 + 62 * MS, 10, 100)
    e.call(T0 + 2 * MS, T0 + 2 * MS + 5000, launch, 2, OTHER)
    e.kernel(T0 + 5 * MS, T0 + 6 * MS, 2, 200, device=1)
    if "GPU_METRICS" in tables:
        for t_ms, pct in ((4.5, 20), (5.5, 40), (23, 90), (24, 70), (44.5, 100), (80, 5)):
            e.sm_metric(T0 + int(t_ms * MS), pct, name="SM Active [Throughput %]")
    return e.close()


def test_nvtx_steps_projection_and_graph_modes(tmp_path):
    tl = nsys.read(_nvtx_export(tmp_path / "run.sqlite"), instance="gpu-node")
    s = tl.steps.set_index("step")
    src = tl.meta["sources"][0]
    assert tl.instances == ["gpu-node"] and tl.meta["clock"] == "unix"
    assert list(s.index) == [0, 1, 2]
    assert list(s["kind"]) == ["prefill", "decode", "mixed"]
    assert list(s["prefill_tokens"]) == [512, 0, 100] and list(s["decode_rows"]) == [0, 8, 4]
    assert list(s["graph_mode"]) == ["NONE", "FULL", "PIECEWISE"]
    assert list(s["graph_replayed"]) == [0.0, 1.0, 1.0]
    assert list(s["graph_launches"]) == [0, 1, 2]
    assert list(s["scheduled_tokens"]) == [512, 8, 104]  # the ranges' integer payloads
    # Kernels by correlationId + process: pid 200's kernel with correlation id 2 is not step 0's.
    assert list(s["gpu_kernels"]) == [3, 1, 4]
    assert s.loc[0, "forward_s"] == pytest.approx(((T0 + 6.4 * MS) - (T0 + 4 * MS)) / 1e9)
    assert s.loc[1, "forward_s"] == pytest.approx(5 * MS / 1e9)  # graph replay 22..26 ms + kernel to 27 ms
    assert s.loc[0, "schedule_s"] == pytest.approx(0.0002) and s.loc[0, "prepare_s"] == pytest.approx(0.0002)
    assert s.loc[1, "schedule_s"] == pytest.approx(0.0003) and np.isnan(s.loc[1, "prepare_s"])
    assert s.loc[0, "t_start_s"] == pytest.approx(1_700_000_000.0 + 1.0)
    assert s.loc[0, "sm_active"] == pytest.approx(0.3) and s.loc[1, "sm_active"] == pytest.approx(0.8)
    assert s.loc[2, "sm_active"] == pytest.approx(1.0)
    assert src["step_source"] == "nvtx-mixdiag" and src["heuristic"] is False
    assert src["kernels_total"] == 10 and src["kernels_in_steps"] == 8
    assert src["lines_skipped"] == 1 + 2  # the unparseable step message + two kernels outside steps
    # rows read: 4 step candidates + 3 phase ranges, 10 kernels, 2 graph-trace rows
    assert src["lines_total"] == 19 and src["lines_parsed"] == 3 + 8 and src["lines_ignored"] == 3 + 2
    assert any("step x" in e for e in src["skipped_examples"])
    sig = tl.meta["signals"]["gpu-node"]
    assert sig["kind"] == "measured" and sig["graph_mode"] == "measured" and sig["sm_active"] == "measured"
    assert set(tl.series["name"]) == {"gpu_sm_active_ratio"} and len(tl.series) == 6


def test_without_cuda_trace_graph_mode_is_the_engines_plan(tmp_path):
    e = NsysExport(tmp_path / "cpu.sqlite", ("StringIds", "NVTX_EVENTS", "TARGET_INFO_SESSION_START_TIME"))
    e.nvtx(T0, T0 + MS, "step 7 kind=decode prefill_tokens=0 decode_reqs=2 decode_rows=2 graph=FULL", TID, double=2.0)
    e.nvtx(T0 + 2 * MS, T0 + 3 * MS, "step 8 kind=mixed prefill_tokens=9 decode_reqs=2 decode_rows=2 graph=PIECEWISE", TID)
    tl = nsys.read(e.close())
    assert list(tl.steps["step"]) == [7, 8] and list(tl.steps["graph_mode"]) == ["FULL", "PIECEWISE"]
    assert tl.steps["graph_replayed"].isna().all()
    assert tl.steps["scheduled_tokens"].iloc[0] == 2.0 and np.isnan(tl.steps["scheduled_tokens"].iloc[1])
    assert tl.meta["signals"][tl.instances[0]]["graph_mode"] == "estimated"
    assert any("outside an NVTX domain named 'mixdiag'" in n for n in tl.meta["sources"][0]["notes"])


def test_steps_and_kernels_without_runtime_table_is_partial(tmp_path):
    e = NsysExport(tmp_path / "noruntime.sqlite", ("StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL"))
    e.nvtx(T0, T0 + MS, "step 0 kind=decode prefill_tokens=0 decode_reqs=1 decode_rows=1 graph=FULL", TID)
    e.kernel(T0 + 100, T0 + 200, 1, 100)
    tl = nsys.read(e.close())
    assert tl.meta["partial"] is True and tl.meta["sources"][0]["partial"] is True
    assert any("RUNTIME" in n for n in tl.meta["sources"][0]["notes"])
    assert list(tl.steps["kind"]) == ["decode"]


def test_engine_step_names_are_a_marked_heuristic(tmp_path):
    e = NsysExport(tmp_path / "vllm.sqlite")
    for i in range(3):
        e.nvtx(T0 + 10 * i * MS, T0 + (10 * i + 5) * MS, "execute_model", TID)
        e.call(T0 + 10 * i * MS + 100, T0 + 10 * i * MS + 200, "cuLaunchKernelEx", 50 + i, TID)
        e.kernel(T0 + 10 * i * MS + 300, T0 + 10 * i * MS + 900, 50 + i, 100)
    tl = nsys.read(e.close())
    src = tl.meta["sources"][0]
    assert src["step_source"] == "nvtx-engine-naming" and src["heuristic"] is True
    assert list(tl.steps["step"]) == [0, 1, 2] and set(tl.steps["kind"]) == {"unknown"}
    assert list(tl.steps["gpu_kernels"]) == [1, 1, 1] and set(tl.steps["graph_mode"]) == {"NONE"}


def test_gap_steps_read_graph_mode_from_gpu_work(tmp_path):
    e = NsysExport(tmp_path / "gaps.sqlite", NsysExport.CORE + ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE",))
    e.string("cudaGraphLaunch_v10000")
    # step 0: eager only; step 1: one graph replay + eager after; step 2: graph / eager / graph (node mode)
    e.kernel(T0, T0 + MS, 1, 100)
    e.kernel(T0 + MS, T0 + 2 * MS, 2, 100)
    e.graph_trace(T0 + 10 * MS, T0 + 12 * MS, 3, 100)
    e.kernel(T0 + 12 * MS, T0 + 13 * MS, 4, 100)
    e.kernel(T0 + 20 * MS, T0 + 21 * MS, 5, 100, graph_id=9)
    e.kernel(T0 + 21 * MS, T0 + 22 * MS, 5, 100, graph_id=9)
    e.kernel(T0 + 22 * MS, T0 + 23 * MS, 6, 100)
    e.kernel(T0 + 23 * MS, T0 + 24 * MS, 7, 100, graph_id=9)
    tl = nsys.read(e.close())
    assert list(tl.steps["graph_mode"]) == ["NONE", "FULL", "PIECEWISE"]
    assert list(tl.steps["graph_launches"]) == [0, 1, 2]
    assert list(tl.steps["gpu_kernels"]) == [2, 1, 4]


def test_graph_launches_without_gpu_rows_leave_graph_mode_unknown(tmp_path):
    e = NsysExport(tmp_path / "hidden.sqlite")
    e.call(T0, T0 + 100, "cudaGraphLaunch_v10000", 1, TID)
    e.kernel(T0 + MS, T0 + 2 * MS, 2, 100)
    tl = nsys.read(e.close())
    assert list(tl.steps["graph_mode"]) == ["unknown"] and tl.steps["graph_replayed"].isna().all()


# ---- bad input --------------------------------------------------------------------------------
def _truncated(tmp_path):
    p = tmp_path / "cut.sqlite"
    data = (FIX / "mfu_2gpu_before.sqlite").read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


def _unrelated(tmp_path):
    p = tmp_path / "other.sqlite"
    with sqlite3.connect(p) as c:
        c.execute("CREATE TABLE t (x)")
    return p


def _text(tmp_path):
    p = tmp_path / "notes.sqlite"
    p.write_text("this is not a database\n")
    return p


def _empty(tmp_path):
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    return p


def _report(tmp_path):
    p = tmp_path / "profile.nsys-rep"
    p.write_bytes(b"\x00NSYS-REP\x01" * 10)
    return p


@pytest.mark.parametrize("make,message", [
    (_truncated, "truncated SQLite file"),
    (_unrelated, "not an Nsight Systems export"),
    (_text, "not an SQLite file"),
    (_empty, "empty file"),
    (_report, "nsys export --type sqlite"),
])
def test_bad_input_is_one_line_user_error(tmp_path, make, message):
    with pytest.raises(UserError) as e:
        nsys.read(make(tmp_path))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_corrupt_pages_inside_a_valid_header_are_a_user_error(tmp_path):
    p = tmp_path / "garbled.sqlite"
    shutil.copy(FIX / "mock.sqlite", p)
    data = bytearray(p.read_bytes())
    data[4096:len(data)] = b"\xff" * (len(data) - 4096)  # every page after the first is garbage
    p.write_bytes(bytes(data))
    with pytest.raises(UserError, match="corrupt|not a readable"):
        nsys.read(p)


def test_sniff_by_magic_bytes():
    head = (FIX / "mock.sqlite").read_bytes()[:100]
    assert nsys.sniff(head, "x.bin") and not nsys.sniff(b"# HELP x\n", "x.sqlite")


def test_export_ids_in_helpers_match_real_layout():
    # The helper's ids follow the real exports' layout (HW bits set, PID in bits 24..47).
    (g,) = _sql(FIX / "h100_2gpu_1s.sqlite", "SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1")[0]
    assert g >> 48 == gpid(1) >> 48 and nsys.pid_of(gpid(123)) == 123


def test_stdlib_sqlite3_path_gives_the_same_timeline(tmp_path, monkeypatch):
    """Without adbc-driver-sqlite the collector reads with sqlite3 cursors: same result."""
    from mixdiag.collectors.traces.nsys.db import NsysDb

    paths = [FIX / "h100_2gpu_1s.sqlite", FIX / "healthy_1pct.sqlite", _nvtx_export(tmp_path / "nv.sqlite")]
    fast = [nsys.read(p) for p in paths]
    with NsysDb(paths[0]) as db:
        assert db.arrow_connection() is not None  # the fast path is what ran above
    monkeypatch.setattr(NsysDb, "arrow_connection", lambda self: None)
    for p, a in zip(paths, fast):
        b = nsys.read(p)
        assert a.steps.equals(b.steps) and a.series.equals(b.series) and a.meta == b.meta, p.name


def test_arrow_failure_falls_back_to_sqlite3(monkeypatch):
    from mixdiag.collectors.traces.nsys import kernels as nsys_kernels

    want = nsys.read(FIX / "mock.sqlite")

    def refuse(*a, **k):
        raise RuntimeError("driver refused the column types")

    monkeypatch.setattr(nsys_kernels, "_fetch_arrow", refuse)
    assert nsys.read(FIX / "mock.sqlite").steps.equals(want.steps)


def test_step_stats_and_kv_transfer_ranges_fill_post_forward_signals(tmp_path):
    e = NsysExport(tmp_path / "stats.sqlite", ("StringIds", "NVTX_EVENTS", "TARGET_INFO_SESSION_START_TIME"))
    e.domain(1, "mixdiag", TID)
    ranges = [(0, 1, "kv_transfer"),                                    # KV received before step 0 schedules
              (1, 2, "schedule"),
              (2, 5, "step 0 kind=prefill prefill_tokens=64 decode_reqs=0 decode_rows=0 graph=NONE"),
              (6, 6, "step_stats 0 preempted_reqs=0 kv_transfer_bytes=4096 expert_imbalance=2 per_rank_tokens=0,8"),
              (7, 7.5, "kv_transfer"),                                  # a poll: no bytes arrived
              (7.5, 8, "schedule"),
              (8, 9, "step 1 kind=decode prefill_tokens=0 decode_reqs=1 decode_rows=1 graph=FULL"),
              (10, 10, "step_stats 1 preempted_reqs=1 kv_transfer_bytes=0 expert_imbalance=1.25 per_rank_tokens=4,6"),
              (12, 13, "step 2 kind=decode prefill_tokens=0 decode_reqs=1 decode_rows=1 graph=FULL")]  # no stats
    for a, b, m in ranges:
        e.nvtx(T0 + int(a * MS), T0 + int(b * MS), m, TID, registered=True, domain=1)
    tl = nsys.read(e.close())
    s = tl.steps.set_index("step")
    assert list(s.index) == [0, 1, 2]
    np.testing.assert_equal(s["expert_imbalance"].to_numpy(), [2.0, 1.25, np.nan])
    np.testing.assert_equal(s["preempted_reqs"].to_numpy(), [0.0, 1.0, np.nan])
    np.testing.assert_equal(s["kv_transfer_bytes"].to_numpy(), [4096.0, 0.0, np.nan])
    assert s.loc[0, "kv_transfer_s"] == pytest.approx(0.001) and s.loc[1, "kv_transfer_s"] == 0.0
    assert np.isnan(s.loc[2, "kv_transfer_s"])
    # step 0 starts at its kv_transfer range (the engine's order: kv_transfer, schedule, step)
    assert s.loc[1, "t_start_s"] - s.loc[0, "t_start_s"] == pytest.approx(0.007, abs=1e-6)
    assert s.loc[2, "t_start_s"] - s.loc[0, "t_start_s"] == pytest.approx(0.012, abs=1e-6)   # no own phases
    assert list(s["schedule_s"].round(6))[:2] == [0.001, 0.0005] and np.isnan(s.loc[2, "schedule_s"])
    sig = tl.meta["signals"][tl.instances[0]]
    assert (sig["expert_imbalance"], sig["kv_transfer"], sig["preemption"]) == ("measured",) * 3


def test_export_without_step_stats_reports_those_signals_absent(tmp_path):
    sig = nsys.read(_nvtx_export(tmp_path / "run.sqlite")).meta["signals"]
    for s in sig.values():
        assert (s["expert_imbalance"], s["kv_transfer"], s["preemption"]) == ("absent",) * 3


@pytest.mark.parametrize("progress,drawn", [(True, True), (False, False), (None, False)])
def test_progress_bar_on_stderr_only_when_asked_or_long_on_a_terminal(capsys, progress, drawn):
    """A bar while GPU rows are read: forced with True, never with False (the CLI's -q/--json),
    and by default only for >= PROGRESS_MIN_ROWS rows on a terminal (pytest's stderr is not one)."""
    from argparse import Namespace

    from mixdiag.commands.flags import step_options

    nsys.read(FIX / "h100_2gpu_1s.sqlite", progress=progress)
    out = capsys.readouterr()
    assert ("GPU rows" in out.err) == drawn and out.out == ""
    assert step_options(Namespace(quiet=False, json=True))["progress"] is False
    assert "progress" not in step_options(Namespace(quiet=False, json=False))
