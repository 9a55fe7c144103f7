"""The foreign-trace simulator writes real-DDL nsys exports and Kineto JSON whose rows agree with its truth."""
from __future__ import annotations

import ast
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers.foreign_trace import ENGINES, simulate
from helpers.foreign_trace.engines import draw_costs
from helpers.nsys_export import table_ddl

PKG = Path(__file__).resolve().parent / "foreign_trace"
MASK = ~0xFFFFFF


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """One export per configuration, built once for the module."""
    d = tmp_path_factory.mktemp("ft")
    cfg = {
        "vllm_graph": dict(engine="vllm", seed=11, faults=("mixing", "graph_fallback", "host_stall", "pd_transfer")),
        "vllm_node": dict(engine="vllm", seed=12, graph_trace="node", nvtx=False,
                          faults=("mixing", "graph_fallback", "pd_transfer")),
        "sglang": dict(engine="sglang", seed=13, gpu_metrics_hz=2000),
        "ep2": dict(engine="ep2", seed=14, graph_trace="node", faults=("ep_hotspot", "mixing", "host_stall")),
    }
    return {k: simulate(n_steps=300, out=d / f"{k}.sqlite", **v) for k, v in cfg.items()}


def q(truth, sql):
    con = sqlite3.connect(truth.path)
    try:
        return pd.read_sql_query(sql, con)
    finally:
        con.close()


def by_step(truth, rows: pd.DataFrame, t_col: str, window: str, rank: int = 0) -> pd.Series:
    """Assign rows of one rank to the step whose ``window`` start precedes them."""
    st = truth.steps[truth.steps["rank"] == rank]
    idx = np.searchsorted(st[window].to_numpy(), rows[t_col].to_numpy(), side="right") - 1
    return pd.Series(st["step"].to_numpy()[np.clip(idx, 0, None)], index=rows.index).where(idx >= 0)


@pytest.mark.parametrize("name", ["vllm_graph", "vllm_node", "sglang", "ep2"])
def test_export_has_real_ddl_tables_and_resolving_strings(traces, name):
    t = traces[name]
    ddl = table_ddl()
    con = sqlite3.connect(t.path)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "StringIds", "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME"):
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        want = re.findall(r"^\s{4}(\w+)\s", ddl[table], re.M)
        assert cols == want, table
    unresolved = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s ON s.id = k.shortName "
        "WHERE s.value IS NULL").fetchone()[0] + con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r LEFT JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value IS NULL").fetchone()[0]
    assert unresolved == 0
    assert con.execute("SELECT value FROM META_DATA_EXPORT WHERE name='EXPORT_SCHEMA_VERSION'").fetchone()[0] == "3.25.0"
    con.close()
    assert t.path.stat().st_size < (8 if name in ("vllm_node", "ep2") else 2) * 2**20  # node mode: every kernel


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_default_exports_stay_small(tmp_path, engine):
    t = simulate(engine, seed=1, out=tmp_path / "d.sqlite")  # 400 steps, graph-level trace, NVTX
    assert len(t.steps) == 400 * ENGINES[engine].n_ranks and t.path.stat().st_size < 5 * 2**20


@pytest.mark.parametrize("name", ["vllm_graph", "vllm_node", "sglang", "ep2"])
def test_launch_counts_match_truth(traces, name):
    t = traces[name]
    pid = t.meta["pids"][0]
    rt = q(t, "SELECT r.start, r.globalTid, s.value AS name FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
              "JOIN StringIds s ON s.id = r.nameId")
    rt = rt[rt["globalTid"] == ((1 << 48) | (pid << 24) | pid)]  # the engine thread, not the KV connector
    rt["step"] = by_step(t, rt, "start", "cpu_start_ns")
    got_g = rt[rt["name"].str.startswith("cudaGraphLaunch")].groupby("step").size()
    got_k = rt[rt["name"].str.startswith("cudaLaunchKernel")].groupby("step").size()
    st = t.steps[t.steps["rank"] == 0].set_index("step")
    assert (got_g.reindex(st.index, fill_value=0) == st["graph_launches"]).all()
    assert (got_k.reindex(st.index, fill_value=0) == st["kernel_launches"]).all()


@pytest.mark.parametrize("name", ["vllm_graph", "sglang"])
def test_graph_modes_follow_dispatch_rules(traces, name):
    st = traces[name].steps
    spec = ENGINES[traces[name].meta["engine"]]
    n_layers = traces[name].meta["cost"]["n_layers"]
    full = st[st["graph_mode"] == "FULL"]
    assert len(full) and (full["graph_launches"] == 1).all() and (full["prefill_tokens"] == 0).all()
    assert (full["kernel_launches"] == len(spec.sampler)).all()
    none = st[st["graph_mode"] == "NONE"]
    assert (none["graph_launches"] == 0).all()
    fb = st[st["cause"] == "graph_fallback"]
    assert len(fb) and (fb["graph_mode"] == "NONE").all()
    assert (fb["decode_rows"] > traces[name].meta["cost"]["max_capture"]).all()
    pw = st[st["graph_mode"] == "PIECEWISE"]
    if spec.mixed_graph == "PIECEWISE":
        assert (pw["graph_launches"] == n_layers + 1).all()
    else:
        assert pw.empty and (st.loc[st["prefill_tokens"] > 0, "graph_mode"] == "NONE").all()


