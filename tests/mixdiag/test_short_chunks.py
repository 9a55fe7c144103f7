"""A prompt chunk below the roofline ridge (``AttributionConfig.chunk_min_tokens``) costs about one decode
pass: an SGLang Decode line's window (the mean over the forwards since the previous one) is called mixing
from the mixed Prefill lines inside it only when one of them computed at least that many new tokens."""
from __future__ import annotations

import datetime as dt

import pytest

from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(1_796_000_000 + t, dt.timezone.utc).strftime("[%Y-%m-%d %H:%M:%S]")


def _log(new_tokens: int, slow_window: int = 30, every: int = 10, windows: int = 60) -> str:
    """SGLang with mixed chunk: 16 requests decode at 30 ms per forward, a Decode line every ``every``
    forwards; in window ``slow_window`` a mixed Prefill batch of ``new_tokens`` runs and the window's
    forwards average 90 ms (the gen throughput says so)."""
    lines = [f"{_stamp(0)} server_args=ServerArgs(model_path='m', chunked_prefill_size=2048, "
             f"enable_mixed_chunk=True, decode_log_interval={every}, disable_cuda_graph=False)"]
    t = 0.0
    for w in range(windows):
        step = 0.09 if w == slow_window else 0.03
        if w == slow_window:
            lines.append(f"{_stamp(t + 0.1)} Prefill batch, #new-seq: 1, #new-token: {new_tokens}, #cached-token: 0, "
                         "token usage: 0.10, #running-req: 16, #queue-req: 0, input throughput (token/s): 9000.00")
        t += every * step
        lines.append(f"{_stamp(t)} Decode batch, #running-req: 16, #token: 4000, token usage: 0.10, cuda graph: True, "
                     f"gen throughput (token/s): {16 / step:.2f}, #queue-req: 0")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("new_tokens, mixing", [(2048, True), (512, True), (256, True), (120, False), (16, False)])
def test_log_window_names_mixing_only_for_a_chunk_past_the_ridge(new_tokens, mixing, tmp_path):
    p = tmp_path / "sglang.log"
    p.write_text(_log(new_tokens))
    sp = diagnose(load(str(p))).spikes
    assert len(sp)  # the slow window spikes either way
    assert ((sp["cause"] == "mixing").any()) == mixing


def test_a_window_spike_spans_its_window(tmp_path):
    """The slow Decode line's height is the mean over the forwards since the previous Decode line, so its
    spike spans that window - from the previous line's stamp to one stamp resolution past its own (stamps
    are whole seconds, truncated): the mixed Prefill line inside it lies within the spike, not before it."""
    p = tmp_path / "sglang.log"
    p.write_text(_log(2048, every=40))
    tl = load(str(p))
    st = tl.steps.sort_values("t_end_s")
    dec = st[st["kind"] == "decode"]["t_end_s"].to_numpy()
    pre = float(st.loc[st["kind"] == "mixed", "t_end_s"].iloc[0])
    sp = diagnose(tl).spikes
    mix = sp[sp["cause"] == "mixing"].iloc[0]
    prev = dec[dec < mix["t_s"]].max()
    assert (mix["t_start_s"], mix["t_end_s"]) == (prev, mix["t_s"] + 1.0)
    assert mix["t_start_s"] <= pre <= mix["t_end_s"]


@pytest.mark.parametrize("running, stalled", [(0.0, False), (16.0, True), (float("nan"), True)])
def test_a_prefill_line_says_whether_decodes_waited(running, stalled):
    """SGLang's Prefill line states the running batch (``#running-req``): 0 means no decode waited through it,
    whatever decode rows came before; only a row without the count falls back on those rows."""
    import pandas as pd

    from mixdiag.diagnosis.detection.log_windows import stalled_prefill_rows
    rows = pd.DataFrame({"has_prefill": [True], "has_decode": [False], "decodes_before": [True],
                         "running_reqs": [running]})
    assert bool(stalled_prefill_rows(rows).iat[0]) == stalled
