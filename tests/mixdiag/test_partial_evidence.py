"""Issue 15 acceptance: the same injected causes seen through partial, source-shaped evidence.

One script of steps (decode baseline, periodic mixed steps, graph fallbacks, EP hotspots, host
stalls) is rendered as what four real sources would show: (i) step times + graph mode + SM activity,
(ii) token counts inferred from copy sizes + comm share from kernel names, (iii) vLLM-named interval
metrics (exposition text read by the Prometheus collector), (iv) an SGLang-style step log. Each view
must name mixing for the mixing spikes - at the lower confidence its evidence allows - and never
call a non-mixing spike mixing. Plus the video-generation trace: not LLM serving, nothing above 0.5.
"""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors import load
from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline

FIX = Path(__file__).resolve().parents[1] / "fixtures"
N, BASE = 300, 0.020
MIX = set(range(12, N, 25))                      # a prefill chunk joins the decodes every 25 steps
FALLBACK = {40, 41, 140, 141, 240}              # decode batch above the captured sizes
HOTSPOT = {90, 91, 92, 190, 191}                # one EP rank got most rows
STALL = {65, 165, 265}                          # the host idled before the step


def script(seed=0):
    """The truth: one row per step with its cause and what the device did."""
    rng = np.random.default_rng(seed)
    rows, t = [], 1000.0
    for i in range(N):
        cause = ("mixing" if i in MIX else "graph_fallback" if i in FALLBACK else "ep_hotspot" if i in HOTSPOT
                 else "host_stall" if i in STALL else "none")
        dur = BASE * rng.uniform(0.97, 1.03) * {"mixing": 4.0, "graph_fallback": 1.8, "ep_hotspot": 1.8}.get(cause, 1.0)
        gap = 0.0005 + (0.06 if cause == "host_stall" else 0.0)
        sm = {"mixing": 0.92, "ep_hotspot": 0.22}.get(cause, 0.35) + rng.uniform(-0.02, 0.02)
        rows.append(dict(step=i, cause=cause, t_start_s=t + gap, t_end_s=t + gap + dur, sm=sm,
                         graph={"mixing": "PIECEWISE", "graph_fallback": "NONE"}.get(cause, "FULL"),
                         prefill=2048.0 if cause == "mixing" else 0.0,
                         decode=300.0 if cause == "graph_fallback" else 32.0,
                         comm=0.45 if cause == "ep_hotspot" else 0.08 + rng.uniform(-0.01, 0.01)))
        t += gap + dur
    return pd.DataFrame(rows)


def _steps(s: pd.DataFrame, **cols) -> Timeline:
    base = dict(instance="srv", step=s["step"], t_start_s=s["t_start_s"], t_end_s=s["t_end_s"], granularity="step")
    df = pd.DataFrame({**base, **cols})
    return Timeline(df, None, meta={"signals": {"srv": {}}})


def view_times_graph_sm(s):
    """(i) an Nsight export without ranges: step times, graph launches, GPU-metrics SM activity."""
    return _steps(s, kind="unknown", graph_mode=s["graph"], graph_replayed=(s["graph"] == "FULL").astype(float),
                  sm_active=s["sm"], q_graph_mode="measured", q_sm_active="measured", q_token_allocation="absent")


def view_inferred_counts(s):
    """(ii) token counts inferred from input-copy sizes, comm share from kernel names."""
    kind = np.where(s["prefill"] > 0, "mixed", "decode")
    return _steps(s, kind=kind, prefill_tokens=s["prefill"], decode_rows=s["decode"], decode_reqs=s["decode"],
                  comm_share=s["comm"], q_token_allocation="inferred")


ITL_B = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
ITER_B = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def _hist(name, bounds, counts):
    out = [f"# TYPE {name} histogram"]
    out += [f'{name}_bucket{{model_name="m",le="{b}"}} {c}' for b, c in zip(list(bounds) + ["+Inf"], counts)]
    return out + [f'{name}_count{{model_name="m"}} {counts[-1]}', f'{name}_sum{{model_name="m"}} {0.02 * counts[-1]}']


