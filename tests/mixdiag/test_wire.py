"""mixdiag.wire: the engine's range messages and metric names round-trip through the parsers."""
import math

import pytest

from mixdiag import wire

STEP_CASES = [
    # (format args, extra, expected text)
    ((3, "mixed", 128, 4, 4, "PIECEWISE"), {},
     "step 3 kind=mixed prefill_tokens=128 decode_reqs=4 decode_rows=4 graph=PIECEWISE"),
    ((0, "decode", 0, 8, 16, "FULL"), {"spec": 2},
     "step 0 kind=decode prefill_tokens=0 decode_reqs=8 decode_rows=16 graph=FULL spec=2"),
]


@pytest.mark.parametrize("args,extra,text", STEP_CASES)
def test_format_step_matches_contract_and_parses_back(args, extra, text):
    assert wire.format_step(*args, **extra) == text
    msg = wire.parse_step_message(text)
    assert (msg.step, msg.kind, msg.prefill_tokens, msg.decode_reqs, msg.decode_rows, msg.graph) == args
    assert msg.extra == {k: str(v) for k, v in extra.items()}


@pytest.mark.parametrize("text,expect", [
    ("step 7 kind=prefill graph=none later=1", {"step": 7, "kind": "prefill", "graph": "NONE", "extra": {"later": "1"}}),
    ("  step 2 decode_rows=x kind=weird", {"step": 2, "decode_rows": None, "kind": "unknown"}),
    ("step_stats 3 preempted_reqs=0", None),
    ("stepping 3", None),
    ("", None),
    (None, None),
])
def test_parse_step_message_is_lenient(text, expect):
    msg = wire.parse_step_message(text, kinds=("prefill", "decode", "mixed", "idle"), graphs=("FULL", "PIECEWISE", "NONE"))
    if expect is None:
        assert msg is None
    else:
        for k, v in expect.items():
            assert getattr(msg, k) == v, k


@pytest.mark.parametrize("args,text", [
    ((5, 2, 4096.0), "step_stats 5 preempted_reqs=2 kv_transfer_bytes=4096"),
    ((6, 0, 0, 1.234567, [10, 3]), "step_stats 6 preempted_reqs=0 kv_transfer_bytes=0 expert_imbalance=1.235 "
                                   "per_rank_tokens=10,3"),
])
def test_format_step_stats_round_trip(args, text):
    assert wire.format_step_stats(*args) == text
    st = wire.parse_step_stats(text + " new_field=9")
    assert st.step == args[0] and st.preempted_reqs == args[1] and st.kv_transfer_bytes == args[2]
    assert st.extra == {"new_field": "9"}
    if len(args) > 3:
        assert math.isclose(st.expert_imbalance, 1.235) and st.per_rank_tokens == (10, 3)
    else:
        assert st.expert_imbalance is None and st.per_rank_tokens is None


def test_parse_step_stats_rejects_other_texts_and_bad_fields():
    assert wire.parse_step_stats("step 5 kind=decode") is None
    st = wire.parse_step_stats("step_stats 1 preempted_reqs=abc per_rank_tokens=1,,2")
    assert st.preempted_reqs is None and st.per_rank_tokens is None


def test_layer_ranges_and_metric_names():
    assert wire.layer_range(wire.ATTN, 3) == "attn L3" and wire.layer_range(wire.MOE, 0) == "moe L0"
    assert wire.counter_family(wire.STEPS_TOTAL) == "mixdiag_engine_steps"
    assert wire.counter_family(wire.KV_USAGE_RATIO) == wire.KV_USAGE_RATIO
    names = [v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and v.startswith("mixdiag_engine_")]
    assert len(names) == len(set(names)) == 19


def test_engine_registers_exactly_the_wire_names():
    from mixdiag.engine.telemetry.metrics import EngineMetrics

    families = {fam.name for fam in EngineMetrics().registry.collect()}
    wire_names = {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and v.startswith("mixdiag_engine_")}
    assert families == {wire.counter_family(n) for n in wire_names}
