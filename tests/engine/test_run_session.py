"""testbed.session: ``run_scenario`` as a library call (what ``mixdiag run`` and multi-instance runs call)."""
import json

import pytest

from mixdiag.engine.telemetry.instrumentation import InstrumentationConfig
from mixdiag.engine.testbed.session import RunRequest, RunResult, run_scenario
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

SMALL = """
name = "small"
seed = 3
max_steps = 40
{instances}
[engine]
num_threads = 1
[model]
preset = "tiny"
num_layers = 2
hidden_size = 64
intermediate_size = 128
moe_intermediate_size = 64
[scheduler]
max_num_batched_tokens = 64
[[workload.groups]]
count = 3
prompt_len = {{ dist = "uniform", low = 8, high = 20 }}
output_len = {{ dist = "fixed", value = 6 }}
"""


def scenario(tmp_path, instances=1):
    p = tmp_path / "small.toml"
    p.write_text(SMALL.format(instances=f"instances = {instances}"))
    return str(p)


@pytest.mark.parametrize("kw,msg", [
    ({"max_steps": 0}, "--max-steps"),
    ({"scenario": ""}, "scenario"),
    ({"instance": ""}, "--instance"),
])
def test_request_is_validated(tmp_path, kw, msg):
    with pytest.raises(UserError, match=msg):
        RunRequest(**{"scenario": "steady-decode", "out": tmp_path / "r", **kw})


def test_request_is_frozen(tmp_path):
    r = RunRequest("steady-decode", str(tmp_path / "r"))
    assert r.out == tmp_path / "r"
    with pytest.raises(AttributeError):
        r.seed = 4


def test_refuses_a_non_empty_out_before_running(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "keep").write_text("x")
    with pytest.raises(UserError, match="already holds files"):
        run_scenario(RunRequest(scenario(tmp_path), tmp_path / "r"))


def test_single_run_result_matches_summary_json(tmp_path):
    notes = []
    res = run_scenario(RunRequest(scenario(tmp_path), tmp_path / "r", seed=5, max_steps=30), note=notes.append)
    assert isinstance(res, RunResult) and not res.merged
    assert (res.scenario, res.seed, res.instances) == ("small", 5, ("engine0",))
    assert res.summary == json.loads((tmp_path / "r" / "summary.json").read_text())
    assert res.summary["steps"] <= 30 and res.summary["requests"]["submitted"] == 3
    assert Timeline.load(tmp_path / "r").meta["seed"] == 5 and notes == []


def test_multi_instance_runs_in_spawned_processes_and_merges(tmp_path):
    out = tmp_path / "r"
    notes = []
    req = RunRequest(scenario(tmp_path, instances=2), out, instrumentation=InstrumentationConfig(log_formats=("vllm",)))
    res = run_scenario(req, note=notes.append)
    assert res.merged and res.instances == ("engine0", "engine1") and len(notes) == 1
    for i, name in enumerate(res.instances):
        sub = out / "instances" / name
        assert (sub / "engine.log").exists() and (sub / "truth.csv").exists()
        assert res.summary["instances"][name]["seed"] == 3 + i
    assert res.summary == json.loads((out / "summary.json").read_text())
    tl = Timeline.load(out)
    assert set(tl.steps["instance"]) == {"engine0", "engine1"} and tl.meta["instances"] == ["engine0", "engine1"]
    assert res.summary["steps"] == len(tl.steps)


def test_a_failing_instance_is_a_one_line_user_error(tmp_path):
    import socket

    with socket.socket() as taken:  # engine0 serves /metrics on PORT + 0: make that port busy
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        req = RunRequest(scenario(tmp_path, instances=2), tmp_path / "r",
                         instrumentation=InstrumentationConfig(serve_port=port))
        with pytest.raises(UserError, match=r"^instance engine0 failed: cannot serve /metrics") as e:
            run_scenario(req)
    assert "\n" not in str(e.value)
