"""Step boundaries from the engine thread's calls (collectors/traces/steps/boundaries.py), on small call tables."""
from __future__ import annotations

import numpy as np
import pytest

from mixdiag.collectors.traces.steps.activity import D2H, H2D, LAUNCH, MEMCPY, SYNC, Calls, Items
from mixdiag.collectors.traces.steps.boundaries import call_signature, launch_gap_steps, sync_steps, valleys

US = 1_000
MAIN, OTHER = 1, 2


def _engine(n_steps: int, layers: int, layer_pause_us: int, copies: bool, wait_tid=None, d2h=None):
    """Calls of ``n_steps`` forwards: [H2D copies], per layer a pause then 4 launches 3 µs apart, [D2H copy
    + a wait on ``wait_tid``]; 600 µs of scheduling between forwards. Returns calls, items, call_idx, step
    of each call (truth)."""
    rows, items, truth, t, corr = [], [], [], 0, 0

    def call(what, tid=MAIN, dur=2 * US, step=-1):
        nonlocal t, corr
        corr += 1
        rows.append((tid, t, t + dur, corr, what))
        truth.append(step)
        t += dur + 3 * US
        return corr

    for k in range(n_steps):
        if copies:
            for _ in range(3):
                items.append((call(MEMCPY, step=k), 2, H2D))
        for _ in range(layers):
            t += layer_pause_us * US
            for _ in range(4):
                items.append((call(LAUNCH, step=k), 0, 0))
        if d2h or (d2h is None and wait_tid is not None):
            items.append((call(MEMCPY, step=k), 2, D2H))
        if wait_tid is not None:
            call(SYNC, tid=wait_tid, step=k if wait_tid == MAIN else -1)
        t += 600 * US
    r = np.array(rows, dtype=np.int64)
    calls = Calls(np.zeros(len(r), dtype=np.int64), r[:, 0], r[:, 1], r[:, 2], r[:, 3], r[:, 4])
    it = np.array(items, dtype=np.int64)
    z = np.zeros(len(it), dtype=np.int64)
    items = Items(z, z, z, z, z, it[:, 0], it[:, 1], z + 64, it[:, 2], z, z)
    call_idx = it[:, 0] - 1                       # correlation ids are 1..n in call order
    return calls, items, call_idx, np.array(truth)


def test_valleys_find_every_gap_class():
    rng = np.random.default_rng(0)
    gaps = np.concatenate([rng.uniform(2, 4, 400), rng.uniform(40, 80, 100), rng.uniform(500, 900, 30)]) * US
    v = sorted(valleys(gaps.astype(np.int64)))
    assert any(4 * US < x < 40 * US for x in v) and any(80 * US < x < 500 * US for x in v)


@pytest.mark.parametrize("layer_pause_us", [0, 60])
def test_launch_gaps_split_at_scheduling_not_at_layer_pauses(layer_pause_us):
    calls, items, call_idx, truth = _engine(12, 4, layer_pause_us, copies=True)
    got = launch_gap_steps(calls, MAIN, call_signature(calls, items, call_idx, 4))
    assert got is not None and np.array_equal(got, truth)


def test_launch_gaps_without_once_per_step_work_split_at_the_finest_valley():
    """The documented failure case: nothing issued once per step, so per-layer pauses read as steps."""
    calls, items, call_idx, truth = _engine(12, 4, 60, copies=False)
    got = launch_gap_steps(calls, MAIN, call_signature(calls, items, call_idx, 4))
    assert got is not None and got.max() + 1 == 12 * 4


@pytest.mark.parametrize("wait_tid,found", [(MAIN, True), (OTHER, True), (None, False)],
                         ids=["wait on the engine thread", "wait on an output thread", "no wait anywhere"])
def test_sync_pattern_waits_on_any_thread(wait_tid, found):
    calls, items, call_idx, truth = _engine(10, 2, 0, copies=True, wait_tid=wait_tid, d2h=True)
    got = sync_steps(calls, items, call_idx, MAIN)
    assert (got is not None) == found
    if found:  # every call that issued GPU work is in its own step (a wait after the copy is not work)
        work = calls.what != SYNC
        assert np.array_equal(got[work], truth[work])
