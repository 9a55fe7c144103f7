"""Client steps on an engine that mixes: a cluster of first tokens alone, read apart from the decode
tokens of its step, is a mixed step with unknown decode rows - not a prefill-only step that stalled the
decodes (vLLM V1 never runs one while requests decode). On an engine that runs prefill batches alone
(SGLang without mixed chunk) the same cluster stays ``prefill``. Which engine is measured on the capture:
the share of first tokens that arrived together with other streams' decode tokens."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.clients.client_steps import MIXES_MIN, client_steps

STEP = 0.01


def _tokens(mixes: bool, n_new: int = 8) -> pd.DataFrame:
    """Two long streams decoding every STEP; ``n_new`` short requests join. Mixing engine: a new
    request's first token comes in the step's read with the decode tokens, except the last one, which
    the client read 4 ms apart. Non-mixing engine: each first token comes in a step of its own."""
    rows, t = [], 0.0
    joins = {10 + 10 * k: k for k in range(n_new)}
    for step in range(12 + 10 * n_new):
        t += STEP
        if step in joins and not mixes:
            rows.append(("new%d" % joins[step], t, 1, 1, t - 0.05, 300.0))
            t += STEP
        for s in ("a", "b"):
            rows.append((s, t + (0.0001 if s == "b" else 0.0), 1 if step == 0 else 0, 1, t - 0.05 if step == 0 else np.nan,
                         64.0 if step == 0 else np.nan))
        if step in joins and mixes:
            late = 0.004 if joins[step] == n_new - 1 else 0.0002
            rows.append(("new%d" % joins[step], t + late, 1, 1, t - 0.05, 300.0))
    return pd.DataFrame(rows, columns=["request_id", "t_s", "is_first", "n_tokens", "arrival_s", "prompt_tokens"])


@pytest.mark.parametrize("mixes, kind_of_last", [(True, "mixed"), (False, "prefill")])
def test_first_tokens_read_apart_on_a_mixing_engine(mixes, kind_of_last):
    tok = _tokens(mixes)
    steps, tok2, _ = client_steps(tok, "c", cluster_s=0.003)
    last_first = tok2[(tok2.request_id == "new7") & (tok2.is_first == 1)]["step"].iloc[0]
    row = steps.loc[steps.step == int(last_first)].iloc[0]
    assert row["kind"] == kind_of_last
    if mixes:  # the client cannot count the step's decodes: unknown, not zero
        assert np.isnan(row["decode_reqs"]) and np.isnan(row["decode_rows"])
    else:
        assert row["decode_reqs"] == 0


def test_too_few_first_tokens_decide_nothing():
    tok = _tokens(True, n_new=MIXES_MIN - 1)
    steps, tok2, _ = client_steps(tok, "c", cluster_s=0.003)
    last = tok2[(tok2.request_id == f"new{MIXES_MIN - 2}") & (tok2.is_first == 1)]["step"].iloc[0]
    assert steps.loc[steps.step == int(last), "kind"].iloc[0] == "prefill"


def test_burst_in_the_last_read_counts_every_step():
    """Regression (real vLLM client capture, fresh-clone CI of fbf5c94): in the last read stream ``a``
    got two chunks (two engine steps coalesced) and stream ``b``'s one chunk came last in time. ``b``'s
    chunk goes to the read's first sub-step, ``a``'s second chunk to the second: the step count is the
    number of sub-steps, not the time-last token's step + 1 (that raised IndexError)."""
    rows = []
    for k in range(1, 30):
        t = k * STEP
        rows += [("a", t, int(k == 1), 1, t - 0.05 if k == 1 else np.nan, 64.0 if k == 1 else np.nan),
                 ("b", t + 0.0001, int(k == 1), 1, t - 0.05 if k == 1 else np.nan, 64.0 if k == 1 else np.nan)]
    t = 30 * STEP
    rows += [("a", t, 0, 1, np.nan, np.nan), ("a", t + 0.0002, 0, 1, np.nan, np.nan),
             ("b", t + 0.0004, 0, 1, np.nan, np.nan)]
    tok = pd.DataFrame(rows, columns=["request_id", "t_s", "is_first", "n_tokens", "arrival_s", "prompt_tokens"])
    steps, tok2, _ = client_steps(tok, "c", cluster_s=0.003)
    assert len(steps) == 31                       # 29 reads of one step each + one read of two steps
    assert int(tok2["step"].max()) == len(steps) - 1
    assert steps["t_end_s"].is_monotonic_increasing
    assert steps["output_tokens"].sum() == len(tok)


def _decode_run(read_apart_ms: float, late: tuple[str, ...]) -> pd.DataFrame:
    """Four streams decoding every STEP; at step 20 a slow 250 ms step whose chunks of ``late`` streams
    the client read ``read_apart_ms`` after the others (the real-vLLM testbed's 1 + 3 split)."""
    rows, t = [], 0.0
    for step in range(40):
        t += 0.25 if step == 20 else STEP
        for j, s in enumerate("abcd"):
            dt = (read_apart_ms / 1000 if step == 20 and s in late else 0.0) + 0.0001 * j
            rows.append((s, t + dt, int(step == 0), 1, t - 0.05 if step == 0 else np.nan, 64.0 if step == 0 else np.nan))
    return pd.DataFrame(rows, columns=["request_id", "t_s", "is_first", "n_tokens", "arrival_s", "prompt_tokens"])


@pytest.mark.parametrize("apart_ms, late, one_step", [
    (6.0, ("b", "c", "d"), True),   # one step read as 1 + 3 streams: joined
    (6.0, ("d",), True),            # 3 + 1
    (0.0, (), True),                # read together
    (4.0, ("c", "d"), True),        # 2 + 2
])
def test_a_step_read_apart_is_one_step(apart_ms, late, one_step):
    steps, tok2, _ = client_steps(_decode_run(apart_ms, late), "c", cluster_s=0.003)
    t_slow = 20 * STEP + 0.25  # when the slow step's first chunk arrives
    slow = tok2[(tok2["t_s"] >= t_slow - 1e-6) & (tok2["t_s"] < t_slow + apart_ms / 1000 + 0.001)]
    assert len(slow) == 4
    assert (slow["step"].nunique() == 1) is one_step
    if one_step:
        row = steps.loc[steps.step == int(slow["step"].iloc[0])].iloc[0]
        assert row["decode_reqs"] == 4 and row["t_end_s"] - row["t_start_s"] > 0.2
