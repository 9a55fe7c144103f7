"""Tier (e2)'s generator (tests/helpers/metrics_gen): independence, schedule bounds, and that the
files it writes are read by a plain Prometheus text parser and hold what its truth says."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.metrics_gen import CAUSES, Episode, GenConfig, ScheduleConfig, draw_schedule, generate, units
from helpers.metrics_gen.truth import TAIL_FACTOR, VISIBLE_SHARE

PKG = Path(__file__).resolve().parent / "metrics_gen"
FORBIDDEN = ("mixdiag", "engine", "collectors", "dashboard", "helpers.foreign_trace", "helpers.trace_gen2",
             "foreign_trace", "trace_gen2")
# the vLLM iteration line of formats.md section 1.2 (PR #31193), used as an independent reader here
VLLM_ITER = re.compile(r"Iteration\((?P<idx>\d+)\): (?P<ctx_req>\d+) context requests, (?P<ctx_tok>\d+) context "
                       r"tokens, (?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation tokens, "
                       r"iteration elapsed time: (?P<ms>[\d.]+) ms")
VLLM_PREFIX = re.compile(r"^\((?P<proc>[^)\s]+) pid=\d+\) [A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] ")
SGL_DECODE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] Decode batch, #running-req: (\d+), .*cuda graph: "
                        r"(True|False), gen throughput")


def test_generator_imports_nothing_of_the_project():
    for path in sorted(PKG.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for n in names:
                assert not any(n == f or n.startswith(f + ".") for f in FORBIDDEN), f"{path.name} imports {n}"


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def capture(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"e2_{request.param}")
    return request.param, generate(GenConfig(request.param, seed=3, n_steps=900), out)


def _scrapes(cap):
    files = sorted(cap.scrapes.glob("*.prom"), key=lambda p: float(p.stem))
    out = []
    for p in files:
        fams = {f.name: f for f in text_string_to_metric_families(p.read_text())}
        out.append((float(p.stem), fams))
    return out


def _sample(fams, family, sample, **labels) -> float:
    """Sum of one sample over matching label sets (the parser may file a counter under its
    name with or without ``_total``)."""
    fam = fams.get(family) or fams[family + "_total"]
    hits = [s.value for s in fam.samples if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert hits, (family, sample)
    return sum(hits)


# (dialect, family, type); the parser names counters without _total
TYPES = [
    ("vllm", "vllm:inter_token_latency_seconds", "histogram"), ("vllm", "vllm:iteration_tokens_total", "histogram"),
    ("vllm", "vllm:num_requests_running", "gauge"), ("vllm", "vllm:num_requests_waiting", "gauge"),
    ("vllm", "vllm:kv_cache_usage_perc", "gauge"), ("vllm", "vllm:num_preemptions", "counter"),
    ("vllm", "vllm:prompt_tokens", "counter"), ("vllm", "vllm:generation_tokens", "counter"),
    ("vllm", "vllm:request_prefill_kv_computed_tokens", "histogram"), ("vllm", "vllm:nixl_xfer_time_seconds", "histogram"),
    ("sglang", "sglang:inter_token_latency_seconds", "histogram"), ("sglang", "sglang:num_running_reqs", "gauge"),
    ("sglang", "sglang:cuda_graph_passes", "counter"), ("sglang", "sglang:eplb_balancedness", "summary"),
    ("sglang", "sglang:kv_transfer_latency_ms", "histogram"), ("sglang", "sglang:num_retracted_requests", "counter"),
]


def test_scrapes_parse_with_the_real_names_and_types(capture):
    dialect, cap = capture
    scr = _scrapes(cap)
    assert len(scr) >= 10
    _, fams = scr[-1]
    for d, fam, kind in TYPES:
        if d == dialect:
            assert (fams.get(fam) or fams[fam + "_total"]).type == kind, fam
    for f in fams.values():   # histograms: cumulative buckets, +Inf == count
        if f.type != "histogram":
            continue
        for labels in {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in f.samples}:
            lab = dict(labels)
            b = [s for s in f.samples if s.name.endswith("_bucket") and all(s.labels.get(k) == v for k, v in lab.items())]
            vals = [s.value for s in b]
            assert vals == sorted(vals) and b[-1].labels["le"] == "+Inf"
            assert vals[-1] == _sample(fams, f.name, f.name + "_count", **lab)


# (dialect, family, sample, truth column summed over the interval's steps)
DELTAS = [
    ("vllm", "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count", "itl_count"),
    ("vllm", "vllm:generation_tokens", "vllm:generation_tokens_total", "tokens_out"),
    ("vllm", "vllm:prompt_tokens", "vllm:prompt_tokens_total", "prompt_done"),
    ("vllm", "vllm:num_preemptions", "vllm:num_preemptions_total", "preempted"),
    ("sglang", "sglang:inter_token_latency_seconds", "sglang:inter_token_latency_seconds_count", "itl_count"),
    ("sglang", "sglang:generation_tokens", "sglang:generation_tokens_total", "tokens_out"),
    ("sglang", "sglang:num_retracted_requests", "sglang:num_retracted_requests_total", "preempted"),
]


def test_scrape_deltas_hold_what_truth_says(capture):
    dialect, cap = capture
    scr = _scrapes(cap)
    st = cap.steps
    rows = [r for r in DELTAS if r[0] == dialect]
    for (ta, fa), (tb, fb) in zip(scr, scr[1:]):
        inside = st[(st["t_end_s"] >= ta) & (st["t_end_s"] < tb)]
        for _, fam, sample, col in rows:
            got = _sample(fb, fam, sample) - _sample(fa, fam, sample)
            assert got == pytest.approx(float(inside[col].sum())), (fam, ta)
    if dialect == "vllm":   # a gauge reads the state after the last step before the scrape
        for t, fams in scr[1:]:
            before = st[st["t_end_s"] < t]
            if len(before):
                assert _sample(fams, "vllm:num_requests_running", "vllm:num_requests_running") == before["running"].iloc[-1]


def test_itl_sum_moves_with_host_stalls(capture):
    """A stalled interval's ITL sum grows by at least the stall gaps its decode rows waited."""
    dialect, cap = capture
    fam = f"{dialect}:inter_token_latency_seconds"
    scr = _scrapes(cap)
    st = cap.steps
    for (ta, fa), (tb, fb) in zip(scr, scr[1:]):
        inside = st[(st["t_end_s"] >= ta) & (st["t_end_s"] < tb)]
        got = _sample(fb, fam, fam + "_sum") - _sample(fa, fam, fam + "_sum")
        assert got >= float((inside["gap_s"] * inside["gen_reqs"]).sum()) - 1e-6


