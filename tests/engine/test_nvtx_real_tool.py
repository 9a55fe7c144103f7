"""The NVTX ranges as a real NVTX tool receives them (a tiny injection library, loaded like Nsight's)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

STEP_RE = re.compile(r"^step (?P<n>\d+) kind=(?P<kind>prefill|decode|mixed|idle) prefill_tokens=\d+ "
                     r"decode_reqs=\d+ decode_rows=\d+ graph=(?:FULL|PIECEWISE|NONE)(?: \w+=\S+)*$")

HERE = Path(__file__).resolve().parent

ENGINE_RUN = """
import json
from mixdiag.engine.config import EngineConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.telemetry.nvtx_tracer import NvtxTracer
from mixdiag.engine.core.request import SamplingParams
eng = Engine(EngineConfig(num_threads=1))
eng.tracer = NvtxTracer()
assert eng.tracer.nvtx_active, "the injected tool did not enable the domain"
for n in (40, 70):
    eng.add_request(list(range(2, 2 + n)), SamplingParams(max_tokens=4))
recs = eng.run()
print(json.dumps([dict(step=r.step, kind=r.kind, total=r.total_tokens, layers=eng.config.model.num_layers,
                       dense=eng.config.model.first_k_dense) for r in recs]))
"""


@pytest.fixture(scope="module")
def recorder(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (gcc/cc) to build the NVTX recorder tool; install gcc")
    so = tmp_path_factory.mktemp("nvtx") / "nvtx_recorder.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(HERE / "nvtx_recorder.c")], check=True)
    return so


def test_a_real_nvtx_tool_receives_the_contract(recorder, tmp_path):
    record = tmp_path / "nvtx.tsv"
    env = dict(os.environ, NVTX_INJECTION64_PATH=str(recorder), MIXDIAG_NVTX_RECORD=str(record))
    p = subprocess.run([sys.executable, "-c", ENGINE_RUN], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    steps = json.loads(p.stdout.strip().splitlines()[-1])
    events = [line.split("\t") for line in record.read_text().splitlines()]

    assert ["domain", "mixdiag"] in events
    categories = {int(e[2]): e[3] for e in events if e[0] == "category" and e[1] == "mixdiag"}
    stack, step_ranges, stats_ranges, inside = [], [], [], {}
    for e in events:
        if e[0] == "push":
            assert e[1] == "mixdiag"
            _, _, cat, ptype, payload, msg = e
            if msg.startswith("step "):
                assert categories[int(cat)] == "step" and ptype == "2"  # NVTX_PAYLOAD_TYPE_INT64
                step_ranges.append((msg, int(payload)))
            elif msg.startswith("step_stats "):   # post-forward values, after the step range
                assert categories[int(cat)] == "step" and ptype == "0" and not stack
                stats_ranges.append(msg)
            else:
                name = msg.split()[0]
                assert categories[int(cat)] == {"schedule": "host", "prepare_inputs": "host", "sample": "host",
                                                "forward": "forward", "attn": "forward", "moe": "forward",
                                                "kv_transfer": "transfer"}[name]
                assert ptype == "0" and payload == ""
                inside.setdefault(name, set()).add(stack[-1].split()[0] if stack else None)
            stack.append(msg)
        elif e[0] == "pop":
            stack.pop()
    assert stack == []  # balanced
    # one step range per non-idle step, text and payload as the contract says
    busy = [s for s in steps if s["kind"] != "idle"]
    assert len(step_ranges) == len(busy)
    for (msg, payload), s in zip(step_ranges, busy):
        m = STEP_RE.match(msg)
        assert m and int(m["n"]) == s["step"] and m["kind"] == s["kind"] and payload == s["total"]
    assert [int(m.split()[1]) for m in stats_ranges] == [s["step"] for s in busy]
    assert all(" preempted_reqs=" in m and " kv_transfer_bytes=" in m for m in stats_ranges)
    # nesting: schedule outside step; prepare_inputs/forward/sample in step; attn/moe in forward
    assert inside["schedule"] == {None}
    assert inside["prepare_inputs"] == inside["forward"] == inside["sample"] == {"step"}
    assert inside["attn"] == inside["moe"] == {"forward"}
    layers, dense = busy[0]["layers"], busy[0]["dense"]
    first = [e[5] for e in events if e[0] == "push"]
    first = first[first.index("forward") + 1:first.index("sample")]
    assert [t for t in first if t.startswith("attn")] == [f"attn L{i}" for i in range(layers)]
    assert [t for t in first if t.startswith("moe")] == [f"moe L{i}" for i in range(dense, layers)]
