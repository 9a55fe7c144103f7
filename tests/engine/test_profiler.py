"""ProfileWindow: START:STOP parsing, the half-open window, Kineto JSON holding the step ranges."""
import json

import pytest
import torch

from mixdiag.engine.telemetry.nvtx_tracer import NvtxTracer, step_message
from mixdiag.engine.telemetry.profiler import ProfileWindow, parse_window
from mixdiag.engine.core.records import StepRecord
from mixdiag.errors import UserError


@pytest.mark.parametrize("spec,expected", [("20:60", (20, 60)), (" 0 : 3 ", (0, 3)), ("5:", (5, None)),
                                           ("all", (0, None))])
def test_parse_window(spec, expected):
    assert parse_window(spec) == expected


@pytest.mark.parametrize("spec", ["60:20", "5:5", "20", "a:b", "", "-1:3"])
def test_parse_window_rejects(spec):
    with pytest.raises(UserError):
        parse_window(spec)


def fake_engine_run(window, n_steps, first=0):
    """Steps that do a little torch work inside tracer ranges, reporting records like the engine."""
    tracer = NvtxTracer()
    window.begin(first)
    for i in range(first, first + n_steps):
        msg = step_message(i, "decode", 0, 2, 2, "FULL")
        with tracer.range("step", msg, 2):
            with tracer.range("forward"):
                torch.ones(8, 8) @ torch.ones(8, 8)
        window(StepRecord(step=i, t_start_s=0.0, t_end_s=0.0, kind="decode", decode_reqs=2, decode_rows=2))
    return window.close()


def step_names(path):
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(int(e["name"].split()[1]) for e in events if str(e.get("name", "")).startswith("step "))


@pytest.mark.parametrize("start,stop,first,n,expected,partial", [
    (2, 5, 0, 8, [2, 3, 4], False),
    (0, 2, 0, 5, [0, 1], False),
    (3, 10, 0, 6, [3, 4, 5], True),     # run ends inside the window: what was recorded, flagged
    (1, 3, 1, 4, [1, 2], False),        # engine numbering starting at 1
    (2, None, 0, 5, [2, 3, 4], False),  # open-ended: to the end of the run, complete
])
def test_window_records_exactly_its_steps(tmp_path, start, stop, first, n, expected, partial):
    w = ProfileWindow(start, stop, tmp_path / "trace.json", cuda=False)
    out = fake_engine_run(w, n, first)
    assert out == tmp_path / "trace.json"
    assert step_names(out) == expected and w.steps_recorded == expected and w.partial is partial
    assert not w.recording and not torch._C._autograd._profiler_enabled()


def test_window_after_the_run_writes_nothing(tmp_path):
    w = ProfileWindow(50, 60, tmp_path / "trace.json", cuda=False)
    assert fake_engine_run(w, 5) is None and not (tmp_path / "trace.json").exists()


def test_refuses_existing_trace(tmp_path):
    (tmp_path / "trace.json").write_text("{}")
    with pytest.raises(UserError):
        ProfileWindow(0, 2, tmp_path / "trace.json")


def test_light_trace_keeps_ranges_drops_ops(tmp_path):
    full = fake_engine_run(ProfileWindow(0, 3, tmp_path / "full.json", cuda=False), 3)
    light = fake_engine_run(ProfileWindow(0, 3, tmp_path / "light.json", cuda=False, ops=False), 3)
    cats = {e.get("cat") for e in json.loads(light.read_text())["traceEvents"]}
    assert "cpu_op" in {e.get("cat") for e in json.loads(full.read_text())["traceEvents"]}
    assert "cpu_op" not in cats and "user_annotation" in cats
    assert step_names(light) == step_names(full) == [0, 1, 2]
    assert light.stat().st_size < full.stat().st_size and not list(tmp_path.glob("*.tmp"))
