"""The scenario suite: each fault scenario runs through ``mixdiag run`` and its truth.csv names the
causes it injected; EP imbalance and PD bytes are checked against what the run really did.

Fast tests truncate runs with ``--max-steps`` just past the first fault window; the full runs are
marked slow. How long a run takes is the machine's business, not a test's (a loaded machine is slower):
run times are measured in ``benchmarks/``, never asserted here.
"""
import json

import numpy as np
import pandas as pd
import pytest

from mixdiag.cli import main
from mixdiag.engine.testbed import scenario as scen
from mixdiag.engine.testbed.truth import read_truth
from mixdiag.engine.testbed.workload import generate

#: scenario -> {instance: causes truth.csv must name}
EXPECTED = {
    "host-stall": {"engine0": {"host_stall", "mixing"}},
    "ep-hotspot": {"engine0": {"ep_hotspot", "mixing"}},
    "graph-miss": {"engine0": {"graph_fallback", "mixing"}},
    "kv-pressure": {"engine0": {"kv_pressure", "mixing"}},
    "pd-transfer": {"engine0": {"pd_transfer", "mixing"}},
    "demo-mix": {"engine0": {"mixing", "pd_transfer", "graph_fallback", "ep_hotspot", "host_stall"}},
    "ep-kv-stall": {"engine0": {"ep_hotspot", "kv_pressure", "mixing", "pd_transfer", "host_stall"}},
    "two-engines": {"engine0": {"mixing", "kv_pressure"}, "engine1": {"mixing", "host_stall"}},
    "mixed-default": {"engine0": {"mixing"}},
    "prefill-first": {"engine0": {"prefill_stall"}},
}
#: truncation for the fast tests: enough steps for the first fault window to show
FAST_STEPS = {"host-stall": 75, "graph-miss": 70, "ep-hotspot": 62, "pd-transfer": 75, "kv-pressure": 150}
#: the core engine's scenarios (their run time is theirs to keep): truth checked on a truncated run
CORE_STEPS = {"mixed-default": 40, "prefill-first": 40}


def _run(name, out, max_steps=None):
    args = ["run", "--scenario", name, "--out", str(out), "-q", "--json"]
    if max_steps:
        args += ["--max-steps", str(max_steps)]
    assert main(args) == 0


def _causes(out):
    got = {}
    for inst, _, cause in read_truth(out / "truth.csv"):
        got.setdefault(inst, set()).add(cause)
    return got


def _steps(out):
    return pd.read_parquet(out / "steps.parquet")


def test_every_shipped_scenario_is_in_the_suite():
    assert set(EXPECTED) <= set(scen.available())
    for name in set(scen.available()) - set(EXPECTED):  # a scenario that injects faults must say what truth names
        assert not scen.load(name).faults, f"{name} injects faults: add it to EXPECTED"
    assert scen.load("two-engines").instances == 2 and scen.load("demo-mix").instances == 1


@pytest.mark.parametrize("name", sorted(FAST_STEPS))
def test_truncated_run_names_injected_cause(name, tmp_path, capsys):
    _run(name, tmp_path, FAST_STEPS[name])
    capsys.readouterr()
    got = _causes(tmp_path)
    fault = next(c for c in EXPECTED[name]["engine0"] if c != "mixing")
    assert fault in got["engine0"], got
    steps = _steps(tmp_path)
    if name == "ep-hotspot":
        _check_ep(steps, scen.load(name))
    if name == "pd-transfer":
        _check_pd(tmp_path, steps, scen.load(name))


def _check_ep(steps, sc):
    """Imbalance > 2 in the hotspot window, ~1 outside; the window's steps are slower."""
    (a, b), *_ = sc.faults["ep_hotspot"]["windows"]
    dec = steps[steps["kind"] == "decode"]
    inside = dec[(dec["step"] >= a) & (dec["step"] < b)]
    outside = dec[dec["step"] < a]
    assert len(inside) and len(outside)
    assert inside["expert_imbalance"].min() > 2.0
    assert outside["expert_imbalance"].median() < 1.3
    dur = steps["t_end_s"] - steps["t_start_s"]
    assert dur[inside.index].median() > 1.3 * dur[outside.index].median()


def _check_pd(out, steps, sc):
    """Each PD step moved exactly the KV of the prompts installed in it ((n-1) tokens each)."""
    cfg = sc.engine.model
    prompts = {it.request_id: len(it.prompt) for it in generate(sc.workload, sc.seed, cfg.vocab_size,
                                                                 cfg.max_model_len)}
    tok = pd.read_parquet(out / "tokens.parquet")
    first = tok[tok["is_first"] == 1]
    pd_steps = steps[steps["kv_transfer_bytes"] > 0]
    assert len(pd_steps)
    for _, r in pd_steps.iterrows():
        rids = [x for x in first.loc[first["step"] == r["step"], "request_id"] if x.startswith("long-")]
        assert rids
        assert r["kv_transfer_bytes"] == sum((prompts[x] - 1) * cfg.kv_bytes_per_token for x in rids)
        assert r["kv_transfer_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORE_STEPS))
def test_core_scenario_truth(name, tmp_path, capsys):
    _run(name, tmp_path, CORE_STEPS[name])
    capsys.readouterr()
    assert EXPECTED[name]["engine0"] <= _causes(tmp_path)["engine0"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(EXPECTED) - set(CORE_STEPS)))
def test_full_run_names_every_injected_cause(name, tmp_path, capsys):
    _run(name, tmp_path)
    summary = json.loads(capsys.readouterr().out)
    got = _causes(tmp_path)
    for inst, causes in EXPECTED[name].items():
        assert causes <= got.get(inst, set()), (inst, got)
    steps = _steps(tmp_path)
    assert set(steps["instance"]) == set(EXPECTED[name])
    if name == "ep-hotspot":
        _check_ep(steps, scen.load(name))
        (a, b), (c, d) = scen.load(name).faults["ep_hotspot"]["windows"]
        hot = steps[(steps["step"].between(c, d - 1)) & (steps["kind"] == "decode")]
        assert hot["expert_imbalance"].min() > 2.0
    if name == "pd-transfer":
        _check_pd(tmp_path, steps, scen.load(name))
    if name == "two-engines":
        assert set(summary["instances"]) == {"engine0", "engine1"}
        assert np.isfinite(steps["t_start_s"]).all()
