"""The second trace generator: drawn schedules stay in bounds, and the exports hold what the truth says."""
from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.trace_gen2 import MAGNITUDE, SHAPES, Episode, GenConfig, Schedule, ScheduleConfig, draw_schedule, generate

PKG = Path(__file__).resolve().parent / "trace_gen2"
DDL_REF = Path("/work/shared/reference/nsys_schema_3.25.0_ddl.sql")
N = 40  # steps per test export: tiny


def test_shares_no_code_with_collectors_or_the_first_simulator():
    for f in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for n in names:
                assert not n.startswith(("mixdiag", "helpers", "collectors")), f"{f.name} imports {n}"


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n_steps=st.integers(10, 3000), ranks=st.sampled_from([1, 2, 4]),
       overlap=st.floats(0, 1), per_1000=st.floats(0.5, 30))
def test_drawn_schedules_respect_their_bounds(seed, n_steps, ranks, overlap, per_1000):
    cfg = ScheduleConfig(n_steps=n_steps, overlap_p=overlap, episodes_per_1000=per_1000)
    sched = draw_schedule(seed, cfg, ranks)
    for e in sched.episodes:
        assert cfg.duration_min <= e.duration <= cfg.duration_max
        assert cfg.min_quiet <= e.start and e.end <= n_steps
        _, lo, hi = MAGNITUDE[e.cause]
        assert lo <= e.magnitude <= hi
        assert e.rank < ranks and (e.cause != "ep_hotspot" or (ranks > 1 and e.rank >= 0))
    for a, b in zip(sched.episodes, sched.episodes[1:]):   # overlapping episodes are two causes
        if b.start < a.end:
            assert a.cause != b.cause
    assert draw_schedule(seed, cfg, ranks) == sched        # drawn from the seed alone


def test_schedules_vary_with_the_seed_and_reach_long_episodes():
    cfg = ScheduleConfig(n_steps=2000)
    scheds = [draw_schedule(s, cfg, 2) for s in range(40)]
    starts = {tuple(e.start for e in s.episodes) for s in scheds}
    assert len(starts) == len(scheds)
    durs = [e.duration for s in scheds for e in s.episodes]
    assert min(durs) < 20 and max(durs) > 200
    assert any(b.start < a.end for s in scheds for a, b in zip(s.episodes, s.episodes[1:]))
    assert {e.cause for s in scheds for e in s.episodes} == set(MAGNITUDE)


@pytest.mark.parametrize("kw", [dict(n_steps=5), dict(causes=("kv_pressure",)), dict(duration_min=0),
                                dict(overlap_p=1.5), dict(duration_min=50, duration_max=10)])
def test_schedule_config_refuses_bad_values(kw):
    with pytest.raises(ValueError):
        ScheduleConfig(**kw)


def test_schedule_refuses_episodes_past_its_end():
    with pytest.raises(ValueError):
        Schedule(0, 10, (Episode("mixing", 8, 5, 1000.0),))


def make(tmp_path, shape, *episodes, seed=3):
    sched = Schedule(seed, N, tuple(episodes))
    return generate(GenConfig(shape, seed, N), tmp_path / f"{shape}.sqlite", schedule=sched)


def rows(g, sql):
    con = sqlite3.connect(g.path)
    try:
        return pd.read_sql_query(sql, con)
    finally:
        con.close()