def test_log_lines_match_truth(capture):
    dialect, cap = capture
    st = cap.steps.set_index("step")
    det = cap.details_log.read_text().splitlines()
    if dialect == "vllm":
        its = [m for m in map(VLLM_ITER.search, det) if m]
        assert len(its) == len(st)
        for m in its:
            s = st.loc[int(m["idx"])]
            assert (int(m["ctx_tok"]), int(m["gen_req"])) == (s["ctx_tokens"], s["gen_reqs"])
            assert float(m["ms"]) > 0
        op = cap.log.read_text().splitlines()
        assert all(VLLM_PREFIX.match(x) for x in op)
        stats = [x for x in op if "Avg prompt throughput" in x]
        assert len(stats) == pytest.approx((st["t_end_s"].max() - st["t_start_s"].min()) / 10, abs=1.5)
        assert not any(VLLM_ITER.search(x) for x in op)
        n_pre = int(st["preempted"].sum())
        logged = sum(int(re.search(r"Preemptions: (\d+)", x)[1]) for x in stats if "Preemptions:" in x)
        assert logged <= n_pre    # the tail after the last stats line is not logged
    else:
        dec = [m for m in map(SGL_DECODE.match, det) if m]
        decode_steps = st[st["ctx_tokens"] == 0]
        assert len(dec) == len(decode_steps)
        for m, (_, s) in zip(dec, decode_steps.iterrows()):
            assert (int(m[2]), m[3] == "False") == (s["gen_reqs"], bool(s["eager"]))
        op = [m for m in map(SGL_DECODE.match, cap.log.read_text().splitlines()) if m]
        assert len(op) == len(decode_steps) // 40


def test_truth_follows_the_modelled_behaviour(capture):
    _, cap = capture
    st = cap.steps
    mix = st[st["mag_mixing"].notna()]
    assert (mix["ctx_tokens"] >= 256).all() and (mix["gen_reqs"] > 0).all()
    fb = st[st["mag_graph_fallback"].notna()]
    assert fb["eager"].all() and (fb["ctx_tokens"] == 0).all()
    hs = st[st["mag_host_stall"].notna()]
    assert (hs["gap_s"] >= 0.8 * hs["mag_host_stall"]).all()
    quiet = st[st["causes"].fillna("") == ""]
    assert (quiet["gap_s"] < 0.01).all()
    sched = {e.cause for e in cap.schedule}
    for c in CAUSES:   # every scheduled cause except kv_pressure (probabilistic) leaves steps
        if c in sched and c != "kv_pressure":
            assert st[f"mag_{c}"].notna().any(), c


