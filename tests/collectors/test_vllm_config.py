"""vLLM's start-up config line says how large a batch it replays from a CUDA graph; ``CudagraphDispatcher``
runs every larger batch without one (formats.md §1.3). The line's limit reaches the interval rows of that
engine as ``graph_none_min_tokens`` - the column the ``--cudagraph-metrics`` table fills - and an engine
with graphs off (enforce-eager, mode NONE: the real 0.32 CPU capture) gives none."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from mixdiag.collectors.logs import vllm_config, vllm_log

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "vllm.log"

# the shape of a GPU engine's line (vLLM issue #23739 prints the same fields; sizes here are made up)
GPU = ("(EngineCore_DP0 pid=411) INFO 03-01 09:59:50 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
       "model='m', enforce_eager=False, kv_cache_dtype=auto, compilation_config={{'mode': "
       "<CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': <CUDAGraphMode.{mode}: (2, 1)>, "
       "'cudagraph_capture_sizes': [1, 2, 4, 8, 16, 24, 32], {top}'compile_sizes': []}}")
STATS = ("(APIServer pid=400) INFO 03-01 10:00:{s:02d} [loggers.py:259] Engine 000: Avg prompt throughput: 10.0 "
         "tokens/s, Avg generation throughput: 50.0 tokens/s, Running: 5 reqs, Waiting: 0 reqs, GPU KV cache "
         "usage: 10.0%, Prefix cache hit rate: 0.0%")


@pytest.mark.parametrize("top, mode, want", [
    ("'max_cudagraph_capture_size': 32, ", "FULL_AND_PIECEWISE", 32),  # vLLM >= PR #26016's name
    ("'max_capture_size': 24, ", "PIECEWISE", 24),                     # the name before it
    ("", "FULL_AND_PIECEWISE", 32),                                    # only the list: its largest size
    ("'max_cudagraph_capture_size': 32, ", "NONE", None),              # graphs off: no fallback to name
])
def test_eager_above_the_largest_capture_size(top, mode, want):
    cfg = vllm_config.parse(GPU.format(mode=mode, top=top))
    assert cfg.enforce_eager is False and cfg.cudagraph_mode == mode
    assert cfg.eager_above == want


def test_real_cpu_engine_runs_eager_everywhere():
    line = next(ln for ln in FIXTURE.read_text().splitlines() if "Initializing a V1 LLM engine" in ln)
    cfg = vllm_config.parse(line)
    assert cfg.enforce_eager is True and cfg.cudagraph_mode == "NONE" and cfg.eager_above is None
    tl = vllm_log.read(FIXTURE, year=2026)
    assert "graph_none_min_tokens" not in tl.steps or tl.steps["graph_none_min_tokens"].isna().all()


@pytest.mark.parametrize("mode, want", [("FULL_AND_PIECEWISE", 33.0), ("NONE", None)])
def test_interval_rows_take_the_limit(mode, want):
    text = "\n".join([GPU.format(mode=mode, top="'max_cudagraph_capture_size': 32, "), STATS.format(s=0),
                      STATS.format(s=10)]) + "\n"
    tl = vllm_log.read(io.StringIO(text), instance="v", year=2025)
    got = tl.steps["graph_none_min_tokens"].to_numpy(dtype=float) if "graph_none_min_tokens" in tl.steps \
        else np.full(len(tl.steps), np.nan)
    assert len(got) == 2
    assert (np.isnan(got).all() if want is None else (got == want).all())
    assert tl.meta["engine_graph_config"]["0"]["cudagraph_mode"] == mode


def test_a_capping_warning_lowers_the_limit():
    cap = ("(EngineCore_DP0 pid=411) WARNING 03-01 09:59:51 [compilation.py:1233] Capping cudagraph capture sizes "
           "from max 32 to 16 to fit Mamba cache blocks (20 blocks available).")
    text = "\n".join([GPU.format(mode="FULL_AND_PIECEWISE", top="'max_cudagraph_capture_size': 32, "), cap,
                      STATS.format(s=0)]) + "\n"
    tl = vllm_log.read(io.StringIO(text), instance="v", year=2025)
    assert tl.steps["graph_none_min_tokens"].tolist() == [17.0]


ITER = ("(EngineCore_DP0 pid=411) INFO 03-01 10:00:{s:02d} [core.py:349] Iteration({n}): {cr} context requests, "
        "{ct} context tokens, {g} generation requests, {g} generation tokens, iteration elapsed time: 12.00 ms")


@pytest.mark.parametrize("mode, ct, g, want, quality", [
    ("FULL_AND_PIECEWISE", 0, 40, "NONE", "measured"),     # above the largest size: NONE before any key lookup
    ("FULL_AND_PIECEWISE", 0, 20, "FULL", "inferred"),     # a uniform decode batch within the sizes
    ("PIECEWISE", 0, 20, "PIECEWISE", "inferred"),
    ("FULL_AND_PIECEWISE", 300, 20, "NONE", "measured"),   # a chunk that pushes the step past the sizes
    ("FULL_AND_PIECEWISE", 8, 20, "unknown", None),        # a mixed batch within them: keys decide, not read
    ("NONE", 0, 40, "unknown", None),                      # graphs off: nothing to say
])
def test_iteration_steps_take_the_dispatchers_mode(mode, ct, g, want, quality):
    text = "\n".join([GPU.format(mode=mode, top="'max_cudagraph_capture_size': 32, "),
                      ITER.format(s=1, n=1, cr=1 if ct else 0, ct=ct, g=g)]) + "\n"
    st = vllm_log.read(io.StringIO(text), instance="v", year=2025).steps
    got = st["graph_mode"].iat[0] if "graph_mode" in st else "unknown"
    assert got == want
    if quality is not None:
        assert st["q_graph_mode"].iat[0] == quality