def per_step(g, frame):
    """Each row (start, end, globalPid) assigned to the truth step whose GPU span holds its start."""
    t = g.truth
    pid_rank = dict(zip(t["pid"], t["rank"]))
    frame = frame.assign(rank=(frame["globalPid"].astype("int64") // (1 << 24)).map(pid_rank))
    out = np.full(len(frame), -1)
    for r, tr in t.groupby("rank"):
        m = (frame["rank"] == r).to_numpy()
        i = np.searchsorted(tr["t_end_ns"].to_numpy(), frame.loc[m, "start"].to_numpy())
        out[m] = tr["step"].to_numpy()[np.clip(i, 0, len(tr) - 1)]
    return frame.assign(step=out)


def _ddl_columns(text: str, table: str) -> list[str]:
    m = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", text, re.S)
    return [ln.split()[0] for ln in m.group(1).splitlines() if ln.strip() and not ln.strip().startswith("--")]


@pytest.mark.skipif(not DDL_REF.exists(), reason="shared reference DDL not on this machine")
def test_copied_tables_have_the_reference_columns(tmp_path):
    g = make(tmp_path, "pd-copy", Episode("pd_transfer", 10, 10, 2.0))
    ref = DDL_REF.read_text()
    con = sqlite3.connect(g.path)
    try:
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME",
                      "NVTX_EVENTS", "StringIds", "TARGET_INFO_SESSION_START_TIME"):
            got = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            assert got == _ddl_columns(ref, table), table
    finally:
        con.close()


def test_ep_hotspot_rank_has_longer_moe_kernels_in_exactly_its_steps(tmp_path):
    g = make(tmp_path, "2-rank", Episode("ep_hotspot", 12, 10, 4.0, rank=1))
    k = rows(g, "SELECT k.start, k.end, k.globalPid, s.value AS name FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN StringIds s ON s.id = k.shortName")
    k = per_step(g, k[k["name"] == "fused_moe_kernel"].assign(d=lambda f: f["end"] - f["start"]))
    by = k.groupby(["step", "rank"])["d"].sum().unstack()
    ratio = by[1] / by[0]
    hot = ratio.index.isin(range(12, 22))
    assert (ratio[hot] > 2.5).all() and (ratio[~hot] < 1.3).all()
    # the cold rank waits inside the all-to-all: its combine kernels are longer in the hot steps
    c = rows(g, "SELECT k.start, k.end, k.globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                "ON s.id = k.demangledName WHERE s.value LIKE '%deep_ep%combine%'")
    c = per_step(g, c.assign(d=c["end"] - c["start"]))
    cold = c[c["rank"] == 0].groupby("step")["d"].sum()
    assert cold[cold.index.isin(range(12, 22))].min() > 3 * cold[~cold.index.isin(range(12, 22))].median()
    assert set(g.truth.loc[g.truth["causes"] != "", "step"]) == set(range(12, 22))


def test_nixl_transfer_writes_no_copy_rows_but_slows_its_steps(tmp_path):
    g = make(tmp_path, "pd-nixl", Episode("pd_transfer", 15, 12, 2.5))
    m = per_step(g, rows(g, "SELECT start, end, globalPid, streamId, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
    fault = m["step"].between(15, 26)
    assert set(m["streamId"]) == {7, 13}   # input copies and sampled ids only: no KV stream
    per = m.groupby("step").size()
    in_fault = per.index.isin(range(15, 27))
    assert (per[in_fault] == per[~in_fault].median()).all()   # the same copies as any decode step
    assert not m[fault]["bytes"].gt(1 << 20).any()
    t = g.truth.set_index("step")
    dur = t["t_end_ns"] - t["t_start_ns"]
    assert dur.loc[15:26].min() > 2 * dur.drop(range(15, 27)).max()


def test_copy_connector_writes_side_stream_copies_only_in_its_steps(tmp_path):
    g = make(tmp_path, "pd-copy", Episode("pd_transfer", 15, 12, 2.0))
    m = per_step(g, rows(g, "SELECT start, end, globalPid, streamId, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
    side = m[m["streamId"] == 21]
    assert set(side["step"]) == set(range(15, 27))
    waits = rows(g, "SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                    "WHERE s.value LIKE 'cudaStreamWaitEvent%'")
    assert len(waits) == 12 * SHAPES["pd-copy"].layers


def test_graph_fallback_steps_launch_eagerly_instead_of_replaying(tmp_path):
    g = make(tmp_path, "graph-trace", Episode("graph_fallback", 20, 8, 2.0))
    gr = per_step(g, rows(g, "SELECT start, end, globalPid FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE"))
    assert not gr["step"].between(20, 27).any()
    assert set(gr["step"]) == set(range(N)) - set(range(20, 28))
    assert rows(g, "SELECT count(*) AS n FROM CUPTI_ACTIVITY_KIND_KERNEL")["n"][0] > 0   # eager kernels only
    assert (g.truth.set_index("step").loc[20:27, "graph_mode"] == "NONE").all()


def test_host_stall_leaves_the_gpu_idle_before_its_step(tmp_path):
    g = make(tmp_path, "node-trace", Episode("host_stall", 18, 5, 40.0))
    t = g.truth.sort_values("step").set_index("step")
    gap = (t["t_start_ns"] - t["t_end_ns"].shift(1)).dropna()
    assert gap.loc[18:22].min() > 0.7 * 40e6
    assert gap.drop(range(18, 23)).max() < 5e6


def test_nvtx_ranges_only_where_the_shape_has_them(tmp_path):
    with_nvtx = make(tmp_path, "sglang-overlap")
    names = rows(with_nvtx, "SELECT DISTINCT text FROM NVTX_EVENTS")["text"].tolist()
    assert names == [SHAPES["sglang-overlap"].nvtx_step]
    bare = make(tmp_path, "node-trace")
    con = sqlite3.connect(bare.path)
    try:
        assert not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchall()
    finally:
        con.close()
