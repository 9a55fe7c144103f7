"""Expert parallelism over real processes (gloo): sharding, all-to-all dispatch/combine, imbalance."""
import math

import pytest
import torch

from mixdiag.engine.expert_parallel import (EPConfig, ExpertParallel, ExpertWeights, check_shardable,
                                            expert_range, hotspot_bias, imbalance, local_experts)

E, H, I, W = 6, 32, 48, 3


def _layers(n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [ExpertWeights(torch.randn(E, I, H, generator=g) / H ** 0.5, torch.randn(E, I, H, generator=g) / H ** 0.5,
                          torch.randn(E, H, I, generator=g) / I ** 0.5) for _ in range(n)]


def _route(T, bias=None, k=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    logits = torch.randn(T, E, generator=g) + (0 if bias is None else bias)
    w, ids = torch.topk(torch.softmax(logits, -1), k)
    return x, ids, w


@pytest.fixture(scope="module")
def ep():
    layers = _layers()
    group = ExpertParallel(EPConfig(world_size=W, capacity_factor=1.5), layers)
    yield group, layers
    group.close()


@pytest.mark.parametrize("kw, msg", [
    ({"world_size": 1}, "world_size"),
    ({"backend": "mpi"}, "backend"),
    ({"capacity_factor": 0.5}, "capacity_factor"),
    ({"worker_threads": 0}, "worker_threads"),
    ({"timeout_s": 0}, "timeout_s"),
])
def test_config_rejects_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        EPConfig(**kw)


def test_sharding_and_bias():
    assert [expert_range(8, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ValueError, match="evenly"):
        check_shardable(6, 4)
    with pytest.raises(ValueError, match="top_k"):
        check_shardable(4, 4, top_k=2)
    b = hotspot_bias(8, 4, 2, 5.0)
    assert b.tolist() == [0, 0, 0, 0, 5, 5, 0, 0]
    with pytest.raises(ValueError):
        hotspot_bias(8, 4, 4, 1.0)


@pytest.mark.parametrize("counts, expected", [([4, 4, 4], 1.0), ([12, 0, 0], 3.0), ([2, 4, 6], 1.5), ([0, 0], None)])
def test_imbalance(counts, expected):
    got = imbalance(counts)
    assert math.isnan(got) if expected is None else got == pytest.approx(expected)


@pytest.mark.parametrize("T", [1, 5, 32, 77])
def test_ep_matches_local_experts(ep, T):
    group, layers = ep
    for layer in range(len(layers)):
        x, ids, w = _route(T, seed=T + layer)
        ref = local_experts(layers[layer], x, ids, w)
        out = group.experts(layer, x, ids, w)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_counts_rounds_and_hotspot(ep):
    group, layers = ep
    group.take_step_counts()
    x, ids, w = _route(40, seed=3)
    group.experts(0, x, ids, w)
    counts, rounds = group.take_step_counts()
    expected = torch.bincount(torch.div(ids.reshape(-1), E // W, rounding_mode="floor"), minlength=W).tolist()
    assert counts == expected and sum(counts) == 80
    assert rounds == max(1, math.ceil(max(counts) / math.ceil(1.5 * 80 / W)))

    bias = hotspot_bias(E, W, 1, 20.0)
    x, ids, w = _route(40, bias=bias, seed=4)
    out = group.experts(1, x, ids, w)
    torch.testing.assert_close(out, local_experts(layers[1], x, ids, w), rtol=1e-5, atol=1e-5)
    counts, rounds = group.take_step_counts()
    assert counts == [0, 80, 0]
    assert imbalance(counts) == pytest.approx(3.0)
    assert rounds == 2  # 80 rows on the hot rank, capacity ceil(1.5 * 80 / 3) = 40 per round
    assert group.take_step_counts() == ([0, 0, 0], 0)