def view_vllm_metrics(s, interval_s=0.25):
    """(iii) vLLM /metrics scraped every 250 ms: cumulative counters and histograms, vLLM names."""
    itl = np.zeros(len(ITL_B) + 1)
    it = np.zeros(len(ITER_B) + 1)
    prompt = gen = ttft = preempt = 0.0
    t0, t1 = float(s["t_start_s"].min()), float(s["t_end_s"].max())
    pairs, edges = [], np.arange(t0, t1 + interval_s, interval_s)
    for a, b in zip(edges[:-1], edges[1:]):
        w = s[(s["t_end_s"] > a) & (s["t_end_s"] <= b)]
        for r in w.itertuples():
            lat = r.t_end_s - r.t_start_s + (0.06 if r.cause == "host_stall" else 0.0)
            itl[np.searchsorted(ITL_B, lat):] += 32
            tokens = 32 + r.prefill
            it[np.searchsorted(ITER_B, tokens):] += 1
            prompt += r.prefill
            gen += 32
            ttft += 1 if r.prefill else 0
        lines = ["# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{model_name="m"} 32',
                 'vllm:num_requests_waiting{model_name="m"} 0', 'vllm:kv_cache_usage_perc{model_name="m"} 0.5',
                 "# TYPE vllm:prompt_tokens_total counter", f'vllm:prompt_tokens_total{{model_name="m"}} {prompt}',
                 "# TYPE vllm:generation_tokens_total counter", f'vllm:generation_tokens_total{{model_name="m"}} {gen}',
                 "# TYPE vllm:num_preemptions_total counter", f'vllm:num_preemptions_total{{model_name="m"}} {preempt}']
        lines += _hist("vllm:inter_token_latency_seconds", ITL_B, [int(x) for x in itl])
        lines += _hist("vllm:iteration_tokens_total", ITER_B, [int(x) for x in it])
        pairs.append((b, "\n".join(lines) + "\n"))
    return scrape_reader.read_scrapes(pairs, instance="srv")


VIEWS = {"times+graph+sm": (view_times_graph_sm, 0.5, 0.8),
         "inferred counts+comm": (view_inferred_counts, 0.6, 0.9)}


def _truth_of(d, s):
    """Per spike: the truth causes of the steps its row covers."""
    out = []
    for sp in d.spikes.itertuples():
        m = (s["t_end_s"] > sp.t_start_s - 1e-9) & (s["t_start_s"] < sp.t_end_s + 1e-9)
        out.append(set(s.loc[m, "cause"]))
    return out


@pytest.mark.parametrize("name", list(VIEWS))
def test_step_views_name_mixing_and_nothing_else(name):
    view, lo, hi = VIEWS[name]
    s = script()
    d = diagnose(view(s))
    truth = _truth_of(d, s)
    mixing_spikes = [(sp, t) for sp, t in zip(d.spikes.itertuples(), truth) if "mixing" in t]
    assert len(mixing_spikes) >= len(MIX) - 1
    assert all(sp.cause == "mixing" and lo <= sp.confidence <= hi for sp, _ in mixing_spikes), \
        [(sp.step, sp.cause, sp.confidence) for sp, _ in mixing_spikes]
    wrong = [(sp.step, t) for sp, t in zip(d.spikes.itertuples(), truth) if sp.cause == "mixing" and "mixing" not in t]
    assert not wrong
    ev = mixing_spikes[0][0].evidence
    assert ev["signal_quality"]["token_allocation"] == ("absent" if name.startswith("times") else "inferred")


