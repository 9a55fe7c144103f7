"""Foreign-trace claims the data cannot back are not made: KV transfer needs what a real transfer
looks like, rank skew needs EP exchanges every step; real non-serving fixtures claim neither."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.collectors.traces.steps.foreign import LAUNCH, MEMCPY, Activity, Calls, Items, reconstruct

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"
MS = 1_000_000
COMPUTE, SIDE, MAIN, OTHER = 7, 21, 1, 2


def _activity(extra):
    """Five 2-ms steps of main-thread kernels on the compute stream (5 ms apart) plus ``extra``
    items ``(what, start_ms, stream, tid or None, bytes, copy kind, flags)`` (tid None: no runtime row)."""
    rows, calls = [], []
    corr = 100
    for i in range(5):
        for j in range(4):
            corr += 1
            t = i * 5 * MS + j * MS // 2
            calls.append((t - 50_000, MAIN, corr, LAUNCH))
            rows.append((t, t + MS // 2, COMPUTE, corr, 0, 0, 0, 0))
    for what, at, stream, tid, nbytes, kind, flags in extra:
        corr += 1
        t = int(at * MS)
        if tid is not None:
            calls.append((t - 20_000, tid, corr, MEMCPY if what == 2 else LAUNCH))
        rows.append((t, t + 30_000, stream, corr, what, nbytes, kind, flags))
    r = np.array(rows, dtype=np.int64)
    c = np.array(calls, dtype=np.int64)
    z = np.zeros(len(r), dtype=np.int64)
    items = Items(z + 5, r[:, 0], r[:, 1], z, r[:, 2], r[:, 3], r[:, 4], r[:, 5], r[:, 6], r[:, 7], z)
    cz = np.zeros(len(c), dtype=np.int64)
    ranges = pd.DataFrame({"grp": [], "tid": [], "start": [], "end": [], "name": [], "transfer": []})
    return Activity(items, Calls(cz + 5, c[:, 1], c[:, 0], c[:, 0] + 10_000, c[:, 2], c[:, 3]), ranges)


LAYERWISE = [(2, 9.0 + 0.04 * i, SIDE, OTHER, 65536, 1, 0) for i in range(6)]
CASES = [  # (what the trace holds, KV transfer found)
    ("layer-wise equal H2D copies from a connector thread on a side stream", LAYERWISE, True),
    ("one large H2D copy from a data-loader thread on a side stream", [(2, 9.0, SIDE, OTHER, 1 << 26, 1, 0)], False),
    ("uneven copies from another thread (offload, not KV blocks)",
     [(2, 9.0 + 0.04 * i, SIDE, OTHER, 4096 * (i + 1) ** 2, 1, 0) for i in range(6)], False),
    ("copies without a runtime row on the compute stream", [(2, 9.0 + 0.04 * i, COMPUTE, None, 65536, 8, 0)
                                                             for i in range(6)], False),
    ("a peer (P2P) copy on a side stream, launch call lost", [(2, 9.0, SIDE, None, 1 << 20, 10, 0)], True),
    ("an NCCL send/recv kernel from another thread on a side stream", [(0, 9.0, SIDE, OTHER, 0, 0, 4 | 8 | 16)], True),
    ("an NCCL send/recv kernel the engine thread launched on the compute stream",
     [(0, 9.0, COMPUTE, MAIN, 0, 0, 4 | 8 | 16)], False),
]


@pytest.mark.parametrize("what,extra,found", CASES, ids=[c[0] for c in CASES])
def test_kv_transfer_needs_a_transfer_shape(what, extra, found):
    steps, _, _ = reconstruct(_activity(extra), gap_ns=MS)
    assert len(steps) == 5
    got = steps["kv_transfer_s"].fillna(0).to_numpy()
    assert (got > 0).any() == found, what
    if found:  # charged to the step that starts after the episode began (the consumer of the KV)
        assert got[2] > 0 and got.sum() == got[2]


@pytest.mark.parametrize("name,kv,skew,comm", [
    ("mfu_2gpu_before", "absent", "absent", "inferred"),   # training: NCCL send/recv now and then, no PD
    ("h100_2gpu_1s", "absent", "absent", "absent"),        # video generation: no serving at all
])
@pytest.mark.parametrize("options", [{}, {"step_gap_s": 0.001}, {"step_range": "ncclSend"}])
def test_real_fixtures_claim_nothing_they_cannot_show(name, kv, skew, comm, options):
    tl = nsys.read(FIX / f"{name}.sqlite", **options)
    s = tl.steps
    assert len(s) > 0 and len(tl.instances) == 2
    for inst in tl.instances:
        sig = tl.meta["signals"][inst]
        assert (sig["kv_transfer"], sig["expert_imbalance"], sig["comm"]) == (kv, skew, comm)
        for key in ("kind", "token_allocation", "prefill_tokens", "decode_rows"):
            assert sig[key] == "absent", key
    assert set(s["kind"]) == {"unknown"} and s["prefill_tokens"].isna().all() and s["decode_rows"].isna().all()
    assert s["kv_transfer_s"].isna().all() and s["rank_skew"].isna().all()
    assert set(s["q_token_allocation"]) == {""} and set(s["q_kv_transfer"]) == {""}
    if "step_range" in options:  # ranges around host-only calls hold no GPU work: steps found another way
        assert any("ncclSend" in n for n in tl.meta["sources"][0]["notes"])
