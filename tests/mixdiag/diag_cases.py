"""Hand-built Timelines whose answers are known: a steady decode stream with one fault per
injected step. Used by the diagnosis, report and CLI tests."""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.schema import Timeline

BASE_S = 0.020  # a healthy decode step
GAP_S = 0.001   # a healthy host gap between steps

# step -> overrides (durations in s); every injected step is an answer the diagnosis must find.
FAULTS = {
    40: dict(kind="mixed", prefill_tokens=512, prefill_reqs=1, dur=0.110, graph_mode="PIECEWISE", sm_active=0.95),
    70: dict(expert_imbalance=4.0, dur=0.080),
    100: dict(gap=0.100),
    130: dict(kv_transfer_bytes=4e6, kv_transfer_s=0.060, dur=0.085),
    160: dict(preempted_reqs=2, dur=0.070, kv_usage=0.97),
    190: dict(decode_reqs=7, graph_mode="PIECEWISE", dur=0.070),
    220: dict(kind="prefill", prefill_tokens=1024, prefill_reqs=1, decode_reqs=0, dur=0.120,
              graph_mode="PIECEWISE", sm_active=0.97),
}
EXPECTED = {40: "mixing", 70: "ep_hotspot", 100: "host_stall", 130: "pd_transfer", 160: "kv_pressure",
            190: "graph_fallback", 220: "prefill_stall"}


def build(n_steps: int = 260, faults: dict | None = None, tokens: bool = True, drop: tuple = (),
          seed: int = 0, spec_k: int = 0) -> Timeline:
    """A decode stream of 8 requests on one instance with the given faults injected."""
    faults = FAULTS if faults is None else faults
    rng = np.random.default_rng(seed)
    rows, toks = [], []
    t = 0.0
    for n in range(n_steps):
        f = dict(faults.get(n, {}))
        t += f.pop("gap", GAP_S)
        dur = f.pop("dur", BASE_S * (1 + 0.05 * rng.standard_normal()))
        r = dict(instance="engine0", step=n, t_start_s=t, t_end_s=t + dur, granularity="step", kind="decode",
                 prefill_tokens=0.0, prefill_reqs=0.0, decode_reqs=8.0, graph_mode="FULL",
                 sm_active=0.30 + 0.02 * rng.standard_normal(), expert_imbalance=1.2 + 0.05 * rng.random(),
                 kv_transfer_bytes=0.0, kv_transfer_s=0.0, preempted_reqs=0.0, kv_usage=0.5)
        r.update(f)
        r["decode_rows"] = r["decode_reqs"] * (1 + spec_k)
        rows.append(r)
        t += dur
        for q in range(int(r["decode_reqs"])):
            toks.append(dict(instance="engine0", request_id=f"r{q}", t_s=t, n_tokens=1 + spec_k, step=float(n)))
    steps = pd.DataFrame(rows)
    for col in drop:
        steps[col] = "unknown" if col == "graph_mode" else np.nan
    return Timeline(steps, pd.DataFrame(toks) if tokens else None, meta={"source": "test"})
