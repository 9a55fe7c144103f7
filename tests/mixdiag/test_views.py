"""Diagnosis through partial and fused views (mixdiag/diagnosis/evidence/fusion.py): log step rows, scrape intervals, both fused, request stalls."""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.evidence.fusion import engine_of
from mixdiag.schema import Timeline

sys.path.insert(0, str(Path(__file__).parent))
from diag_cases import build  # noqa: E402


def _log_view(tl: Timeline, instance="engine0@log") -> pd.DataFrame:
    """What a vLLM log gives: kinds and token counts per step, start/end stamped in whole
    seconds, the step's elapsed time in an extra column."""
    st = tl.steps[["step", "t_start_s", "t_end_s", "kind", "prefill_tokens", "prefill_reqs", "decode_reqs",
                   "decode_rows"]].copy()
    st["elapsed_s"] = st["t_end_s"] - st["t_start_s"]
    st["t_start_s"] = st["t_end_s"] = np.floor(st["t_end_s"])
    st["instance"], st["granularity"] = instance, "step"
    return st


def _scrape_view(tl: Timeline, instance="engine0@scrapes", period=1.0) -> pd.DataFrame:
    """1 s scrape intervals: step counts by kind, ITL quantiles/mean/count, preemptions."""
    st = tl.steps
    itl = tl.itl()
    t0 = float(st["t_start_s"].min())
    edges = np.arange(t0, float(st["t_end_s"].max()) + period, period)
    rows = []
    for i, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        s = st[(st["t_end_s"] > a) & (st["t_end_s"] <= b)]
        x = itl.loc[(itl["t_s"] > a) & (itl["t_s"] <= b), "itl_s"]
        rows.append(dict(instance=instance, step=i, t_start_s=a, t_end_s=b, granularity="interval",
                         kind="unknown", prefill_tokens=float(s["prefill_tokens"].sum()),
                         decode_rows=float(s["decode_rows"].sum()), preempted_reqs=float(s["preempted_reqs"].sum()),
                         kv_transfer_bytes=float(s["kv_transfer_bytes"].sum()),
                         itl_count=float(len(x)), itl_mean_s=float(x.mean()) if len(x) else np.nan,
                         itl_p50_s=float(x.quantile(0.5)) if len(x) else np.nan,
                         itl_p99_s=float(x.quantile(0.99)) if len(x) else np.nan,
                         **{f"{k}_steps": float((s["kind"] == k).sum()) for k in ("prefill", "decode", "mixed", "idle")}))
    return pd.DataFrame(rows)


def test_engine_of():
    assert engine_of("engine0@scrapes") == "engine0" and engine_of("srv:8000") == "srv:8000"


def test_log_lines_alone_use_the_stated_elapsed_time():
    tl = build(tokens=False)
    d = diagnose(Timeline(_log_view(tl), None, meta={}))
    got = dict(zip(d.spikes["step"], d.spikes["cause"]))
    assert d.instances["engine0@log"]["latency_source"] == "step_duration"
    # what a log has (allocation, elapsed time) finds these; host stalls (gaps) are invisible
    for step, cause in {40: "mixing", 220: "prefill_stall"}.items():
        assert got[step] == cause
    assert 100 not in got


@pytest.mark.parametrize("counts,kind,expect", [
    (dict(mixed_steps=1.0, prefill_steps=0.0, decode_steps=20.0), "mixed", "mixing"),
    (dict(mixed_steps=0.0, prefill_steps=1.0, decode_steps=20.0), "unknown", "prefill_stall"),
    (dict(mixed_steps=0.0, prefill_steps=0.0, decode_steps=20.0), "decode", "unknown"),
    # no counts: prompt work far above the usual (none) beside the spike is the interval's own evidence
    ({}, "unknown", "mixing"),
])
def test_interval_rows_use_step_counts_by_kind(counts, kind, expect):
    rows = []
    for i in range(30):
        spike = i == 12
        rows.append(dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval",
                         kind=kind if spike else "decode", prefill_tokens=900.0 if spike else 0.0, decode_rows=300.0,
                         itl_count=300.0, itl_p50_s=0.02, itl_p99_s=0.2 if spike else 0.03,
                         **({k: (v if spike else (20.0 if k == "decode_steps" else 0.0)) for k, v in counts.items()})))
    d = diagnose(Timeline(pd.DataFrame(rows), None, meta={}))
    assert list(d.spikes["step"]) == [12]
    assert d.spikes["cause"].iloc[0] == expect
    if not counts and expect == "mixing":  # inferred from work alone: low confidence
        assert d.spikes["confidence"].iloc[0] <= 0.5


