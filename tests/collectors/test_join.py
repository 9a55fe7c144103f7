"""One server, every source (collectors/join.py): a server's log, scrape directory and client records
are one instance; client records + scrapes count each spike once; ``--instance`` overrides the
automatic join; inputs naming different models stay apart.

Inputs come from one reference-engine run (host-stall scenario, vLLM log lines, scrapes every
0.5 s). The client file is written from the run's own token events (what a client on loopback saw,
on the same wall clock), in ``mixdiag load``'s record format.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("join") / "run"
    subprocess.run([sys.executable, "-m", "mixdiag", "run", "--scenario", "host-stall", "--max-steps", "150",
                    "--log-format", "vllm", "--scrape-interval", "0.5", "--out", str(out), "-q"],
                   check=True, capture_output=True, timeout=300)
    return out


def client_file(run_dir, path, model: str | None = None):
    """A ``mixdiag load`` file of the run's token events (one record per request)."""
    tok = pd.read_parquet(run_dir / "tokens.parquet").sort_values("t_s")
    with open(path, "w") as f:
        f.write(json.dumps({"type": "header", "format": "mixdiag-load", "version": 1,
                            "url": "http://127.0.0.1:8000", "model": model}) + "\n")
        for rid, g in tok.groupby("request_id", sort=False):
            first = g[g["is_first"] == 1]
            start = float(first["arrival_s"].iloc[0]) if len(first) else float(g["t_s"].iloc[0])
            f.write(json.dumps({"type": "request", "request_id": rid, "status": "ok", "start_s": start,
                                "token_times_s": [float(t) for t in g["t_s"]],
                                "prompt_tokens": int(first["prompt_tokens"].iloc[0]) if len(first) else None}) + "\n")
    return path


def log_with_model(run_dir, path, model: str):
    """The run's vLLM log behind a start-up line naming ``model`` (vLLM's engine config line)."""
    text = (run_dir / "engine.log").read_text()
    path.write_text(f"INFO 12-01 00:00:00 [core.py:75] Initializing a V1 LLM engine (v0.10.0) with config: "
                    f"model='{model}', speculative_config=None, tokenizer='{model}'\n" + text)
    return path


def test_log_and_scrapes_of_one_server_are_one_instance(run_dir):
    tl = load([str(run_dir / "engine.log"), str(run_dir / "scrapes")])
    (name, entry), = tl.meta["instance_sources"].items()
    assert {s["format"] for s in entry["sources"]} == {"vllm-log", "prom-text"}
    assert entry["joined_by"] == "overlap" and set(tl.instances) == {name, f"{name}@intervals"}
    steps = tl.steps.set_index("instance")["granularity"]
    assert (steps.loc[name] == "step").all() and (steps.loc[f"{name}@intervals"] == "interval").all()
    d = diagnose(tl)
    assert d.headline.instances == (name,)
    assert [s["path"] for s in d.to_json()["instances"][name]["sources"]] == [str(run_dir / "engine.log"),
                                                                             str(run_dir / "scrapes")]


def test_client_records_and_scrapes_count_each_spike_once(run_dir, tmp_path):
    client = client_file(run_dir, tmp_path / "client.jsonl")
    alone = diagnose(load(str(client)))
    tl = load([str(client), str(run_dir / "scrapes")])
    (name, entry), = tl.meta["instance_sources"].items()
    assert {s["role"] for s in entry["sources"]} == {"client", "scrapes"}
    d = diagnose(tl)
    assert d.headline.n_spikes == alone.headline.n_spikes > 0, (d.by_cause, alone.by_cause)
    sp = d.spikes
    step_sp, iv_sp = sp[sp["granularity"] == "step"], sp[sp["granularity"] == "interval"]
    # no interval spike holds a step spike of the same server: each wait is named once
    for _, r in iv_sp.iterrows():
        inside = step_sp[(step_sp["t_s"] > r["t_start_s"]) & (step_sp["t_s"] <= r["t_end_s"])]
        assert not len(inside), (r.to_dict(), inside[["t_s", "cause"]])
    # the stalls the client saw are named once each: a stall is host_stall or unknown, never both
    stalls = sp[sp["cause"].isin(["host_stall", "unknown"])].sort_values("t_s")
    assert not (stalls["t_s"].diff() < 1e-3).any()
    # the server's token time and excess are counted once too: the scrapes' ITL histogram saw the same
    # gaps the client did (budget and regimes read the finer view only where both cover the time)
    assert_counted_once(d, alone)