def test_times_graph_sm_separates_fallback_and_keeps_hotspots_and_stalls():
    s = script()
    d = diagnose(view_times_graph_sm(s))
    got = dict(zip(d.spikes["step"], d.spikes["cause"]))
    assert all(got.get(i) == "graph_fallback" for i in FALLBACK)  # memory-bound, modest: eager decode
    assert all(got.get(i) == "host_stall" for i in STALL)          # measured gap
    assert all(got.get(i) in ("unknown", None) for i in HOTSPOT)   # no comm, no imbalance: no claim


def test_inferred_counts_with_comm_find_hotspots():
    s = script()
    d = diagnose(view_inferred_counts(s))
    got = dict(zip(d.spikes["step"], d.spikes["cause"]))
    assert all(got.get(i) == "ep_hotspot" for i in HOTSPOT)
    measured = diagnose(view_inferred_counts(s).__class__(
        view_inferred_counts(s).steps.assign(q_token_allocation="measured"), None, meta={}))
    conf = dict(zip(measured.spikes["step"], measured.spikes["confidence"]))
    # the same counts measured rather than inferred earn more confidence
    assert all(conf[i] > c for i, c in zip(d.spikes["step"], d.spikes["confidence"]) if got[i] == "mixing")


def test_estimated_signals_never_corroborate_the_allocation():
    s = script()
    kind = np.where(s["prefill"] > 0, "mixed", "decode")
    tl = _steps(s, kind=kind, prefill_tokens=s["prefill"], decode_rows=s["decode"], decode_reqs=s["decode"],
                graph_mode=s["graph"], graph_replayed=0.0, sm_active=s["sm"], q_sm_active="estimated",
                q_token_allocation="inferred")
    d = diagnose(tl)
    mix = d.spikes[d.spikes["cause"] == "mixing"]
    assert len(mix) and (mix["confidence"] <= 0.65).all()  # no corroboration from planned graph or modelled SM
    assert all(e["signal_quality"]["graph_mode"] == "estimated" for e in mix["evidence"])


def test_vllm_interval_metrics_mixing_from_the_prefill_itl_relation():
    s = script()
    tl = view_vllm_metrics(s)
    d = diagnose(tl)
    iv = tl.steps.sort_values("step").reset_index(drop=True)
    assert len(d.spikes)
    rel = d.instances[tl.instances[0]]["prefill_itl_relation"]
    assert rel["rho"] > 0 and rel["p_value"] < 0.01
    for sp in d.spikes.itertuples():
        row = iv[iv["step"] == sp.step].iloc[0]
        has_mix = bool(((s["t_end_s"] > row.t_start_s) & (s["t_end_s"] <= row.t_end_s) & (s["cause"] == "mixing")).any())
        if sp.cause == "mixing":
            assert has_mix and sp.confidence <= 0.8
    assert (d.spikes["cause"] == "mixing").any()


def test_one_interval_of_prefill_work_names_only_its_own_spike():
    """No relation across intervals to test (one interval of work), yet the interval's own evidence
    speaks: its prompt work stands far above the usual (none) beside a spike -> mixing, at low
    confidence; the spike without prefill work stays unknown."""
    rows = [dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="unknown",
                 prefill_tokens=4096.0 if i == 12 else 0.0, running_reqs=32.0, itl_count=300.0, itl_p50_s=0.02,
                 itl_p99_s=0.2 if i in (12, 20) else 0.03) for i in range(30)]
    d = diagnose(Timeline(pd.DataFrame(rows), None, meta={}))
    assert np.isnan(d.instances["srv"]["prefill_itl_relation"]["rho"] or np.nan)
    got = dict(zip(d.spikes["step"], zip(d.spikes["cause"], d.spikes["confidence"])))
    assert got[12][0] == "mixing" and got[12][1] <= 0.5 and got[20][0] == "unknown"


def test_video_generation_trace_is_not_llm_serving():
    d = diagnose(load(str(FIX / "nsys" / "h100_2gpu_1s.sqlite")))
    assert "does not look like LLM serving" in d.verdict
    assert len(d.spikes) and (d.spikes["confidence"] <= 0.5).all()
    assert d.itl["p50_s"] is not None and d.itl["p99_s"] is not None and d.itl["max_s"] is not None