def test_fused_log_and_scrapes():
    tl = build(faults={40: dict(kind="mixed", prefill_tokens=512, prefill_reqs=1, dur=0.110, graph_mode="PIECEWISE"),
                       100: dict(gap=0.150), 160: dict(preempted_reqs=2, dur=0.070)})
    steps = pd.concat([_log_view(tl), _scrape_view(tl)], ignore_index=True)
    d = diagnose(Timeline(steps, None, meta={}))
    sp = d.spikes
    step_sp = sp[sp["granularity"] == "step"]
    assert dict(zip(step_sp["step"], step_sp["cause"]))[40] == "mixing"
    iv = sp[sp["granularity"] == "interval"]
    # the interval holding step 40 is explained by that step: no duplicate
    t40 = tl.steps.set_index("step").loc[40, "t_end_s"]
    assert not ((iv["t_start_s"] < t40) & (iv["t_end_s"] >= t40)).any()
    # the gap before step 100 is invisible in the log; the scrapes show it between steps
    t100 = tl.steps.set_index("step").loc[100, "t_end_s"]
    hit = iv[(iv["t_start_s"] < t100) & (iv["t_end_s"] >= t100)]
    assert list(hit["cause"]) == ["host_stall"]
    assert hit["evidence"].iloc[0]["slow_steps_in_interval"] == 0 or "host_gap_excess_s" in hit["evidence"].iloc[0]


@pytest.mark.parametrize("prefill_tokens, prefill_reqs, xfer_bytes, expect", [
    (2, 2, 2.5e6, "pd_transfer"),  # two PD requests installed: one EXTEND token each
    (1, 1, 2.5e6, "pd_transfer"),
    (512, 1, 2.5e6, "mixing"),  # a real prompt chunk: the transfer beside it does not explain it
    (1, 1, 0.0, "unknown"),  # no transfer counted: a 1-token chunk cannot slow a step either (step rule 4)
])
def test_a_pd_install_step_in_the_log_takes_the_scrapes_kv_transfer(prefill_tokens, prefill_reqs, xfer_bytes, expect):
    # the log calls the install step mixed (its 1-token EXTENDs are context tokens); only the
    # scrapes' kv_transfer_bytes counter shows the KV that arrived in its interval
    tl = build(faults={100: dict(kind="mixed", prefill_tokens=float(prefill_tokens), prefill_reqs=float(prefill_reqs),
                                 kv_transfer_bytes=xfer_bytes, kv_transfer_s=0.08 if xfer_bytes else 0.0, dur=0.110)})
    steps = pd.concat([_log_view(tl), _scrape_view(tl)], ignore_index=True)
    sp = diagnose(Timeline(steps, None, meta={})).spikes
    got = sp[(sp["granularity"] == "step") & (sp["step"] == 100)]
    assert list(got["cause"]) == [expect]
    if expect == "pd_transfer":
        assert got["evidence"].iloc[0]["interval_kv_transfer_bytes"] == xfer_bytes