def assert_counted_once(d, alone):
    """``d`` (one server from several inputs) counts the token time, excess and episodes ``alone`` (its
    client records alone) counts: no second count from the scrapes of the same gaps."""
    tt = {k: v["token_time_s"] for k, v in d.budget.to_json()["instances"].items()}
    alone_tt = sum(v["token_time_s"] for v in alone.budget.to_json()["instances"].values())
    assert sum(tt.values()) == pytest.approx(alone_tt, rel=1e-9), tt
    assert d.budget.to_json()["total"]["excess_s"] == pytest.approx(alone.budget.to_json()["total"]["excess_s"])
    assert sum(d.regimes.excess_by_cause().values()) == pytest.approx(sum(alone.regimes.excess_by_cause().values()))
    assert len(d.regimes.episodes) == len(alone.regimes.episodes)


def test_explicit_instance_overrides_the_join(run_dir):
    log, scrapes = str(run_dir / "engine.log"), str(run_dir / "scrapes")
    tl = load([log, scrapes], join={"a": [log], "b": [scrapes]})
    assert tl.instances == ["a", "b"] and set(tl.meta["instance_sources"]) == {"a", "b"}
    assert tl.meta["instance_sources"]["a"]["joined_by"] == "--instance"
    both = load([log, scrapes], join={"srv": [log, scrapes]})
    assert set(both.instances) == {"srv", "srv@intervals"}


def _per_instance(d, name):
    sp = d.spikes[d.spikes["instance"] == name]
    return list(zip(sp["step"], sp["granularity"], sp["cause"]))


@pytest.mark.parametrize("first", ["engine.log", "client"])
def test_inputs_named_apart_are_diagnosed_apart(run_dir, tmp_path, first):
    """Explicit names win over inference: a log (or client records) and the scrapes of one run, named as two
    instances with --instance, are diagnosed as each alone - no evidence fused across them, no interval spike
    absorbed by the other's steps - although their clocks overlap as one server's would."""
    a = str(client_file(run_dir, tmp_path / "client.jsonl")) if first == "client" else str(run_dir / first)
    b = str(run_dir / "scrapes")
    d = diagnose(load([a, b], join={"a": [a], "b": [b]}))
    assert d.headline.instances == ("a", "b")
    for name, path in (("a", a), ("b", b)):
        alone = diagnose(load([path], join={name: [path]}))
        assert _per_instance(d, name) == _per_instance(alone, name), name
    a_rows = d.steps[d.steps["instance"] == "a"]
    assert a_rows["fused_interval"].isna().all()
    joined = diagnose(load([a, b]))  # without the names: one server (the overlap rule), as before
    assert len(joined.headline.instances) == 1


def test_two_servers_logs_named_apart_stay_two(run_dir, tmp_path):
    """Two servers' logs (same role, same minutes) named apart, one of them with its scrapes: two servers,
    each counted as its own inputs alone; the report lists each server's sources."""
    from mixdiag.report import render

    la, lb = tmp_path / "a.log", tmp_path / "b.log"
    la.write_text((run_dir / "engine.log").read_text())
    lb.write_text((run_dir / "engine.log").read_text())
    scrapes = str(run_dir / "scrapes")
    d = diagnose(load([str(la), str(lb), scrapes], join={"A": [str(la), scrapes], "B": [str(lb)]}))
    assert d.headline.instances == ("A", "B")
    assert _per_instance(d, "B") == _per_instance(diagnose(load([str(lb)], join={"B": [str(lb)]})), "B")
    both = diagnose(load([str(la), scrapes], join={"A": [str(la), scrapes]}))
    assert _per_instance(d, "A") == _per_instance(both, "A")
    text = render(d)
    assert f"A: one server from 2 inputs (--instance): {la} (vllm-log), {scrapes} (prom-text)" in text
    assert f"B: one server from {lb} (vllm-log; --instance)" in text