@pytest.mark.parametrize("seed", range(40))
def test_schedule_bounds(seed):
    cfg = ScheduleConfig(n_steps=1500)
    eps = draw_schedule(seed, cfg)
    assert eps == draw_schedule(seed, cfg)
    for prev, e in zip((None,) + eps, eps):
        assert cfg.lead_in <= e.start < e.end <= cfg.n_steps
        assert cfg.dur_min <= e.duration <= cfg.dur_max
        lo, hi = cfg.range_of(e.cause)
        assert lo <= e.magnitude <= hi
        if prev is not None and e.start < prev.end:
            assert e.cause != prev.cause and e.start >= prev.start   # an overlap: another cause


def test_schedule_draws_vary_and_cover_the_range():
    eps = [e for s in range(200) for e in draw_schedule(s, ScheduleConfig(n_steps=3000))]
    durs = np.array([e.duration for e in eps])
    assert durs.min() < 10 and durs.max() > 300
    assert {e.cause for e in eps} == set(CAUSES)
    overlaps = sum(b.start < a.end for s in range(200) for a, b in zip(*(lambda x: (x, x[1:]))(draw_schedule(s))))
    assert overlaps > 0


@pytest.mark.parametrize("bad", [dict(n_steps=10), dict(dur_min=0), dict(dur_min=50, dur_max=10),
                                 dict(causes=("nope",)), dict(p_overlap=1.0), dict(causes=())])
def test_schedule_config_is_validated(bad):
    with pytest.raises(ValueError):
        ScheduleConfig(**bad)


def test_units_visibility_by_share_and_tail():
    # two units; unit 0: one healthy step and a host-stall step adding 30 % ; unit 1: a kv step whose
    # resumed request waited 3x its healthy latency but added little token-time
    base = {f"mag_{c}": np.nan for c in CAUSES} | {f"excess_{c}": 0.0 for c in CAUSES}
    rows = [dict(base, t_end_s=0.5, healthy_s=0.02, gen_reqs=10, max_itl_s=0.02, causes=""),
            dict(base, t_end_s=0.7, healthy_s=0.02, gen_reqs=10, max_itl_s=0.05, causes="host_stall",
                 mag_host_stall=0.03, excess_host_stall=0.3 * 0.4),
            dict(base, t_end_s=1.5, healthy_s=0.02, gen_reqs=10, max_itl_s=3.0 * 0.02, causes="kv_pressure",
                 mag_kv_pressure=0.1, excess_kv_pressure=0.01)]
    u = units(pd.DataFrame(rows), [0.0, 1.0, 2.0])
    assert u["visible_host_stall"].tolist() == [True, False]
    assert u["visible_kv_pressure"].tolist() == [False, True]
    assert u["causes"].tolist() == ["host_stall", "kv_pressure"]
    assert VISIBLE_SHARE <= 0.3 and TAIL_FACTOR <= 3.0   # the hand-built cases sit on the right side


def test_cudagraph_table_counts_every_step_and_shows_none_above_the_largest_size(tmp_path):
    cap = generate(GenConfig("vllm", seed=0, n_steps=700), tmp_path)   # seed 0 draws --cudagraph-metrics on
    text = cap.log.read_text()
    stamps = [m for m in re.findall(r"^\(APIServer pid=\d+\) INFO \d\d-\d\d (\d\d:\d\d:\d\d) \[cuda_graph", text, re.M)]
    assert stamps, "seed 0 logs the --cudagraph-metrics table"
    tables = text.split("**CUDAGraph Stats:**")[1:]
    rows = [[r.split("|")[1:-1] for r in t.splitlines() if re.match(r"^\| \d", r)] for t in tables]
    total = sum(int(r[4]) for t in rows for r in t)
    st = cap.steps
    stats_t = [ln for ln in text.splitlines() if "Avg prompt throughput" in ln]
    assert len(rows) == len(stats_t)
    # every step before the last table's interval end is counted exactly once
    params = __import__("json").loads((cap.root / "truth" / "params.json").read_text())
    t_last = params["t0_unix"] + params["stats_interval_s"] * len(stats_t)
    assert total == int((st["t_end_s"] < t_last).sum())
    big = st[(st["gen_reqs"] + st["ctx_tokens"] > params["max_capture"]) & (st["t_end_s"] < t_last)]
    none = sum(int(r[4]) for t in rows for r in t if r[3].strip() == "NONE")
    assert none == len(big)
    for t in rows:
        for r in t:
            u, p, pad, mode = int(r[0]), int(r[1]), int(r[2]), r[3].strip()
            assert p - u == pad and (mode == "NONE") == (u > params["max_capture"])
