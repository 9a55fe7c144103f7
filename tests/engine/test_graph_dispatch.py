"""Graph-mode planning as vLLM decides it (uniform decode -> FULL, else PIECEWISE, above max -> NONE)."""
import pytest

from mixdiag.engine.config import SchedulerConfig
from mixdiag.engine.model.graph_dispatch import plan_graph

SIZES = (1, 2, 4, 8, 16)


@pytest.mark.parametrize("nst,all_decode,spec,eager,mode,bucket", [
    ([1, 1, 1], True, 0, False, "FULL", 4),            # padded up to the next captured size
    ([1] * 16, True, 0, False, "FULL", 16),
    ([1] * 17, True, 0, False, "NONE", None),          # above the largest captured size
    ([3, 3], True, 2, False, "FULL", 8),               # uniform with k=2 drafts: 1 + k rows each
    ([3, 1], True, 2, False, "PIECEWISE", 4),          # non-uniform decode
    ([1, 1], True, 2, False, "PIECEWISE", 2),          # decodes without drafts are not uniform when k=2
    ([5, 1, 1], False, 0, False, "PIECEWISE", 8),      # mixed step
    ([12], False, 0, False, "PIECEWISE", 16),          # prefill chunk
    ([40], False, 0, False, "NONE", None),
    ([1, 1], True, 0, True, "NONE", None),             # enforce_eager
    ([], True, 0, False, "NONE", None),                # idle
])
def test_plan(nst, all_decode, spec, eager, mode, bucket):
    cfg = SchedulerConfig(cudagraph_capture_sizes=SIZES, num_spec_tokens=spec, enforce_eager=eager)
    p = plan_graph(nst, all_decode, cfg)
    assert (p.mode, p.bucket) == (mode, bucket)


def test_capture_sizes_normalised():
    assert SchedulerConfig(cudagraph_capture_sizes=(8, 2, 2)).cudagraph_capture_sizes == (2, 8)


@pytest.mark.parametrize("cg_mode,nst,all_decode,mode,bucket", [
    ("FULL_AND_PIECEWISE", [6, 6], True, "FULL", 16),
    ("PIECEWISE", [6, 6], True, "PIECEWISE", 16),      # no FULL graphs: uniform decode replays pieces
    ("FULL", [6, 6], True, "FULL", 16),
    ("FULL", [9, 6], False, "NONE", None),             # FULL-only: a mixed step runs eagerly
    ("NONE", [6, 6], True, "NONE", None),
])
def test_plan_follows_cudagraph_mode(cg_mode, nst, all_decode, mode, bucket):
    cfg = SchedulerConfig(cudagraph_capture_sizes=SIZES, num_spec_tokens=5, cudagraph_mode=cg_mode)
    p = plan_graph(nst, all_decode, cfg)
    assert (p.mode, p.bucket) == (mode, bucket)


def test_cudagraph_mode_validated():
    from mixdiag.engine.config import ConfigError
    with pytest.raises(ConfigError, match="cudagraph_mode"):
        SchedulerConfig(cudagraph_mode="SOMETIMES")
