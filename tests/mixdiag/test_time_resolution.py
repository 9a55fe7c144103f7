"""A source's stamp resolution and sampling bound what it can claim: SGLang logs stamp whole seconds
and print one Decode line per 40 forwards, so the gaps between lines (1-2 s) say nothing about a
~34 ms token latency or time between forwards - no latency verdict is read from them, none reaches 0.8."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.config import AttributionConfig
from mixdiag.diagnosis.detection.signals import stamp_resolution


def _stamp(t: float, ms: bool) -> str:
    d = dt.datetime.fromtimestamp(1_796_000_000 + t, dt.timezone.utc)
    return d.strftime("[%Y-%m-%d %H:%M:%S") + (f".{d.microsecond // 1000:03d}]" if ms else "]")


def _sglang_log(seed: int, ms: bool = False, n_fwd: int = 4000, itl: float = 0.034, every: int = 40) -> str:
    """An SGLang scheduler log of a server decoding 32 requests at ~34 ms per forward, a Decode line
    every ``every`` forwards, a rare prefill batch (no mixed chunk)."""
    rng = np.random.default_rng(seed)
    lines = [f"{_stamp(0, ms)} server_args=ServerArgs(model_path='m', chunked_prefill_size=2048, "
             f"enable_mixed_chunk=False, decode_log_interval={every}, disable_cuda_graph=False)"]
    t, n_dec, t_last = 0.0, 0, 0.0
    for _ in range(n_fwd):
        if rng.random() < 0.001:
            t += 0.15
            lines.append(f"{_stamp(t, ms)} Prefill batch, #new-seq: 1, #new-token: 2048, #cached-token: 0, token usage: "
                         "0.10, #running-req: 32, #queue-req: 0, cuda graph: False, input throughput (token/s): 20000.00")
            continue
        t += itl * rng.uniform(0.95, 1.05)
        n_dec += 1
        if n_dec % every == 0:
            lines.append(f"{_stamp(t, ms)} Decode batch, #running-req: 32, #token: 9000, token usage: 0.10, cuda graph: "
                         f"True, gen throughput (token/s): {32 * every / (t - t_last):.2f}, #queue-req: 0")
            t_last = t
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_second_stamps_never_give_a_latency_cause_at_08(seed, tmp_path):
    p = tmp_path / "sglang.log"
    p.write_text(_sglang_log(seed))
    d = diagnose(load(str(p)))
    sp = d.spikes
    assert (d.steps["stamp_resolution_s"] == 1.0).all()
    # the Decode lines are 1.4 s apart and never overlap, but their whole-second stamps are coarser than the
    # ~34 ms forward their gen throughput states: the gaps are no latency, so no wait is read from them (before,
    # every window's stamp gap was a host_stall, capped at 0.5) - the windows' own mean step time is the latency
    assert not (sp["cause"] == "host_stall").any(), sp[["cause", "confidence"]]
    assert (sp["confidence"] < 0.8).all()
    stalls = sp[sp["cause"] == "host_stall"]
    assert (stalls["confidence"] <= AttributionConfig().resolution_cap).all()


def test_stamp_resolution_per_instance():
    df = pd.DataFrame({"t_start_s": [1.7e9 + 1, 1.7e9 + 2, 5.123, 5.1234, 3.5, 3.7, 2.25, 2.5],
                       "t_end_s": [1.7e9 + 1, 1.7e9 + 3, 5.2, 5.3, 3.6, 3.9, 2.5, 2.75]})
    got = stamp_resolution(df, np.array([0, 0, 1, 1, 2, 2, 3, 3])).tolist()
    assert got == [1.0, 1.0, 0.0, 0.0, 0.1, 0.1, 0.01, 0.01]


def test_millisecond_stamps_are_read_as_such(tmp_path):
    p = tmp_path / "sglang.log"
    p.write_text(_sglang_log(0, ms=True))
    d = diagnose(load(str(p)))
    assert (d.steps["stamp_resolution_s"] == 0.001).all()
    assert not any(e.get("latency_below_resolution") for e in d.spikes["evidence"])
