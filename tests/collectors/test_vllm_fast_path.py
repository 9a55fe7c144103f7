"""The columnar fast path for vLLM Iteration lines reads exactly what the per-line walk reads."""
import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.logs import vllm_iterations, vllm_log
from tests.helpers.vllm_mixed_log import mixed_log

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _same(a, b):
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.series, b.series, check_exact=True)
    assert a.meta == b.meta


def _both(data: bytes, tmp_path, **kw):
    p = tmp_path / "engine.log"
    p.write_bytes(data)
    fast = vllm_log.read(p, instance="v", **kw)
    slow = vllm_log.read(p, instance="v", fast=False, **kw)
    return fast, slow


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("vllm_log_*.txt")))
@pytest.mark.parametrize("year", [None, 2025])
def test_fixtures_read_the_same_both_ways(name, year, tmp_path):
    _same(*_both((FIX / name).read_bytes(), tmp_path, year=year))


@pytest.mark.parametrize("seed", [3, 7])
@pytest.mark.parametrize("chunk", [vllm_iterations.CHUNK_CHARS, 4096])
def test_generated_log_of_every_line_kind_reads_the_same(seed, chunk, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_iterations, "CHUNK_CHARS", chunk)  # chunk seams fall mid-log too
    data = mixed_log(3000, seed=seed)
    fast, slow = _both(data, tmp_path)
    _same(fast, slow)
    src = fast.meta["sources"][0]
    assert src["lines_total"] == data.count(b"\n") == src["lines_parsed"] + src["lines_skipped"] + src["lines_ignored"]
    assert src["lines_skipped"] > 0 and src["bytes_replaced"] > 0
    # most Iteration lines took the fast path, the odd ones the walk: both kinds are in the frame
    sl = vllm_iterations.split(data.decode("utf-8", "replace"))
    assert 0 < len(sl.slow) < len(sl.fast_ln)


def test_generated_iteration_log_reads_the_same(tmp_path):
    from bench_text_collectors import iteration_log

    p = tmp_path / "engine_dp0.log"
    iteration_log(p, 6000)
    fast, slow = vllm_log.read(p, year=2025), vllm_log.read(p, year=2025, fast=False)
    _same(fast, slow)
    assert len(fast.steps) == 6000 and fast.steps["expert_imbalance"].notna().any()


def test_fast_values_are_exact():
    """Counts, fractions and elapsed times convert to the doubles float() gives."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(500):
        frac = "" if i % 5 == 0 else "." + "".join(str(d) for d in rng.integers(0, 10, rng.integers(1, 10)))
        ms = f"{rng.uniform(0, 1e4):.{rng.integers(0, 8)}f}"
        lines.append(f"INFO 03-01 10:{i // 60 % 60:02d}:{i % 60:02d}{frac} [core.py:1] Iteration({i}): 1 context requests, "
                     f"{rng.integers(0, 10 ** 12)} context tokens, 3 generation requests, 3 generation tokens, "
                     f"iteration elapsed time: {ms} ms")
    text = "\n".join(lines) + "\n"
    fast = vllm_log.read(io.BytesIO(text.encode()), year=2025, instance="v")
    slow = vllm_log.read(io.BytesIO(text.encode()), year=2025, instance="v", fast=False)
    _same(fast, slow)
    assert len(vllm_iterations.split(text).fast_ln) == 500
