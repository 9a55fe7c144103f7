"""The replay drives the engine's real schedulers: it reproduces a recorded run's step sequence exactly
when given that run's arrivals and true step costs (the acceptance test), and hand-checked timings."""
import numpy as np
import pandas as pd
import pytest

from mixdiag.engine.config import CacheConfig, SchedulerConfig
from mixdiag.engine.testbed.session import RunRequest, run_scenario
from mixdiag.schema import Timeline
from mixdiag.tuning import cost_model, sweep, traffic
from mixdiag.tuning.replay import RecordedTiming, ModelTiming, replay
from mixdiag.tuning.traffic import RequestSpec

from helpers.tune_scenario import SCENARIO


def record(tmp_path_factory, policy: str) -> Timeline:
    d = tmp_path_factory.mktemp(policy)
    (d / "s.toml").write_text(SCENARIO.format(policy=policy))
    run_scenario(RunRequest(scenario=str(d / "s.toml"), out=d / "run"))
    return Timeline.load(d / "run")


@pytest.fixture(scope="module")
def recorded_runs(tmp_path_factory):
    return {p: record(tmp_path_factory, p) for p in ("token_budget", "mix_running", "prefill_first")}


@pytest.mark.parametrize("policy", ["token_budget", "mix_running", "prefill_first"])
def test_replay_reproduces_recorded_step_sequence(recorded_runs, policy):
    tl = recorded_runs[policy]
    wl = traffic.from_timeline(tl)
    assert wl.quality == {"arrivals": "measured", "prompt_tokens": "measured", "output_tokens": "measured"}
    rows = cost_model.step_rows(tl.steps)
    sched, cache, mml = sweep.base_config(tl, rows, {}, [])
    assert sched.policy == policy
    res = replay(list(wl.requests), RecordedTiming(rows["t_start_s"], rows["t_end_s"], wl.requests[0].arrival_s),
                 sched, cache, mml, keep_steps=True)
    want = list(zip(rows["kind"], rows["prefill_tokens"].astype(int), rows["decode_rows"].astype(int)))
    assert {k for k, _, _ in want} >= {"prefill", "decode"}
    assert res.steps == want
    assert res.output_tokens == int(tl.tokens["n_tokens"].sum())


def test_replay_timing_by_hand():
    # one request, prompt 100, 5 outputs, budget 64, every step 10 ms + 1 ms gap:
    # steps 64 | 36 (first token at 10 ms) | 4 decodes each 11 ms later
    class Flat:
        gap_s = 0.001

        def step_s(self, shape):
            return 0.010

    res = replay([RequestSpec("a", 5.0, 100, 5)], ModelTiming(Flat()),
                 SchedulerConfig(max_num_batched_tokens=64), CacheConfig(), 4096, keep_steps=True)
    assert res.steps == [("prefill", 64, 0), ("prefill", 36, 0)] + [("decode", 0, 1)] * 4
    assert res.ttft_s.tolist() == pytest.approx([0.021])
    assert res.itl_s.tolist() == pytest.approx([0.011] * 4)
    assert res.metrics()["steps"] == 6


def test_replay_arrival_during_idle_jumps_clock():
    class Flat:
        gap_s = 0.0

        def step_s(self, shape):
            return 0.5

    reqs = [RequestSpec("a", 0.0, 10, 2), RequestSpec("b", 100.0, 10, 2)]
    res = replay(reqs, ModelTiming(Flat()), SchedulerConfig(), CacheConfig(), 4096)
    assert res.ttft_s.tolist() == [0.5, 0.5]           # b waits for nothing: the clock jumped to it
    assert res.makespan_s == pytest.approx(101.0)


def test_ttft_from_admission_leaves_out_the_step_in_flight():
    # b arrives 0.2 s into a's 1 s step: from arrival its TTFT includes the 0.8 s left of that
    # step; from admission (the engine stamps it between steps) it does not
    class Flat:
        gap_s = 0.0

        def step_s(self, shape):
            return 1.0

    reqs = [RequestSpec("a", 0.0, 10, 3), RequestSpec("b", 0.2, 10, 1)]
    late = replay(reqs, ModelTiming(Flat()), SchedulerConfig(), CacheConfig(), 4096)
    stamped = replay(reqs, ModelTiming(Flat()), SchedulerConfig(), CacheConfig(), 4096, ttft_from_admission=True)
    assert sorted(late.ttft_s.tolist()) == pytest.approx([1.0, 1.8])
    assert sorted(stamped.ttft_s.tolist()) == pytest.approx([1.0, 1.0])


def test_model_timing_replays_residual_runs_in_recorded_order():
    # prefill-class residuals 1.0, 1.1, ..., 1.9 (recorded order): consecutive prefill steps of the
    # replay take consecutive ratios (a block), decode steps draw from their own class
    ratios = [1.0 + 0.1 * k for k in range(10)]
    cost = cost_model.FittedCost((0.01, 0, 0, 0, 0, 0), 0.0, 0.001, 1.0, 0.0, 20, "x",
                                 jitter=(((1.0, 0.01),) * 10, tuple((r, 0.01) for r in ratios)))
    t = ModelTiming(cost, seed=3)
    pre = [t(i, cost_model.StepShape(100, 0))[0] / 0.01 for i in range(5)]
    dec = [t(i, cost_model.StepShape(0, 4))[0] for i in range(5)]
    steps = np.round(np.diff(pre), 6)
    assert set(steps.tolist()) <= {0.1, -0.9}          # +0.1 each step, wrapping at the end of the record
    assert dec == pytest.approx([0.01] * 5)


def test_short_inputs_are_replayed_under_several_seeds():
    from mixdiag.tuning.replay import MAX_REPLICATES, replicates

    assert replicates(100) == MAX_REPLICATES and replicates(20_000) == 1
    assert replicates(500) == 4


def test_arrival_stamps_between_steps_are_admissions():
    rows = pd.DataFrame({"t_start_s": [0.0, 1.0, 2.0, 3.0], "t_end_s": [0.9, 1.9, 2.9, 3.9]})

    def wl(arrivals):
        return traffic.Workload(tuple(RequestSpec(f"r{i}", a, 10, 2) for i, a in enumerate(arrivals)),
                                "token events", {"arrivals": "measured"})

    assert traffic.stamped_between_steps(wl([0.95, 1.95, 2.95]), rows)
    assert not traffic.stamped_between_steps(wl([0.95, 1.5, 2.95]), rows)      # one arrived mid-step
    inferred = traffic.Workload(wl([0.95, 1.95, 2.95]).requests, "token events", {"arrivals": "inferred"})
    assert not traffic.stamped_between_steps(inferred, rows)