def test_log_scrapes_and_client_records_of_one_server_are_one_instance(run_dir, tmp_path):
    """One server's log, scrape directory and client records: one instance listing its three sources; each
    spike, each token gap's excess and each episode counted once (as the client records alone count them)."""
    client = str(client_file(run_dir, tmp_path / "client.jsonl"))
    paths = [str(run_dir / "engine.log"), str(run_dir / "scrapes"), client]
    d = diagnose(load(paths))
    (name,) = d.headline.instances
    assert [s["role"] for s in d.to_json()["instances"][name]["sources"]] == ["log", "scrapes", "client"]
    alone = diagnose(load(client))
    assert d.headline.n_spikes == alone.headline.n_spikes > 0, (d.by_cause, alone.by_cause)
    assert_counted_once(d, alone)


def test_two_servers_with_different_model_names_stay_two(run_dir, tmp_path):
    client = client_file(run_dir, tmp_path / "client.jsonl", model="llama-b")
    log = log_with_model(run_dir, tmp_path / "a.log", "llama-a")
    apart = load([str(log), str(client)])
    assert len(apart.meta["instance_sources"]) == 2
    same = load([str(log_with_model(run_dir, tmp_path / "b.log", "llama-b")), str(client)])
    (name, entry), = same.meta["instance_sources"].items()
    assert name == "llama-b" and [s["models"] for s in entry["sources"]] == [["llama-b"], ["llama-b"]]


