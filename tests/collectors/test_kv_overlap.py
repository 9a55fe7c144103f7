"""PD KV transfer on a side stream inside a step (``collectors/traces/steps/kv_overlap.py``), on small
vLLM-like exports whose engine behaviour and sources are in ``tests/helpers/side_stream_export.py``."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.side_stream_export import SideStreamCase, write  # noqa: E402

from mixdiag.collectors.traces.nsys import reader as nsys  # noqa: E402

PD = SideStreamCase().pd_steps
KV_BYTES = sum(SideStreamCase().copy_bytes)
COPY_S = sum(SideStreamCase().copy_ms) / 1e3


@pytest.mark.parametrize("case, kwargs, overlap_s, wait_s, nbytes", [
    # two unequal copies: not the layer-wise equal-size pattern the consumer-side rule needs
    ("connector thread copies, forward waits", {}, COPY_S, COPY_S, KV_BYTES),
    ("engine thread issues the side-stream copy (LMCache-style)", {"issuer": "engine"}, COPY_S, COPY_S, KV_BYTES),
    ("copy beside a forward that does not wait", {"wait": False}, COPY_S, 0.0, KV_BYTES),
    ("one 4 KiB side copy per step is input staging, not KV", {"copy_bytes": (4096,), "copy_ms": (0.05,)},
     None, None, None),
    ("NIXL: RDMA, no CUDA copy row", {"rdma": True}, None, None, None),
])
def test_kv_overlap_table(tmp_path, case, kwargs, overlap_s, wait_s, nbytes):
    out = tmp_path / "pd.sqlite"
    write(out, SideStreamCase(**kwargs))
    s = nsys.read(out).steps.sort_values("step").reset_index(drop=True)
    pd_rows = s["step"].isin(PD).to_numpy()
    if overlap_s is None:
        assert s["kv_overlap_s"].isna().all(), case
        assert s["kv_wait_s"].isna().all(), case
        return
    assert np.allclose(s.loc[pd_rows, "kv_overlap_s"], overlap_s, rtol=0.01), case
    assert np.allclose(s.loc[pd_rows, "kv_wait_s"], wait_s, atol=1e-4), case
    assert np.allclose(s.loc[pd_rows, "kv_overlap_bytes"], nbytes, rtol=0.01), case
    assert (s.loc[~pd_rows, "kv_overlap_s"] == 0).all(), case
    assert (s["q_kv_transfer"] == "inferred").all(), case


def test_input_file_untouched(tmp_path):
    out = tmp_path / "pd.sqlite"
    write(out, SideStreamCase())
    before = out.read_bytes()
    nsys.read(out)
    assert out.read_bytes() == before