@pytest.mark.parametrize("name", ["vllm_graph", "vllm_node", "sglang", "ep2"])
def test_copy_bytes_track_tokens_and_requests(traces, name):
    t = traces[name]
    spec = ENGINES[t.meta["engine"]]
    cp = q(t, "SELECT start, bytes, copyKind, streamId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    cp = cp[(cp["globalPid"] & MASK) == ((1 << 48) | (t.meta["pids"][0] << 24))]
    cp["step"] = by_step(t, cp, "start", "t_start_ns")
    st = t.steps[t.steps["rank"] == 0].set_index("step")
    h2d = cp[(cp["copyKind"] == 1) & (cp["streamId"] == 7)].groupby("step")["bytes"].sum()
    # the sampled-id copy closes its step (on a side stream it may start after the next step's inputs)
    d2h = q(t, "SELECT \"end\", bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2")
    d2h = st.reset_index().merge(d2h, left_on="t_end_ns", right_on="end").set_index("step")["bytes"]
    assert (h2d.reindex(st.index) == st["h2d_bytes"]).all()
    assert (d2h.reindex(st.index) == st["d2h_bytes"]).all()
    per_tok = sum(b for _, b in spec.token_copies)
    reqs = st["decode_rows"] + (st["prefill_tokens"] > 0)
    expect = per_tok * (st["decode_rows"] + st["prefill_tokens"]) + sum(b for _, b in spec.request_copies) * reqs \
        + spec.request_copies[0][1]
    assert (st["h2d_bytes"] == expect).all()
    assert (st["d2h_bytes"] == spec.sampled_bytes * reqs).all()


def test_pd_transfer_lands_off_the_compute_stream_around_its_step(traces):
    t = traces["vllm_graph"]
    st = t.steps[t.steps["cause"] == "pd_transfer"]
    assert len(st)
    path = t.meta["cost"]["transfer"]
    sql = ("SELECT start, \"end\", 0 AS bytes FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE streamId = 21" if path == "nccl"
           else "SELECT start, \"end\", bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE streamId = 21")
    kv = q(t, sql + " ORDER BY start")
    n = t.meta["cost"]["n_layers"]
    assert len(kv) == n * len(st)  # layer by layer, one transfer per affected step
    for i, (_, s) in enumerate(st.iterrows()):
        one = kv.iloc[i * n:(i + 1) * n]
        assert one["start"].min() < s["t_start_ns"] and one["end"].max() > s["cpu_start_ns"]  # precedes/overlaps
        if path != "nccl":
            assert one["bytes"].sum() == s["kv_transfer_bytes"]
    assert (t.steps.loc[t.steps["cause"] != "pd_transfer", "kv_transfer_bytes"] == 0).all()


@pytest.mark.parametrize("name,overlap", [("vllm_graph", False), ("sglang", True)])
def test_gpu_gaps_between_steps(traces, name, overlap):
    st = traces[name].steps
    gap_ms = (st["t_start_ns"].shift(-1) - st["t_end_ns"]).iloc[:-1] / 1e6
    nxt = st["cause"].shift(-1).iloc[:-1]
    stall = gap_ms[nxt == "host_stall"]
    assert len(stall) and (stall > 14).all()
    calm = gap_ms[nxt != "host_stall"]
    if overlap:
        assert calm.max() < 0.1  # the next batch is queued before this one ends
    else:
        assert calm.min() > 0.2  # the engine thread schedules between steps


def test_multi_rank_export_has_two_processes_and_hot_rank_skew(traces):
    t = traces["ep2"]
    k = q(t, "SELECT k.start, k.\"end\", k.globalPid, k.deviceId, s.value AS name FROM CUPTI_ACTIVITY_KIND_KERNEL k "
             "JOIN StringIds s ON s.id = k.shortName")
    assert k["globalPid"].nunique() == 2 and k["deviceId"].nunique() == 2
    assert q(t, "SELECT count(*) AS n FROM PROCESSES")["n"][0] == 2
    hot = t.steps[t.steps["cause"] == "ep_hotspot"]
    assert len(hot)
    k["rank"] = k["deviceId"]
    comb = k[k["name"].str.contains("combine") & ~k["name"].str.contains("splitkv")]
    for step, g in hot.groupby("step"):
        h = int(g["hot_rank"].iloc[0])
        lo, hi = g["t_start_ns"].min(), g["t_end_ns"].max()
        c = comb[(comb["start"] >= lo) & (comb["end"] <= hi)]
        waited = (c["end"] - c["start"]).groupby(c["rank"]).sum()
        assert waited[1 - h] > 2 * waited[h], step  # the other rank waits inside the all-to-all


def test_nvtx_ranges_present_only_when_asked(traces):
    con = sqlite3.connect(traces["vllm_node"].path)
    assert not con.execute("SELECT 1 FROM sqlite_master WHERE name='NVTX_EVENTS'").fetchone()
    con.close()
    n = q(traces["vllm_graph"], "SELECT text, count(*) AS n FROM NVTX_EVENTS GROUP BY text").set_index("text")["n"]
    assert n["execute_model"] == 300 and n["gpu_model_runner: forward"] == 300


def test_graph_and_node_level_trace(traces):
    g = q(traces["vllm_graph"], "SELECT count(*) AS n FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")["n"][0]
    assert g == traces["vllm_graph"].steps["graph_launches"].sum()
    assert q(traces["vllm_graph"], "SELECT count(*) AS n FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphId IS NOT NULL")["n"][0] == 0
    node = q(traces["vllm_node"], "SELECT correlationId, graphId, count(*) AS n FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                  "WHERE graphId IS NOT NULL GROUP BY 1, 2")
    assert len(node) == traces["vllm_node"].steps["graph_launches"].sum() and (node["n"] >= 1).all()
    mode = q(traces["vllm_node"], "SELECT value FROM META_DATA_CAPTURE WHERE name='CUDA_GRAPH_TRACE_OPTIONS:MODE'")
    assert mode["value"][0] == "Node"


def test_gpu_metrics_sm_active(traces):
    m = q(traces["sglang"], "SELECT g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t "
                            "ON t.typeId = g.typeId AND t.metricId = g.metricId WHERE t.metricName = 'SMs Active'")
    assert len(m) > 100 and m["value"].between(0, 100).all() and m["value"].max() > 40


def test_kineto_json_loads_one_file_per_rank(tmp_path):
    t = simulate("ep2", seed=21, n_steps=60, fmt="kineto", out=tmp_path / "trace.json")
    assert len(t.paths) == 2
    for r, p in enumerate(t.paths):
        doc = json.loads(p.read_text())
        assert doc["distributedInfo"]["rank"] == r
        cats = {e.get("cat") for e in doc["traceEvents"]}
        assert {"kernel", "gpu_memcpy", "cuda_runtime", "user_annotation", "cpu_op"} <= cats
        cp = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy" and e["name"].startswith("Memcpy HtoD")]
        assert sum(e["args"]["bytes"] for e in cp) == t.steps.loc[t.steps["rank"] == r, "h2d_bytes"].sum()
        k = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        launches = [e for e in doc["traceEvents"] if e.get("name") == "cudaGraphLaunch"]
        corr = {e["args"]["correlation"] for e in launches}
        assert launches and sum(e["args"]["correlation"] in corr for e in k) > len(launches)  # graph nodes, one by one
        assert all({"stream", "device", "correlation", "External id"} <= e["args"].keys() for e in k)


@pytest.mark.parametrize("kw,err", [(dict(faults=("bogus",)), "unknown fault"), (dict(faults=("ep_hotspot",)), "multi-rank"),
                                    (dict(engine="trt"), "unknown engine"), (dict(fmt="csv"), "fmt")])
def test_bad_arguments_raise(tmp_path, kw, err):
    with pytest.raises(ValueError, match=err):
        simulate(**{"out": tmp_path / "x.sqlite", "n_steps": 5, **kw})


def test_seed_draws_magnitudes_and_is_reproducible(tmp_path):
    a = simulate("vllm", seed=4, n_steps=40, out=tmp_path / "a.sqlite")
    b = simulate("vllm", seed=4, n_steps=40, out=tmp_path / "b.sqlite")
    pd.testing.assert_frame_equal(a.steps, b.steps)
    costs = [draw_costs(ENGINES["vllm"], np.random.default_rng(s)) for s in range(20)]
    assert len({round(c.base_ms, 3) for c in costs}) == 20
    for c in costs:  # decode 10-30 ms, a 2048-token chunk adds ~30-100 ms
        assert 8 <= c.base_ms <= 18 and 30 <= 2048 * c.per_token_us / 1e3 <= 100


def test_simulator_imports_nothing_from_the_code_it_tests():
    for f in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("mixdiag") for n in names), (f.name, names)


@pytest.mark.parametrize("name", ["vllm_graph", "ep2"])
def test_mixdiag_analyze_runs_on_simulated_exports(traces, name):
    exe = Path(sys.executable).with_name("mixdiag")
    res = subprocess.run([str(exe), "analyze", str(traces[name].path), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["steps"]["total"] > 0


def test_cli_writes_export_and_truth(tmp_path):
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "tests.helpers.foreign_trace", "--engine", "sglang", "--seed", "3",
                          "--steps", "30", "--out", str(tmp_path / "x.sqlite"), "--truth", str(tmp_path / "t.csv")],
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert len(pd.read_csv(tmp_path / "t.csv")) == 30 and (tmp_path / "x.sqlite").exists()
    bad = subprocess.run([sys.executable, "-m", "tests.helpers.foreign_trace", "--faults", "nope", "--out",
                          str(tmp_path / "y.sqlite")], cwd=root, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