def test_analyze_instance_flag_lists_sources_and_rejects_bad_specs(run_dir, capsys):
    from mixdiag.cli import main

    log, scrapes = str(run_dir / "engine.log"), str(run_dir / "scrapes")
    assert main(["analyze", "--json", log, "--instance", f"srv={log},{scrapes}"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["path"] for s in doc["instances"]["srv"]["sources"]] == [log, scrapes]
    assert doc["instances"]["srv@intervals"]["view_of"] == "srv"
    assert main(["analyze", log, "--instance", "srv"]) != 0
    assert "NAME=PATH" in capsys.readouterr().err


def test_an_interval_judgement_over_step_spikes_names_them_instead_of_adding_one():
    from mixdiag.diagnosis.part import _absorbed
    from mixdiag.diagnosis.rules.rule_context import Attribution

    f = pd.DataFrame({"instance": ["srv"] * 3, "step": [0, 1, 2], "granularity": "step", "is_spike": [False, True, True],
                      "fused_interval": [3.0, 3.0, 4.0], "cause": [None, "unknown", "unknown"]})
    spikes = [{"instance": "srv", "step": s, "granularity": "step", "cause": "unknown", "confidence": 0.2,
               "evidence": {"granularity": "step"}} for s in (1, 2)]
    a = Attribution("host_stall", 0.6, {"granularity": "interval", "host_gap_excess_s": 0.3})
    row = pd.Series({"instance": "srv@intervals", "step": 3})
    assert _absorbed(spikes, [f], "srv@intervals", row, a)
    assert [s["cause"] for s in spikes] == ["host_stall", "unknown"] and list(f["cause"][1:]) == ["host_stall", "unknown"]
    assert spikes[0]["evidence"]["granularity"] == "step" and spikes[0]["evidence"]["interval"] == 3
    other = pd.Series({"instance": "other@intervals", "step": 3})  # another server's interval: not absorbed
    assert not _absorbed(spikes, [f], "other@intervals", other, a)


def test_a_joined_server_keeps_its_trace_spines_device_rows_for_the_breakdown():
    from pathlib import Path

    from mixdiag.diagnosis.breakdown import breakdown

    fix = Path(__file__).resolve().parents[1] / "fixtures"
    trace, log = str(fix / "nsys" / "mock.sqlite"), str(fix / "logs" / "vllm_log_37307.txt")
    alone = load(trace)
    tl = load([trace, log], join={"srv": [trace, log]})
    assert len(tl.activity) == len(alone.activity) > 0 and set(tl.activity["instance"]) == {"srv"}
    assert tl.activity["step"].tolist() == alone.activity["step"].tolist()  # the spine's steps keep their numbers
    b = breakdown(tl, diagnose(tl))
    assert b.status == "ok" and set(b.utilisation["instance"]) == {"srv"}


def test_a_real_vllm_log_and_its_scrapes_are_one_instance():
    """vLLM 0.32 prints ``served_model_name=tiny-llama`` bare and ``model='<path>'``; its scrapes label
    ``model_name="tiny-llama"``. Read before as two models, the log and the scrapes of one real server
    were two instances (tests/fixtures/vllm032, one testbed run)."""
    from pathlib import Path

    fix = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032"
    from mixdiag.collectors import join
    assert join.hints(str(fix / "vllm.log"), "vllm-log")[0] == join.hints(str(fix / "scrapes"), "prom-text")[0] \
        == frozenset({"tiny-llama"})
    tl = load([str(fix / "scrapes"), str(fix / "vllm.log")], year=2026)
    (name, entry), = tl.meta["instance_sources"].items()
    assert {s["format"] for s in entry["sources"]} == {"vllm-log", "prom-text"} and entry["joined_by"] == "overlap"


@pytest.mark.parametrize("line, want", [
    ("served_model_name=tiny-llama, scheduler_config=", {"tiny-llama"}),          # 0.32: bare
    ("served_model_name=['m-a'], x=1", {"m-a"}),                                 # a list
    ("model='m-b', served_model_name=None, x=1", {"m-b"}),                       # unset: the model argument
    ("model='/models/org/Llama-3-8B', tokenizer='/models/org/Llama-3-8B'", {"/models/org/Llama-3-8B", "Llama-3-8B"}),
])
def test_model_hints_of_a_config_line(tmp_path, line, want):
    from mixdiag.collectors import join
    p = tmp_path / "v.log"
    p.write_text(f"INFO 12-01 00:00:00 [core.py:75] Initializing a V1 LLM engine (v0.32.0) with config: {line}\n")
    assert join.hints(str(p), "vllm-log")[0] == frozenset(want)


def test_a_window_log_and_scrapes_count_the_scrapes(tmp_path):
    """SGLang's operator log prints a Decode line every 40 forwards: its rows are windows as long as a
    scrape interval, and its Prefill lines are stamps without a latency. Joined with the scrapes of the
    same server, the scrapes' ITL histogram is the finer count: budget, regimes, episodes and the headline
    ITL are the scrapes' own, and no zero-length row reads as an ITL of 0 (independent generator,
    tests/helpers)."""
    from helpers.metrics_gen import GenConfig, generate  # tests/ is on the path (conftest.py)
    cap = generate(GenConfig("sglang", 1, 600), tmp_path / "cap")
    alone = diagnose(load(str(cap.scrapes)))
    d = diagnose(load([str(cap.scrapes), str(cap.log)]))
    assert len(alone.regimes.episodes) >= 1
    assert list(d.regimes.episodes["cause"]) == list(alone.regimes.episodes["cause"])
    assert d.budget.to_json()["total"]["excess_s"] == pytest.approx(alone.budget.to_json()["total"]["excess_s"])
    assert d.headline.itl_p50_s > 0
    # the headline ITL is the scrapes' too (the windows' means would hide the tail), and no budget section
    # is made of the log's stamp rows
    assert (d.headline.itl_source, d.headline.itl_p99_s) == (alone.headline.itl_source, alone.headline.itl_p99_s)
    assert list(d.budget.to_json()["instances"]) == [f"{d.headline.instances[0]}@intervals"]


def _part(source: str, ends, tokens: int = 0):
    from types import SimpleNamespace

    from mixdiag.collectors.join import Input
    rows = pd.DataFrame({"t_start_s": np.r_[ends[0] - 0.01, ends[:-1]], "t_end_s": ends, "step_source": source})
    tok = pd.DataFrame({"t_s": ends[:tokens]}) if tokens else pd.DataFrame({"t_s": []})
    return Input(source, source, source, SimpleNamespace(tokens=tok)), rows  # the key reads tokens alone


@pytest.mark.parametrize("engine_clock, first", [
    (2e-6, "trace"),     # both resolve 10 ms steps: the engine's own records, whichever clock is finer
    (5e-7, "trace"),
    (1.0, "client"),     # whole-second stamps resolve nothing: the client's reads
])
def test_the_step_spine_is_the_engines_records_where_their_clock_resolves_steps(engine_clock, first):
    from mixdiag.collectors.join_spine import spine_first
    base = 1.79e9 + np.arange(200) * 0.01
    client = _part("client", base + 1e-6 * np.arange(200) % 7e-6, tokens=200)
    engine = _part("trace", np.round(base / engine_clock) * engine_clock)
    for parts in ([client, engine], [engine, client]):
        assert spine_first(parts, True)[0][0].given == first


def test_per_step_eplb_lines_give_each_scrape_interval_its_own_imbalance():
    """vLLM logs an ``EPLB step:`` line every engine step (eplb_state.py, log_balancedness_interval 1), at
    whole-second stamps; the operator log's rows are its 10 s stats windows, whose mean imbalance diluted a
    3 s hotspot to 1.5 on every 1 s scrape interval of the window. Joined, each scrape interval takes the
    mean of the lines stamped inside it (a stamp s placed at s + 0.5); one with no line of its own, inside
    the lines' span, is left unmeasured; one the scrapes measured themselves keeps its value."""
    from types import SimpleNamespace

    from mixdiag.collectors.join import Input, _merge_view
    t0 = 1.79e9
    ends = t0 + np.arange(1, 11, dtype=float) + 0.3                  # scrapes at t0+1.3 ... t0+10.3
    spine = pd.DataFrame({"t_start_s": ends - 1.0, "t_end_s": ends, "itl_count": 50.0,
                          "expert_imbalance": [np.nan] * 9 + [1.2]})
    stamps = [s for s in range(0, 10) if s != 7 for _ in range(20)]  # 20 steps a second, none logged at t0+7
    hot = {3: 3.0, 4: 3.0, 5: 3.0}
    vals = [hot.get(s, 1.0) for s in stamps]
    ser = pd.DataFrame({"instance": "v", "name": "vllm_log:eplb_expert_imbalance", "labels": "",
                        "t_s": t0 + np.array(stamps, dtype=float), "value": vals})
    log_rows = pd.DataFrame({"t_start_s": [t0], "t_end_s": [t0 + 10.0], "itl_count": [np.nan],
                             "expert_imbalance": [np.mean(vals)]})
    spine_inp = Input("scrapes", "scrapes", "prom-text", SimpleNamespace(tokens=pd.DataFrame({"t_s": []})))
    log_inp = Input("v.log", "v.log", "vllm-log", SimpleNamespace(tokens=pd.DataFrame({"t_s": []}), series=ser))
    notes: list[str] = []
    got = _merge_view([(spine_inp, spine), (log_inp, log_rows)], False, notes)
    imb = got.sort_values("t_end_s")["expert_imbalance"].to_numpy()
    # window k, (t0+k+0.3, t0+k+1.3], holds the lines stamped t0+k (placed at t0+k+0.5): seconds 3-5 hot
    want = [1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 1.0, np.nan, 1.0, 1.2]
    np.testing.assert_allclose(imb, want)
    assert any("per-step lines" in n for n in notes)


def test_timed_pauses_sum_into_the_scrape_interval_whose_itl_saw_them():
    """vLLM's GC debugger logs one line per collection at its end, on whole-second stamps: a pause stamped
    s ended in [s, s + 1). Each scrape interval takes the sum of the pauses that ended in it, 0 inside the
    log's span where none did (the debugger logs every collection). Where [s, s + 1) holds a scrape
    boundary, the interval whose ITL histogram counted the later token (its tail floor) takes the pause -
    a pause stops every running request for its length."""
    from types import SimpleNamespace

    from mixdiag.collectors.join import Input, _merge_view
    t0 = 1.79e9
    ends = t0 + np.arange(1, 9, dtype=float) + 0.3                  # scrapes at t0+1.3 ... t0+8.3
    tail = [0.01, 0.01, 0.25, 0.01, 0.01, 0.01, 0.3, 0.01]          # rows ending t0+3.3 and t0+7.3 saw a long token
    spine = pd.DataFrame({"t_start_s": ends - 1.0, "t_end_s": ends, "itl_count": 50.0, "itl_tail_floor_s": tail})
    # (stamp offset, seconds): a young collection at +1, a 0.27 s pause stamped +3 ([t0+3, t0+4) straddles
    # the t0+3.3 boundary: the row ending t0+3.3 saw it), two collections stamped +6 (0.26 + 0.31 s: the row
    # ending t0+7.3 saw them)
    pts = [(1, 0.0001), (3, 0.27), (6, 0.26), (6, 0.31)]
    ser = pd.DataFrame({"instance": "v", "name": "vllm_log:gc_pause_s", "labels": "",
                        "t_s": [t0 + s for s, _ in pts], "value": [v for _, v in pts]})
    log_rows = pd.DataFrame({"t_start_s": [t0 - 2.0], "t_end_s": [t0 + 8.0], "itl_count": [np.nan],
                             "host_pause_s": [0.8401]})
    spine_inp = Input("scrapes", "scrapes", "prom-text", SimpleNamespace(tokens=pd.DataFrame({"t_s": []})))
    log_inp = Input("v.log", "v.log", "vllm-log",
                    SimpleNamespace(tokens=pd.DataFrame({"t_s": []}), series=ser, steps=log_rows))
    notes: list[str] = []
    got = _merge_view([(spine_inp, spine), (log_inp, log_rows)], False, notes)
    pause = got.sort_values("t_end_s")["host_pause_s"].to_numpy()
    # the row ending t0+8.3 lies past the log's last stats row but inside the last line's window: measured
    # (the young collection: equal tails on both sides of t0+1.3, so the middle of its second, t0+1.5, decides)
    want = [0.0, 0.0001, 0.27, 0.0, 0.0, 0.0, 0.57, 0.0]
    np.testing.assert_allclose(pause, want, atol=1e-12)
    assert any("timed events" in n for n in notes)
    # without ITL tails the pause goes to the row holding the middle of its stamp's second (t0+3.5: the
    # row ending t0+4.3)
    got = _merge_view([(spine_inp, spine.drop(columns="itl_tail_floor_s")), (log_inp, log_rows)], False, [])
    np.testing.assert_allclose(got.sort_values("t_end_s")["host_pause_s"].to_numpy()[1:5], [0.0001, 0.0, 0.27, 0.0])


def test_timed_pauses_of_a_step_view_log_reach_the_scrape_intervals():
    """An SGLang log (or a vLLM log with iteration lines) goes to the step view; its GC lines' pauses still
    belong to the scrape intervals of the same server (``host_pause_s``, summed by their own stamps)."""
    from mixdiag.collectors.join import Input, Server, join_server
    from mixdiag.schema import Timeline
    t0 = 1.79e9
    ends = t0 + np.arange(1, 7, dtype=float) + 0.3
    scr = Timeline(pd.DataFrame({"instance": "s", "step": np.arange(6), "t_start_s": ends - 1.0, "t_end_s": ends,
                                 "granularity": "interval", "kind": "unknown", "itl_count": 50.0}), meta={})
    stamps = t0 + np.arange(0, 7, dtype=float)
    log = Timeline(pd.DataFrame({"instance": "l", "step": np.arange(7), "t_start_s": stamps, "t_end_s": stamps,
                                 "granularity": "step", "kind": "decode"}),
                   series=pd.DataFrame({"instance": "l", "name": "sglang_log:gc_pause_s", "labels": "generation=2",
                                        "t_s": [t0 + 4.0], "value": [0.312]}), meta={})
    srv = Server("srv", [Input("scrapes", "scrapes", "prom-text", scr), Input("s.log", "s.log", "sglang-log", log)],
                 rule="explicit")
    tl = join_server(srv)
    iv = tl.steps[tl.steps["granularity"] == "interval"].sort_values("t_end_s")
    # [t0+4, t0+5) straddles the t0+4.3 boundary, no ITL tails: the row holding t0+4.5 (ending t0+5.3) takes it
    np.testing.assert_allclose(iv["host_pause_s"].to_numpy(), [0.0, 0.0, 0.0, 0.0, 0.312, 0.0])


def test_os_stand_stills_take_the_longest_per_interval_and_land_on_the_steps_they_hit():
    """The host sampler's events (stops; each stamped at its end, value its length): an interval takes the longest
    one (a token waits through one stand-still; short ones do not add up for any token), a step row the seconds the
    events overlapped its own span - never an interval's whole sum lent to all its steps. Its CPU starvations are
    no evidence yet (no truth checks them): they fill nothing."""
    from types import SimpleNamespace

    from mixdiag.collectors.join_cells import fill_overlaps, fill_sums
    t0 = 1.79e9
    ser = pd.DataFrame({"instance": "host-pid7", "labels": "pid=7",
                        "name": ["host:stopped_s", "host:cpu_starved_s", "host:cpu_starved_s", "host:stopped_s",
                                 "host:stopped_s"],
                        "t_s": t0 + np.array([0.0, 1.40, 1.70, 1.95, 4.0]), "value": [0.0, 0.03, 0.04, 0.30, 0.0]})
    host = SimpleNamespace(given="h.csv", timeline=SimpleNamespace(series=ser, steps=None))
    ends = t0 + np.arange(1, 5, dtype=float)                     # intervals (t0+k-1, t0+k]
    iv = fill_sums(pd.DataFrame({"t_start_s": ends - 1.0, "t_end_s": ends}), host, [])
    np.testing.assert_allclose(iv["host_stopped_s"].to_numpy(), [0.0, 0.30, 0.0, 0.0])
    ser2 = ser.assign(name=["host:stopped_s", "host:stopped_s", "host:stopped_s", "host:stopped_s", "host:stopped_s"])
    two = SimpleNamespace(given="h.csv", timeline=SimpleNamespace(series=ser2, steps=None))
    iv2 = fill_sums(pd.DataFrame({"t_start_s": ends - 1.0, "t_end_s": ends}), two, [])
    np.testing.assert_allclose(iv2["host_stopped_s"].to_numpy(), [0.0, 0.30, 0.0, 0.0])   # the longest, not 0.37
    # steps of 50 ms over t0+1.5 .. t0+2.0: the 0.30 s stop (t0+1.65 .. t0+1.95) overlaps only the steps it hit
    a = t0 + 1.5 + 0.05 * np.arange(10)
    steps = pd.DataFrame({"t_start_s": a, "t_end_s": a + 0.05})
    got = fill_overlaps(steps, host, notes := [])["host_stopped_s"].to_numpy()
    want = [0.0, 0.0, 0.0, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.0]
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert any("placed by time" in n for n in notes)
    # a step clock of whole seconds cannot place them: left unmeasured, and said so
    coarse = pd.DataFrame({"t_start_s": t0 + np.arange(3.0), "t_end_s": t0 + np.arange(1.0, 4.0)})
    out = fill_overlaps(coarse, host, notes := [])
    assert "host_stopped_s" not in out.columns and any("coarser" in n for n in notes)