@pytest.mark.parametrize("install_step, expect", [
    (True, "unknown"),  # the interval's transfer is the install step's: no evidence for step 99
    (False, "pd_transfer"),  # no install step in the log: the transfer may be this step's
])
def test_a_slow_decode_step_beside_a_pd_install_takes_no_transfer_evidence(install_step, expect):
    install = dict(kind="mixed", prefill_tokens=1.0, prefill_reqs=1.0, dur=0.110) if install_step else dict(dur=0.110)
    tl = build(faults={99: dict(dur=0.060), 100: install | dict(kv_transfer_bytes=2.5e6, kv_transfer_s=0.08)})
    steps = pd.concat([_log_view(tl), _scrape_view(tl)], ignore_index=True)
    sp = diagnose(Timeline(steps, None, meta={})).spikes
    got = sp[(sp["granularity"] == "step") & (sp["step"] == 99)]
    assert list(got["cause"]) == [expect]


@pytest.mark.parametrize("gap_s, p99_bump_x, expect", [
    (0.150, 1.0, "host_stall"),  # a real gap: the ITL sum holds time no step took
    (0.0, 4.0, "unknown"),  # a P99 jump (histogram bucket edge) the ITL sum does not back
])
def test_an_interval_spike_without_a_slow_step_needs_time_between_steps(gap_s, p99_bump_x, expect):
    tl = build(faults={100: dict(gap=gap_s)} if gap_s else {})
    iv = _scrape_view(tl)
    t100 = tl.steps.set_index("step").loc[100, "t_end_s"]
    j = iv.index[(iv["t_start_s"] < t100) & (iv["t_end_s"] >= t100)][0]
    iv.loc[j, "itl_p99_s"] *= p99_bump_x
    sp = diagnose(Timeline(pd.concat([_log_view(tl), iv], ignore_index=True), None, meta={})).spikes
    hit = sp[(sp["granularity"] == "interval") & (sp["step"] == iv.loc[j, "step"])]
    assert list(hit["cause"]) == [expect]


@pytest.mark.parametrize("faults, n_kv_pressure", [
    ({160: dict(preempted_reqs=2)}, 1),  # no step is slow; the counter shows requests evicted
    ({160: dict(preempted_reqs=1), 161: dict(preempted_reqs=1)}, 1),  # one interval, one spike
    ({}, 0),
])
def test_an_interval_that_counted_preemptions_is_kv_pressure(faults, n_kv_pressure):
    tl = build(faults=faults)
    d = diagnose(Timeline(pd.concat([_log_view(tl), _scrape_view(tl)], ignore_index=True), None, meta={}))
    sp = d.spikes[d.spikes["cause"] == "kv_pressure"]
    assert len(sp) == n_kv_pressure
    if n_kv_pressure:
        t160 = tl.steps.set_index("step").loc[160, "t_end_s"]
        assert (sp["granularity"] == "interval").all()
        assert ((sp["t_start_s"] < t160) & (sp["t_end_s"] >= t160)).all()
        assert sp["evidence"].iloc[0]["preempted_reqs"] == 2


@pytest.mark.parametrize("step, batch, expect", [
    (102, 9, "graph_fallback"),  # the interval's off-FULL decode dispatches are its 9-request batches
    (106, 8, "unknown"),  # an 8-request batch in that interval replayed FULL: a slow step, no cause
])
def test_interval_graph_fallback_goes_to_the_largest_decode_batches(step, batch, expect):
    faults = {n: dict(decode_reqs=9.0, graph_mode="NONE", dur=0.035) for n in range(100, 105)}
    faults[106] = dict(dur=0.035)
    tl = build(faults=faults)
    iv = _scrape_view(tl)
    st = tl.steps
    iv["graph_off_decode_steps"] = [
        float(((st["t_end_s"] > a) & (st["t_end_s"] <= b) & (st["kind"] == "decode") & (st["graph_mode"] != "FULL")).sum())
        for a, b in zip(iv["t_start_s"], iv["t_end_s"])]
    sp = diagnose(Timeline(pd.concat([_log_view(tl), iv], ignore_index=True), None, meta={})).spikes
    got = sp[(sp["granularity"] == "step") & (sp["step"] == step)]
    assert st.set_index("step").loc[step, "decode_reqs"] == batch
    assert list(got["cause"]) == [expect]