def view_sglang_log(s, log_interval=2, mixed_chunk=True):
    """(iv) an SGLang scheduler log only: a ``Prefill batch`` line per prefill forward (stamped when
    it was scheduled, whole seconds, no duration) and a ``Decode batch`` line every
    ``log_interval`` decode forwards with the gen throughput since the previous one. Returns the
    log text and, per batch line in order, the truth causes of the forwards that line speaks for
    (a Decode line: every forward since the previous Decode line)."""
    import datetime as dt

    def stamp(t):
        return dt.datetime.fromtimestamp(1_796_000_000 + t, dt.timezone.utc).strftime("[%Y-%m-%d %H:%M:%S]")

    lines = [f"{stamp(s['t_start_s'].iloc[0])} server_args=ServerArgs(model_path='m', chunked_prefill_size=2048, "
             f"enable_mixed_chunk={mixed_chunk}, decode_log_interval={log_interval}, disable_cuda_graph=False)"]
    covers, window, n_dec, tokens, t_last = [], [], 0, 0, float(s["t_start_s"].iloc[0])
    for r in s.itertuples():
        window.append(r.cause)
        tokens += 32
        if r.prefill:
            lines.append(f"{stamp(r.t_start_s)} Prefill batch, #new-seq: 1, #new-token: {int(r.prefill)}, #cached-token: 0, "
                         "token usage: 0.10, #running-req: 32, #queue-req: 0, cuda graph: False, "
                         "input throughput (token/s): 20000.00")
            covers.append({r.cause})
            continue
        n_dec += 1
        if n_dec % log_interval:
            continue
        graph = "False" if r.graph == "NONE" else "True"
        lines.append(f"{stamp(r.t_end_s)} Decode batch, #running-req: 32, #token: 9000, token usage: 0.10, "
                     f"cuda graph: {graph}, gen throughput (token/s): {tokens / (r.t_end_s - t_last):.2f}, #queue-req: 0")
        covers.append(set(window))
        window, tokens, t_last = [], 0, r.t_end_s
    return "\n".join(lines) + "\n", covers


def test_sglang_log_names_mixing_from_prefill_lines_in_the_decode_window(tmp_path):
    """View (iv): a Decode line's mean step time rises over a window whose Prefill lines carried
    running requests under --enable-mixed-chunk: mixing, at the lower confidence a window mean
    allows; windows slowed by a fallback, a hotspot or a host stall hold no prefill line and are
    never called mixing."""
    s = script()
    text, covers = view_sglang_log(s)
    p = tmp_path / "sglang.log"
    p.write_text(text)
    d = diagnose(load(str(p)))
    sp = d.spikes[d.spikes["granularity"] == "step"]
    truth = [covers[int(k)] for k in sp["step"]]
    mixing = [(r, t) for r, t in zip(sp.itertuples(), truth) if "mixing" in t]
    assert len(mixing) >= len(MIX) - 1, sp[["step", "cause", "confidence"]]
    assert all(r.cause == "mixing" and 0.4 <= r.confidence <= 0.65 for r, _ in mixing), \
        [(r.step, r.cause, r.confidence) for r, _ in mixing]
    wrong = [(r.step, t) for r, t in zip(sp.itertuples(), truth) if r.cause == "mixing" and "mixing" not in t]
    assert not wrong
    others = [r.cause for r, t in zip(sp.itertuples(), truth) if t & {"host_stall", "ep_hotspot", "graph_fallback"}]
    assert len(others) >= 4  # the other faults' windows spike too, so "never mixing" is tested
    # without mixed chunk the same lines mean the decodes waited: prefill_stall, never mixing
    text, covers = view_sglang_log(s, mixed_chunk=False)
    p.write_text(text)
    d = diagnose(load(str(p)))
    assert "mixing" not in set(d.spikes["cause"]) and "prefill_stall" in set(d.spikes["cause"])
