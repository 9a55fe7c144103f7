"""Scenario files: the shipped ones load; bad files fail with one clear line."""
import pytest

from mixdiag.engine.testbed import scenario
from mixdiag.errors import UserError


@pytest.mark.parametrize("name,policy", [("steady-decode", "token_budget"), ("mixed-default", "token_budget"),
                                         ("prefill-first", "prefill_first")])
def test_shipped(name, policy):
    sc = scenario.load(name)
    assert sc.name == name and sc.engine.scheduler.policy == policy and sc.seed == 7
    assert sc.engine.model.num_layers == 4 and sc.workload.groups[0].count == 32
    assert name in scenario.available()
    assert sc.with_seed(3).engine.seed == 3 and sc.with_seed(3).seed == 3


def test_mixed_default_and_prefill_first_share_traffic():
    a, b = scenario.load("mixed-default"), scenario.load("prefill-first")
    assert a.workload == b.workload and a.engine.model == b.engine.model


GOOD = """
name = "t"
seed = 3
max_steps = 20
[model]
preset = "tiny"
num_layers = 2
[scheduler]
policy = "mix_running"
cudagraph_capture_sizes = [1, 2, 4]
[[workload.groups]]
count = 2
prompt_len = { dist = "fixed", value = 5 }
"""


def test_load_path_with_overrides(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text(GOOD)
    sc = scenario.load(str(p))
    assert (sc.name, sc.seed, sc.max_steps) == ("t", 3, 20)
    assert sc.engine.model.num_layers == 2 and sc.engine.model.hidden_size == 256
    assert sc.engine.scheduler.cudagraph_capture_sizes == (1, 2, 4)
    assert sc.workload.groups[0].prompt_len.value == 5


@pytest.mark.parametrize("text,match", [
    (GOOD.replace("num_layers = 2", "num_layerz = 2"), "unknown key.*num_layerz"),
    (GOOD.replace('policy = "mix_running"', 'policy = "fifo"'), "policy must be one of"),
    (GOOD.replace('preset = "tiny"', 'preset = "huge"'), "unknown model preset"),
    ("bogus = 1\n" + GOOD, "unknown top-level"),
    (GOOD.replace("count = 2", "count = 2\narrival = 'sometimes'"), "arrival must be"),
    (GOOD.replace('dist = "fixed"', 'dist = "fixed", mean = 3'), "unknown key.*mean"),
    ("name = [", "not valid TOML"),
    (GOOD.split("[[workload.groups]]")[0], "at least one"),
    (GOOD.replace("max_steps = 20", "max_steps = 0"), "max_steps"),
    (GOOD + "\n[faults.nonsense]\nx = 1\n", "unknown fault"),
])
def test_bad_files(tmp_path, text, match):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(UserError, match=match):
        scenario.load(str(p))


def test_unknown_name_lists_shipped():
    with pytest.raises(UserError, match="shipped scenarios: .*mixed-default"):
        scenario.load("no-such-scenario")