def test_request_stall_of_a_preempted_request_is_kv_pressure():
    # request r7 is preempted at step 50 and resumes at step 80: no step is slow, r7's ITL is
    tl = build(faults={50: dict(preempted_reqs=1, kv_usage=0.99)})
    tok = tl.tokens
    drop = (tok["request_id"] == "r7") & tok["step"].between(50, 79)
    d = diagnose(Timeline(tl.steps, tok[~drop], meta={}))
    sp = d.spikes.set_index("step")
    assert sp.loc[50, "cause"] == "kv_pressure"
    assert sp.loc[50, "evidence"]["request_stall_s"] > 0.5
    assert sp.loc[50, "itl_s"] > 10 * sp.loc[50, "baseline_s"]


def test_a_stretch_of_graph_fallback_stands_out_against_full_decode_steps():
    faults = {n: dict(graph_mode="NONE", decode_reqs=9, dur=0.035) for n in range(100, 115)}
    d = diagnose(build(faults=faults))
    got = d.spikes.set_index("step")["cause"]
    assert set(range(100, 115)) <= set(got.index)
    assert (got.loc[100:114] == "graph_fallback").all()


def test_a_30_step_ep_hotspot_window_is_found_end_to_end():
    faults = {n: dict(expert_imbalance=3.8, dur=0.045) for n in range(50, 80)}
    d = diagnose(build(faults=faults))
    got = d.spikes.set_index("step")["cause"]
    assert set(range(50, 80)) <= set(got.index)
    assert (got.loc[50:79] == "ep_hotspot").all()


def test_two_engines_each_seen_through_a_log_and_scrapes():
    views = []
    for eng, seed in (("engine0", 0), ("engine1", 1)):
        tl = build(faults={40: dict(kind="mixed", prefill_tokens=512, prefill_reqs=1, dur=0.110),
                           100: dict(gap=0.150)}, seed=seed)
        views += [_log_view(tl, f"{eng}@log"), _scrape_view(tl, f"{eng}@scrapes")]
    d = diagnose(Timeline(pd.concat(views, ignore_index=True), None, meta={}))
    for eng in ("engine0", "engine1"):
        sp = d.spikes[d.spikes["instance"].str.startswith(eng)]
        assert "mixing" in set(sp["cause"]) and "host_stall" in set(sp["cause"])


def _step_row(**kw):
    return pd.Series({"granularity": "step", "kind": "decode", "fused_interval": 3.0} | kw)


@pytest.mark.parametrize("fused,expect", [
    ({}, "unknown"),                                                            # the interval says nothing
    ({"fused_interval_expert_imbalance": 4.0, "fused_interval_imbalance_median": 1.1}, "ep_hotspot"),
    ({"fused_interval_expert_imbalance": 1.2, "fused_interval_imbalance_median": 1.1}, "unknown"),
    ({"fused_interval_graph_off_decode_steps": 2.0, "fused_among_largest_batches": 1.0}, "graph_fallback"),
    ({"fused_interval_graph_off_decode_steps": 2.0, "fused_among_largest_batches": 0.0}, "unknown"),
    ({"fused_interval_kv_transfer_bytes": 1e6, "fused_pd_install": 0.0}, "pd_transfer"),
    ({"fused_interval_kv_transfer_bytes": 1e6, "fused_pd_install": 1.0}, "unknown"),  # its install step's
    ({"fused_interval_preempted_reqs": 1.0}, "kv_pressure"),
    ({"fused_interval": np.nan, "fused_interval_preempted_reqs": 1.0}, "unknown"),  # no interval holds it
    # the engine's count of GPU wait on the host, per forward beyond the usual, against the step's
    # excess of 0.02 s (latency 0.05, baseline 0.03): most of it -> measured host stall; a little -> nothing
    ({"fused_interval_host_wait_per_pass_s": 0.015, "latency_s": 0.05, "baseline_s": 0.03}, "host_stall"),
    ({"fused_interval_host_wait_per_pass_s": 0.004, "latency_s": 0.05, "baseline_s": 0.03}, "unknown"),
    ({"fused_interval_host_wait_per_pass_s": 0.0, "latency_s": 0.05, "baseline_s": 0.03}, "unknown"),
])
def test_attribution_turns_fused_interval_evidence_into_a_cause(fused, expect):
    """Fusion only writes fused_* columns; attribution alone decides the cause and its confidence."""
    from mixdiag.diagnosis.rules.fused_rules import attribute_fused
    from mixdiag.diagnosis.rules.rule_context import Attribution
    own = Attribution("unknown", 0.3, {"kind": "decode"})
    got = attribute_fused(_step_row(**fused), own)
    assert got.cause == expect
    assert (got is own) == (expect == "unknown")


