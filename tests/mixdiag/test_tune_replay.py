"""The replay drives the engine's real schedulers: it reproduces a recorded run's step sequence exactly
when given that run's arrivals and true step costs (the acceptance test), and hand-checked timings."""
import pytest

from mixdiag.engine.core.config import CacheConfig, SchedulerConfig
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
