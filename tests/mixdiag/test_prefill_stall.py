"""prefill_stall only where running decodes got no token during the prefill: vLLM V1 runs a
prefill-only step only when nothing decodes (a lone chunk stalls nobody); SGLang without mixed chunk
runs a prefill batch alone while its decode batch waits."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline

STEP_S = 0.020


def _run(plan, tokens: bool) -> Timeline:
    """Step rows from ``plan``: (kind, decoding request ids, prefill request ids, duration); with
    ``tokens``, a token event for each decoding request at its step's end."""
    rows, toks, t = [], [], 100.0
    for s, (kind, dec, pre, dur) in enumerate(plan):
        t0 = t + 0.001
        t = t0 + dur
        rows.append(dict(instance="e", step=s, t_start_s=t0, t_end_s=t, granularity="step", kind=kind,
                         prefill_tokens=512.0 * len(pre), prefill_reqs=float(len(pre)), decode_rows=float(len(dec)),
                         decode_reqs=float(len(dec)), graph_mode="FULL" if kind == "decode" else "PIECEWISE"))
        toks += [dict(instance="e", request_id=r, t_s=t, n_tokens=1, step=float(s)) for r in dec]
    return Timeline(pd.DataFrame(rows), pd.DataFrame(toks) if tokens else None, meta={})


def _jitter(i):
    return STEP_S * (1 + 0.03 * np.sin(i))


def _vllm_v1_plan():
    """Requests a..h decode and all finish; later a lone 512-token prompt runs with no decode
    running (vLLM V1: running decodes are always scheduled first, so this is the only way a
    prefill-only step happens), then request z decodes. Also a one-request batch whose last token
    precedes a lone prefill of the next request."""
    old = [f"r{i}" for i in range(8)]
    plan = [("decode", old, [], _jitter(i)) for i in range(60)]
    plan += [("prefill", [], ["z"], 0.120)]
    plan += [("decode", ["z"], [], _jitter(i)) for i in range(30)]
    plan += [("prefill", [], ["y"], 0.120)]  # z finished on the step before: nobody waits
    plan += [("decode", ["y"], [], _jitter(i)) for i in range(30)]
    return plan


def _sglang_plan():
    """SGLang without mixed chunk: the prefill batch runs alone while 8 requests wait."""
    old = [f"r{i}" for i in range(8)]
    plan = [("decode", old, [], _jitter(i)) for i in range(60)]
    plan += [("prefill", [], ["z"], 0.120)]
    plan += [("decode", old + ["z"], [], _jitter(i)) for i in range(60)]
    return plan


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "steps_only"])
def test_no_prefill_stall_where_no_request_was_decoding(tokens):
    d = diagnose(_run(_vllm_v1_plan(), tokens))
    assert "prefill_stall" not in set(d.spikes["cause"])
    assert not d.steps.loc[d.steps["kind"] == "prefill", "decodes_waited"].any()


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "steps_only"])
def test_prefill_stall_where_running_decodes_waited(tokens):
    d = diagnose(_run(_sglang_plan(), tokens))
    got = dict(zip(d.spikes["step"], d.spikes["cause"]))
    assert got.get(60) == "prefill_stall"
    ev = d.spikes.set_index("step").at[60, "evidence"]
    assert ev["decodes_waited"] is True