def test_fusion_writes_evidence_columns_not_causes():
    from mixdiag.diagnosis.evidence.fusion import INTERVAL_EVIDENCE, STEP_EVIDENCE
    tl = build()
    d = diagnose(Timeline(steps=pd.concat([_log_view(tl), _scrape_view(tl)], ignore_index=True)))
    assert set(INTERVAL_EVIDENCE + STEP_EVIDENCE) <= set(d.steps.columns)
    st = d.steps[d.steps["granularity"] == "step"]
    assert st["fused_interval"].notna().any()  # log steps know the scrape interval that holds them
    root = Path(__file__).parents[2] / "mixdiag" / "diagnosis"
    src = "".join(p.read_text() for p in [root / "part.py", root / "pipeline.py",
                                          *sorted(root.glob("detection/*.py")), *sorted(root.glob("evidence/*.py")),
                                          *sorted(root.glob("rules/*.py"))])
    for name in ("mixdiag_engine", "vllm:", "sglang:", ":increase", "_total"):
        assert name not in src  # source names stop at the collectors


def test_host_wait_reaches_the_log_steps_it_was_measured_under():
    """A log window row gets the interval's wait per forward beyond the usual only where the wait stood out
    in every interval its span overlaps; one that straddles a clean interval gets 0, one past the last
    scrape nothing (evidence/host_wait_fusion.py)."""
    from mixdiag.diagnosis.evidence.host_wait_fusion import fuse_host_wait
    iv = pd.DataFrame({"t_start_s": [0.0, 1.0, 2.0], "t_end_s": [1.0, 2.0, 3.0], "gap_excess_s": [0.0, 0.30, 0.32],
                       "gap_excess_sigma_s": [0.01, 0.01, 0.01], "graph_full_steps": [40.0, 20.0, 20.0]})
    f = pd.DataFrame({"t_start_s": [1.1, 0.5, 2.5], "t_end_s": [2.9, 1.5, 3.5], "granularity": "step",
                      "fused_interval_host_wait_per_pass_s": np.nan})
    fuse_host_wait(f, f["granularity"] == "step", iv, 3.0)
    got = f["fused_interval_host_wait_per_pass_s"].tolist()
    assert got[0] == pytest.approx(0.015) and got[1] == 0.0 and np.isnan(got[2])


def test_a_whole_second_stamp_lands_in_one_scrape_interval():
    """A line stamped 15 s (printed within [15, 16)) between 1 s scrapes ending at 15.4 and 16.4 s is evidence
    of the interval holding most of its second - the later one - not of both (fusion._time_or_count_window)."""
    from types import SimpleNamespace

    from mixdiag.diagnosis.evidence.fusion import _time_or_count_window
    st = pd.DataFrame({"t_end_s": [15.0, 17.0], "stamp_resolution_s": [1.0, 1.0]})
    before, after = SimpleNamespace(t_start_s=14.4, t_end_s=15.4), SimpleNamespace(t_start_s=15.4, t_end_s=16.4)
    assert len(_time_or_count_window(st, None, before)) == 0
    assert _time_or_count_window(st, None, after)["t_end_s"].tolist() == [15.0]
    fine = st.assign(stamp_resolution_s=0.0, t_end_s=[15.2, 17.0])  # a fine clock is placed as stamped
    assert _time_or_count_window(fine, None, before)["t_end_s"].tolist() == [15.2]
