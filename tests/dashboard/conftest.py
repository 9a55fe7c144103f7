"""Dashboard test setup: hand-built Timelines with known faults, and headless Chromium options.

``pytest_setup_options`` is dash[testing]'s hook for the Selenium options of ``dash_duo`` and of
our module-scoped browser (one app start per test module keeps the browser tests fast).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.schema import Timeline

BASE_S = 0.020   # a healthy decode step
GAP_S = 0.001    # a healthy host gap


def pytest_setup_options():
    """dash[testing]'s hook: headless Chromium without sandbox/GPU and with no background networking."""
    from mixdiag.dashboard.screenshot import chrome_options

    return chrome_options()


def build_timeline(n_steps: int = 240, *, period: int = 30, instance: str = "engine0", faults: dict | None = None,
                   tokens: bool = True, seed: int = 0, t0: float = 1_700_000_000.0,
                   meta_signals: dict | None = None) -> Timeline:
    """A decode stream of 8 requests with a chunked prefill mixed in every ``period`` steps.

    ``faults`` maps step -> column overrides (``dur`` and ``gap`` in seconds) for other causes.
    Mixed steps take ~5x a decode step, so each is a spike caused by mixing.
    """
    rng = np.random.default_rng(seed)
    faults = dict(faults or {})
    rows, toks = [], []
    t = t0
    for n in range(n_steps):
        f = dict(faults.get(n, {}))
        if period and n % period == period // 2 and n not in faults:
            f = dict(kind="mixed", prefill_tokens=512.0, prefill_reqs=1.0, dur=0.105, graph_mode="PIECEWISE",
                     sm_active=0.95)
        t += f.pop("gap", GAP_S)
        dur = f.pop("dur", BASE_S * (1 + 0.04 * rng.standard_normal()))
        r = dict(instance=instance, step=n, t_start_s=t, t_end_s=t + dur, granularity="step", kind="decode",
                 prefill_tokens=0.0, prefill_reqs=0.0, decode_reqs=8.0, graph_mode="FULL",
                 sm_active=float(np.clip(0.30 + 0.02 * rng.standard_normal(), 0, 1)),
                 expert_imbalance=1.2 + 0.05 * rng.random(), kv_transfer_bytes=0.0, kv_transfer_s=0.0,
                 preempted_reqs=0.0, kv_usage=0.5)
        r.update(f)
        r["decode_rows"] = r["decode_reqs"]
        rows.append(r)
        t += dur
        for q in range(int(r["decode_reqs"])):
            toks.append(dict(instance=instance, request_id=f"r{q}", t_s=t, n_tokens=1, step=float(n)))
    meta = {"source": "hand-built test timeline",
            "signals": {instance: meta_signals or {"sm_active": "estimated", "graph_mode": "inferred"}}}
    return Timeline(pd.DataFrame(rows), pd.DataFrame(toks) if tokens else None, meta=meta)


#: Faults other than mixing, with the cause the diagnosis should name.
FAULTS = {70: dict(expert_imbalance=4.0, dur=0.080), 130: dict(kv_transfer_bytes=4e6, kv_transfer_s=0.060, dur=0.085),
          190: dict(gap=0.100)}


#: A 150-step EP hotspot: one sustained episode (issue 23), mixing spikes around it.
HOTSPOT = {k: dict(expert_imbalance=4.0, dur=0.050) for k in range(200, 350)}


@pytest.fixture(scope="module")
def hotspot_timeline():
    """500 steps with a 150-step EP hotspot (one episode, cause ep_hotspot) and periodic mixing spikes."""
    return build_timeline(n_steps=500, faults=HOTSPOT)


@pytest.fixture
def make_timeline():
    return build_timeline


@pytest.fixture(scope="module")
def faulty_timeline():
    """A Timeline with mixing, EP-hotspot, PD-transfer and host-stall spikes."""
    return build_timeline(faults=FAULTS)


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    """A saved run directory (Timeline files) with mixing, EP-hotspot, PD-transfer and host-stall spikes."""
    d = tmp_path_factory.mktemp("data") / "run1"
    build_timeline(faults=FAULTS).save(d)
    return d


@pytest.fixture(scope="module")
def hotspot_run(tmp_path_factory):
    """A saved run directory holding the hotspot timeline (one ep_hotspot episode)."""
    d = tmp_path_factory.mktemp("data") / "hot"
    build_timeline(n_steps=500, faults=HOTSPOT).save(d)
    return d
