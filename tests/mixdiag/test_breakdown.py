"""The kernel and idle breakdown (mixdiag/diagnosis/breakdown/) on exports whose answers are known by
construction, on a CPU-only PyTorch-profiler trace, and on the real Nsight fixtures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.breakdown import breakdown
from mixdiag.diagnosis.breakdown.intervals import Segments, intersect, measure, union
from mixdiag.schema import Timeline
from tests.helpers.nsys_export import NsysExport, gtid

FIX = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000  # ns

# ---- a 4-rank EP job, every number known by construction ------------------------------------
RANKS, STEPS, PERIOD = 4, 20, 10 * MS
BASE = 10_000_000_000 + MS           # target clock ns (the session starts at 10 s)
C = MS                               # each rank's fused_moe per step ...
SLOW_RANK, SLOW_STEP, C_SLOW = 1, 5, 4_100_000  # ... except rank 1's in step 5: 4.1x
DEP_GAP = 20_000                     # compute end -> all-to-all start (launch issued long before)
LAUNCH_TO_START = 100_000            # a step's first launch call -> its first kernel
COMM_TAIL = 200_000                  # the all-to-all's own time once the last rank arrived
OVERLAP = 150_000                    # a shared-expert GEMM on another stream during the all-to-all
COPY_NS, COPY_BYTES = 4_000, 4096    # one H2D copy per step, on a third stream, inside the all-to-all


def _compute(r: int, k: int) -> int:
    return C_SLOW if (r, k) == (SLOW_RANK, SLOW_STEP) else C


def _comm_end(k: int) -> int:
    t = BASE + k * PERIOD
    return t + LAUNCH_TO_START + max(_compute(r, k) for r in range(RANKS)) + DEP_GAP + COMM_TAIL


def ep_export(path: Path) -> Path:
    ex = NsysExport(path, tables=NsysExport.CORE + ("CUPTI_ACTIVITY_KIND_MEMCPY",))
    for r in range(RANKS):
        pid, tid = 101 + r, gtid(101 + r, 1)
        for k in range(STEPS):
            t = BASE + k * PERIOD
            c0 = 10 * k + 1
            ex.nvtx(t, t + 9 * MS, "execute_model", tid)  # vLLM's step range (collectors' STEP_RANGES)
            ex.call(t, t + 5_000, "cudaLaunchKernel_v7000", c0, tid)
            ex.call(t + 10_000, t + 15_000, "cudaLaunchKernel_v7000", c0 + 1, tid)
            ex.call(t + 16_000, t + 18_000, "cudaLaunchKernel_v7000", c0 + 2, tid)
            ex.call(t + 20_000, t + 25_000, "cudaMemcpyAsync_v3020", c0 + 3, tid)
            k0 = t + LAUNCH_TO_START
            k1 = k0 + _compute(r, k)
            s = k1 + DEP_GAP
            ex.kernel(k0, k1, c0, pid, device=r, name="fused_moe_kernel")
            ex.kernel(s, _comm_end(k), c0 + 1, pid, device=r, name="ncclDevKernel_AllToAll_RING_LL")
            ex.kernel(s, s + OVERLAP, c0 + 2, pid, device=r, name="shared_expert_gemm", stream=8)
            ex.memcpy(s, s + COPY_NS, c0 + 3, pid, nbytes=COPY_BYTES, copy_kind=1, device=r, stream=9)
    return ex.close()


@pytest.fixture(scope="module")
def ep(tmp_path_factory):
    tl = nsys.read(ep_export(tmp_path_factory.mktemp("bd") / "ep4.sqlite"))
    return tl, breakdown(tl, diagnose(tl))


def _all(frame: pd.DataFrame, rank: int) -> pd.Series:
    rows = frame[(frame["rank"] == rank) & (frame["step_class"] == "all")]
    assert len(rows) == 1
    return rows.iloc[0]


def test_each_rank_keeps_its_device_rows_with_steps_and_launch_times(ep):
    tl, _ = ep
    act = tl.activity
    assert len(act) == RANKS * STEPS * 4
    assert sorted(act["device"].unique()) == list(range(RANKS))
    assert (act["step"] >= 0).all() and (act.groupby("instance", observed=True)["step"].nunique() == STEPS).all()
    assert set(act.loc[act["role"] == "comm", "name"].astype(str)) == {"ncclDevKernel_AllToAll_RING_LL"}
    cp = act[act["kind"] == "memcpy"]
    assert (cp["copy_kind"] == "H2D").all() and (cp["bytes"] == COPY_BYTES).all()


@pytest.mark.parametrize("rank", range(RANKS))
def test_idle_split_and_utilisation_match_construction(ep, rank):
    _, b = ep
    u = _all(b.utilisation, rank)
    first = BASE + LAUNCH_TO_START
    wall = _comm_end(STEPS - 1) - first
    host = sum(BASE + k * PERIOD - _comm_end(k - 1) for k in range(1, STEPS))
    kernel = (STEPS - 1) * LAUNCH_TO_START + STEPS * DEP_GAP
    busy = wall - host - kernel
    assert u["steps"] == STEPS
    assert u["wall_s"] == pytest.approx(wall / 1e9, abs=1e-9)
    assert u["host_wait_s"] == pytest.approx(host / 1e9, abs=1e-9)
    assert u["kernel_wait_s"] == pytest.approx(kernel / 1e9, abs=1e-9)
    assert u["other_idle_s"] == 0
    assert u["busy_s"] == pytest.approx(busy / 1e9, abs=1e-9)
    assert u["utilisation"] == pytest.approx(busy / wall)


@pytest.mark.parametrize("rank", range(RANKS))
def test_comm_time_and_its_overlap_with_compute(ep, rank):
    _, b = ep
    c = _all(b.comm, rank)
    comm = sum(_comm_end(k) - (BASE + k * PERIOD + LAUNCH_TO_START + _compute(rank, k) + DEP_GAP) for k in range(STEPS))
    assert c["comm_s"] == pytest.approx(comm / 1e9, abs=1e-9)
    assert c["overlap_s"] == pytest.approx(STEPS * OVERLAP / 1e9, abs=1e-9)
    assert c["overlap_share"] == pytest.approx(STEPS * OVERLAP / comm)
    assert c["compute_s"] == pytest.approx(sum(_compute(rank, k) + OVERLAP for k in range(STEPS)) / 1e9, abs=1e-9)


def test_copies_by_direction_and_stream(ep):
    _, b = ep
    m = b.memcpy[(b.memcpy["step_class"] == "all")]
    assert len(m) == RANKS and set(m["direction"]) == {"H2D"} and set(m["stream"]) == {9}
    assert (m["copies"] == STEPS).all() and (m["bytes"] == STEPS * COPY_BYTES).all()
    assert np.allclose(m["bandwidth_gb_per_s"], COPY_BYTES / COPY_NS)  # bytes/ns = GB/s


def test_top_kernels_and_shares(ep):
    _, b = ep
    k = b.kernels[(b.kernels["rank"] == SLOW_RANK) & (b.kernels["step_class"] == "all")].set_index("kernel")
    assert list(k.columns) == ["instance", "rank", "step_class", "time_s", "calls", "share"]
    moe = (STEPS - 1) * C + C_SLOW
    assert k.index[0] == "fused_moe_kernel"
    assert k.loc["fused_moe_kernel", "time_s"] == pytest.approx(moe / 1e9, abs=1e-9)
    assert k.loc["fused_moe_kernel", "calls"] == STEPS
    assert k["share"].sum() == pytest.approx(1.0)


def test_the_straggler_is_named_with_its_kernel_and_the_waiting_ranks(ep):
    _, b = ep
    st = b.stragglers
    assert len(st) == 1
    r = st.iloc[0]
    assert (r["label"], r["rank"], r["kernel"]) == (f"rank {SLOW_RANK}", SLOW_RANK, "fused_moe_kernel")
    assert r["kernel_ratio"] == pytest.approx(C_SLOW / C)
    assert r["ratio"] == pytest.approx((C_SLOW + OVERLAP) / (C + OVERLAP))
    assert r["waiting"] == "rank 0, rank 2, rank 3" and r["comm_kernel"] == "ncclDevKernel_AllToAll_RING_LL"
    assert r["wait_s"] == pytest.approx((C_SLOW - C) / 1e9, abs=1e-9)  # the others' extra time in the all-to-all
    from mixdiag.report_breakdown import straggler_sentence
    assert straggler_sentence(r).startswith("rank 1's fused_moe_kernel ran 4.1x longer")
    summary = b.straggler_summary[b.straggler_summary["step_class"] == "all"].set_index("rank")
    assert summary.loc[SLOW_RANK, "straggler_steps"] == 1 and summary["straggler_steps"].sum() == 1


def test_without_launch_calls_idle_is_other_and_flagged(tmp_path):
    ex = NsysExport(tmp_path / "norun.sqlite", tables=("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL",
                                                        "TARGET_INFO_SESSION_START_TIME"))
    for i in range(40):  # 2 kernels per 1 ms step; 20 us apart inside, 600 us between steps
        t = BASE + i * MS
        ex.kernel(t, t + 200_000, 2 * i, 101, name="a")
        ex.kernel(t + 220_000, t + 400_000, 2 * i + 1, 101, name="b")
    tl = nsys.read(ex.close())
    b = breakdown(tl, diagnose(tl))
    u = _all(b.utilisation, 0)
    assert u["host_wait_s"] == 0 and u["kernel_wait_s"] == 0
    assert u["other_idle_s"] == pytest.approx(u["idle_s"]) and u["idle_s"] == pytest.approx(
        (40 * 20_000 + 39 * 600_000) / 1e9)
    assert b.partial and any("'other'" in n for n in b.notes)


def test_cpu_only_trace_gives_no_device_activity_not_an_error():
    trace = FIX / "kineto" / "cpu_only_torch2.13.json"
    cmd = [sys.executable, "-m", "mixdiag", "analyze", str(trace)]
    text = subprocess.run(cmd, capture_output=True, text=True)
    doc = subprocess.run(cmd + ["--json"], capture_output=True, text=True)
    assert text.returncode == 0 and doc.returncode == 0, text.stderr + doc.stderr
    assert "Device breakdown: no device activity" in text.stdout and "Traceback" not in text.stderr
    bd = json.loads(doc.stdout)["breakdown"]
    assert bd["status"] == "no_device_activity" and bd["kernels"] == [] and bd["utilisation"] == []


@pytest.mark.parametrize("name", ["h100_2gpu_1s", "mfu_2gpu_before", "mock", "healthy_1pct"])
def test_real_exports_add_up(name):
    tl = nsys.read(FIX / "nsys" / f"{name}.sqlite")
    b = breakdown(tl, diagnose(tl))
    assert b.status == "ok"
    u = b.utilisation
    parts = u["host_wait_s"] + u["kernel_wait_s"] + u["other_idle_s"]
    assert np.allclose(parts, u["idle_s"], atol=1e-9)  # the split covers idle time exactly
    assert (u["busy_s"] <= u["wall_s"] + 1e-12).all() and u["utilisation"].between(0, 1).all()
    kern = b.kernels[b.kernels["step_class"] == "all"]
    # the 'all' class's kernel time is every kernel row's duration
    act = tl.activity[tl.activity["kind"] == "kernel"]
    top_total = kern.groupby("rank")["time_s"].sum() / kern.groupby("rank")["share"].sum()
    per_dev = (act["t_end_ns"] - act["t_start_ns"]).groupby(act["device"]).sum() / 1e9
    assert np.allclose(top_total.sort_index().to_numpy(), per_dev.sort_index().to_numpy())


def test_activity_survives_save_and_load(ep, tmp_path):
    tl, _ = ep
    tl.save(tmp_path / "run")
    back = Timeline.load(tmp_path / "run")
    assert back.activity.equals(tl.activity)
    assert len(Timeline.concat([tl.slice(instances=tl.instances[:1])]).activity) == STEPS * 4


UNION = [  # (starts, ends) sorted by start -> merged segments
    ([0, 5, 20], [10, 8, 30], [(0, 10), (20, 30)]),
    ([0, 10], [10, 12], [(0, 12)]),
    ([0, 11], [10, 12], [(0, 10), (11, 12)]),
]


@pytest.mark.parametrize("s,e,want", UNION)
def test_union(s, e, want):
    u = union(np.array(s), np.array(e))
    assert list(zip(u.start.tolist(), u.end.tolist())) == want


def test_intersect_and_measure():
    a = Segments(np.array([0, 20]), np.array([10, 30]))
    b = Segments(np.array([5, 10]), np.array([10, 25]))
    both = intersect(a, b)
    assert list(zip(both.start.tolist(), both.end.tolist())) == [(5, 10), (20, 25)]
    assert measure(a, np.array([0, 5, 12]), np.array([30, 25, 18])).tolist() == [20.0, 10.0, 0.0]


def test_kernels_traced_but_not_kept_are_named_as_such(ep):
    tl, _ = ep
    plain = Timeline(tl.steps, tl.tokens, tl.series, tl.meta)  # the same steps, no activity rows
    b = breakdown(plain, diagnose(plain))
    assert b.status == "no_device_activity" and "no per-kernel rows were kept" in b.notes[0]


@pytest.mark.parametrize("steps", [
    [0, 1, 2, 3, 4],                # dense step numbers: the direct table
    [0, 7, 1_000_000, 5_000_000_000],  # sparse: the hashed search
    [3, 3, 4],                      # a repeated (instance, step): the first row, on either path
])
def test_step_lookup_finds_each_instance_step_row(steps):
    from mixdiag.diagnosis.breakdown.classes import StepClasses

    inst = np.array(["a"] * len(steps) + ["b"])
    step = np.array(steps + [steps[0]], dtype=np.int64)
    sc = StepClasses(inst, step, ("all",), np.ones((len(step), 1), bool), np.ones(len(step), bool))
    names = ["b", "a", "c"]  # categorical order differs from the step rows'; "c" has no steps
    q_inst = np.array([1] * len(steps) + [0, 2, 1, 1], dtype=np.int8)
    q_step = np.array(steps + [steps[0], steps[0], -1, max(steps) + 1], dtype=np.int64)
    first = {}
    for i, (n, s) in enumerate(zip(inst, step)):
        first.setdefault((n, int(s)), i)
    want = [first.get((names[c], int(s)), -1) if s >= 0 else -1 for c, s in zip(q_inst, q_step)]
    assert sc.lookup(q_inst, names, q_step).tolist() == want


@pytest.mark.parametrize("step_row", [
    [-1, 0, 0, 1, 1, 1, 2],                   # few steps: the dense grid
    [-1, 0, 0, 10**7, 10**7, 10**7, 2],       # far-apart step rows: the hashed grouping
])
def test_per_step_name_sums_each_step_and_kernel_once(step_row):
    from mixdiag.diagnosis.breakdown.kernels import per_step_name

    code = np.array([0, 1, 1, 2, 0, 2, 1])
    dur = np.array([5, 7, 11, 13, 0, 17, 19])
    want: dict = {}
    for s, c, d in zip(step_row, code, dur):
        t, n = want.get((s, c), (0, 0))
        want[(s, c)] = (t + d, n + 1)
    got_c, got_s, got_t, got_n = per_step_name(code, np.array(step_row), dur, 3)
    got = {(int(s), int(c)): (float(t), int(n)) for c, s, t, n in zip(got_c, got_s, got_t, got_n)}
    assert got == want  # a zero-duration kernel still counts as a call


def test_step_index_reads_the_rows_of_the_given_steps():
    from mixdiag.diagnosis.breakdown.classes import StepIndex

    srow = np.array([2, -1, 0, 2, 1, 0, 2])
    index = StepIndex(srow, 3)
    for steps in ([0], [2], [0, 2], [1, 2], []):
        got = index.rows_of(np.array(steps, dtype=np.int64))
        assert sorted(got.tolist()) == [i for i, s in enumerate(srow) if s in steps]
