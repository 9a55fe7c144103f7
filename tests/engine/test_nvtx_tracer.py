"""NvtxTracer: contract naming, NVTX push/pop with categories and payloads, Kineto mirroring, no-op cost path."""
import json
import re

import pytest
import torch

from mixdiag.engine.telemetry import nvtx_tracer
from mixdiag.engine.hooks import Tracer, step_stats_message
from mixdiag.engine.telemetry.nvtx_tracer import CATEGORIES, NvtxTracer, step_message
from mixdiag.engine.core.records import StepRecord

STEP_RE = re.compile(r"^step (?P<n>\d+) kind=(?P<kind>prefill|decode|mixed|idle) prefill_tokens=(?P<p>\d+) "
                     r"decode_reqs=(?P<dr>\d+) decode_rows=(?P<rows>\d+) graph=(?P<g>FULL|PIECEWISE|NONE)"
                     r"(?P<extra>(?: \w+=\S+)*)$")


class RecordingDomain:
    """An nvtx-Domain-shaped sink that keeps what a tool would receive (push/pop order, attributes)."""

    def __init__(self):
        self.events = []

    def get_event_attributes(self, message=None, color=None, category=None, payload=None):
        return {"message": message, "color": color, "category": category, "payload": payload}

    def push_range(self, attrs):
        self.events.append(("push", dict(attrs)))

    def pop_range(self):
        self.events.append(("pop", None))


def test_is_a_tracer():
    assert isinstance(NvtxTracer(), Tracer)


@pytest.mark.parametrize("kw,extra,expected", [
    (dict(step=7, kind="mixed", prefill_tokens=480, decode_reqs=32, decode_rows=32, graph="PIECEWISE"), {},
     "step 7 kind=mixed prefill_tokens=480 decode_reqs=32 decode_rows=32 graph=PIECEWISE"),
    (dict(step=0, kind="decode", prefill_tokens=0, decode_reqs=4, decode_rows=8, graph="FULL"), {"bucket": 8},
     "step 0 kind=decode prefill_tokens=0 decode_reqs=4 decode_rows=8 graph=FULL bucket=8"),
])
def test_step_message_follows_contract(kw, extra, expected):
    msg = step_message(**kw, **extra)
    assert msg == expected
    m = STEP_RE.match(msg)
    assert m and int(m["n"]) == kw["step"] and m["kind"] == kw["kind"]


@pytest.mark.parametrize("fields,expected", [
    (dict(preempted_reqs=2, kv_transfer_bytes=64512.0), "step_stats 5 preempted_reqs=2 kv_transfer_bytes=64512"),
    (dict(per_rank_tokens=[0, 24], expert_imbalance=2.0),
     "step_stats 5 preempted_reqs=0 kv_transfer_bytes=0 expert_imbalance=2 per_rank_tokens=0,24"),
    (dict(per_rank_tokens=[7, 3, 2], expert_imbalance=7 / 4),
     "step_stats 5 preempted_reqs=0 kv_transfer_bytes=0 expert_imbalance=1.75 per_rank_tokens=7,3,2"),
])
def test_step_stats_message_follows_contract(fields, expected):
    rec = StepRecord(step=5, t_start_s=0.0, t_end_s=0.0, kind="decode", **fields)
    assert step_stats_message(rec) == expected


def test_recording_only_with_a_tool_or_an_active_profiler():
    t = NvtxTracer()
    assert not t.recording()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert t.recording() and not NvtxTracer(kineto=False).recording()
    assert not t.recording()


def test_step_stats_texts_are_not_cached_as_fixed():
    assert not nvtx_tracer.message_is_fixed("step_stats", "step_stats 1 preempted_reqs=0")
    assert nvtx_tracer.message_is_fixed("schedule", "schedule")


def test_no_tool_no_profiler_is_the_shared_noop():
    t = NvtxTracer()  # no NVTX tool attached in tests: nvtx hands out a dummy domain
    assert not t.nvtx_active
    assert t.range("step", "step 1 kind=decode", 32) is t.range("schedule")


def test_ranges_reach_nvtx_with_category_and_payload():
    dom = RecordingDomain()
    t = NvtxTracer(domain=dom, kineto=False)
    assert t.nvtx_active
    with t.range("step", step_message(3, "decode", 0, 2, 2, "FULL"), payload=2):
        with t.range("schedule"):
            pass
        with t.range("forward"):
            with t.range("attn", "attn L0"):
                pass
            with t.range("moe", "moe L1"):
                pass
        with t.range("kv_transfer"):
            pass
    kinds = [e[0] for e in dom.events]
    assert kinds == ["push", "push", "pop", "push", "push", "pop", "push", "pop", "pop", "push", "pop", "pop"]
    pushes = [e[1] for e in dom.events if e[0] == "push"]
    assert [p["message"] for p in pushes] == [
        "step 3 kind=decode prefill_tokens=0 decode_reqs=2 decode_rows=2 graph=FULL",
        "schedule", "forward", "attn L0", "moe L1", "kv_transfer"]
    assert [p["category"] for p in pushes] == ["step", "host", "forward", "forward", "forward", "transfer"]
    assert pushes[0]["payload"] == 2 and isinstance(pushes[0]["payload"], int)
    assert all(p["payload"] is None for p in pushes[1:])
    assert set(CATEGORIES) >= {"step", "schedule", "prepare_inputs", "forward", "attn", "moe", "sample", "kv_transfer"}


def test_disabled_tracer_emits_nothing_even_with_a_tool():
    dom = RecordingDomain()
    t = NvtxTracer(domain=dom, enabled=False)
    with t.range("step", "step 1 kind=decode", 1):
        pass
    assert dom.events == []


def test_kineto_ranges_mirror_nvtx_strings(tmp_path):
    t = NvtxTracer()
    msg = step_message(5, "mixed", 16, 2, 2, "PIECEWISE")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with t.range("step", msg, 18):
            with t.range("forward"):
                with t.range("attn", "attn L0"):
                    torch.ones(4) @ torch.ones(4)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert {msg, "forward", "attn L0"} <= names
    # outside the profiler the tracer is back on the no-op path
    assert t.range("forward") is nvtx_tracer._NULL
