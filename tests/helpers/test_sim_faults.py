"""Tier (d)'s fault sets are drawn from the seed (benchmarks/attribution_sources.sim_faults), not fixed per variant."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("attribution_sources", ROOT / "benchmarks" / "attribution_sources.py")
src = importlib.util.module_from_spec(spec)
sys.modules["attribution_sources"] = src   # dataclasses look their module up
spec.loader.exec_module(src)


@pytest.mark.parametrize("variant", sorted(src.SIM_VARIANTS))
def test_drawn_fault_sets_are_valid_and_vary(variant):
    pool = src.SIM_FAULTS[src.SIM_VARIANTS[variant].engine]
    sets = [src.sim_faults(variant, s) for s in range(40)]
    for f in sets:
        assert len(f) >= 2 and set(f) <= set(pool) and len(set(f)) == len(f)
    assert len(set(sets)) > 1
    assert src.sim_faults(variant, 7) == src.sim_faults(variant, 7)
