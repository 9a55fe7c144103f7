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
