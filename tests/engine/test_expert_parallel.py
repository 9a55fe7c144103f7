"""Expert parallelism over real processes (gloo): sharding, all-to-all dispatch/combine, imbalance."""
import math

import pytest
import torch

from mixdiag.engine.testbed.expert_parallel import (EPConfig, ExpertParallel, ExpertWeights, check_shardable,
                                            expert_range, hotspot_bias, imbalance, local_experts)

E, H, I, W = 6, 32, 48, 3


def _layers(n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [ExpertWeights(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, torch.randn(E, H, I, generator=g) / I ** 0.5)
            for _ in range(n)]


def _route(T, bias=None, k=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    logits = torch.randn(T, E, generator=g) + (0 if bias is None else bias)
    w, ids = torch.topk(torch.softmax(logits, -1), k)
    return x, ids, w


@pytest.fixture(scope="class")
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


def test_attach_routes_model_moe_through_ranks():
    """A real model's MoE layers give the same output through EP as in-process, and detach cleanly."""
    from mixdiag.engine.config import ModelConfig
    from mixdiag.engine.model.model import build_model

    cfg = ModelConfig(hidden_size=32, num_layers=3, first_k_dense=1, num_heads=4, num_kv_heads=2, head_dim=8,
                      intermediate_size=48, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                      vocab_size=64, max_model_len=64)
    model = build_model(cfg)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = [m(x) for m in model.moe_layers]
        ep = ExpertParallel.attach(model, EPConfig(world_size=2))
        try:
            got = [m(x) for m in model.moe_layers]
            counts, _ = ep.take_step_counts()
            assert sum(counts) == 9 * 2 * len(model.moe_layers)
            ep.set_router_bias(hotspot_bias(4, 2, 1, 30.0))
            for m in model.moe_layers:
                m(x)
            counts, _ = ep.take_step_counts()
            assert counts[0] == 0 and imbalance(counts) == pytest.approx(2.0)
            ep.set_router_bias(None)
            assert all(float(m.router_bias.abs().sum()) == 0 for m in model.moe_layers)
        finally:
            ep.close()
        for r, g in zip(ref, got):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
        assert all(m.experts_impl == m.local_experts for m in model.moe_layers)


class TestGroup:
    """One 3-rank group (class-scoped: one torch.distributed group per process at a time)."""

    @pytest.mark.parametrize("T", [1, 5, 32, 77])
    def test_ep_matches_local_experts(self, ep, T):
        group, layers = ep
        for layer in range(len(layers)):
            x, ids, w = _route(T, seed=T + layer)
            ref = local_experts(layers[layer], x, ids, w)
            out = group.experts(layer, x, ids, w)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


    def test_counts_rounds_and_hotspot(self, ep):
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

