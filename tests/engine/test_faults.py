"""Fault injection: config parsing, and each fault doing real work in a real engine."""
import time

import pytest
import torch

from mixdiag.engine.config import ConfigError, EngineConfig, ModelConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.testbed.faults import FaultInjector, FaultsConfig
from mixdiag.engine.core.request import SamplingParams
from mixdiag.engine.testbed.truth import TruthRecorder

SMALL = ModelConfig(hidden_size=64, num_layers=3, first_k_dense=1, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=96, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                    vocab_size=128, max_model_len=512)


def _run(table, n_req=12, prompt=24, max_tokens=12, steps=None, **cfg):
    faults = FaultsConfig.from_dict(table)
    eng = Engine(faults.apply(EngineConfig(model=SMALL, num_threads=1, **cfg)))
    with FaultInjector(eng, faults) as inj:
        truth = TruthRecorder(eng, inj)
        inj.seen_by_later_observer = []  # an observer attached first, as instrumentation does (it prepends)
        eng.observers.insert(0, lambda rec: inj.seen_by_later_observer.append(rec.expert_imbalance))
        g = torch.Generator().manual_seed(0)
        for i in range(n_req):
            inj.add_request(torch.randint(2, 128, (prompt,), generator=g).tolist(),
                            SamplingParams(max_tokens=max_tokens + i, ignore_eos=True))
        recs = eng.run(max_steps=steps)
        return eng, inj, truth, recs


@pytest.mark.parametrize("table, msg", [
    ({"nope": {}}, "unknown fault 'nope'"),
    ({"host_stall": {"windows": [[5, 3]]}}, "start < end"),
    ({"host_stall": {"windows": "x"}}, "windows must be"),
    ({"host_stall": {"how": "spin"}}, "sleep or gc"),
    ({"host_stall": {"bogus": 1}}, "unknown key 'bogus'"),
    ({"ep_hotspot": {"world_size": 1}}, "world_size"),
    ({"ep_hotspot": {"hot_rank": 4}}, "hot_rank"),
    ({"pd_transfer": {"mode": "later"}}, "mode"),
    ({"pd_transfer": {"every": 0}}, "every"),
    ({"graph_miss": {"capture_sizes": []}}, "capture_sizes"),
    ({"kv_pressure": {"num_blocks": 0}}, "num_blocks"),
    ({"kv_pressure": 3}, "must be a table"),
    ({"kv_pressure": {"instances": []}}, "instances must be"),
])
def test_faults_config_rejects_bad_tables(table, msg):
    with pytest.raises(ConfigError, match=msg):
        FaultsConfig.from_dict(table)


def test_faults_config_parses_and_applies():
    f = FaultsConfig.from_dict({"graph_miss": {"capture_sizes": [16, 4, 4, 8]}, "kv_pressure": {"num_blocks": 64},
                                "host_stall": {"windows": [[3, 9]], "every": 2}})
    assert f.active == ["graph_miss", "kv_pressure", "host_stall"]
    assert f.graph_miss.capture_sizes == (4, 8, 16) and f.host_stall.windows == ((3, 9),)
    cfg = f.apply(EngineConfig())
    assert cfg.scheduler.cudagraph_capture_sizes == (4, 8, 16) and cfg.cache.num_blocks == 64
    assert FaultsConfig.from_dict(None).active == []
    scoped = FaultsConfig.from_dict({"kv_pressure": {"num_blocks": 64, "instances": ["engine1"]},
                                     "host_stall": {"windows": [[1, 2]]}})
    assert scoped.for_instance("engine0").active == ["host_stall"]
    assert scoped.for_instance("engine1").active == ["kv_pressure", "host_stall"]


def test_host_stall_pauses_between_steps_in_window():
    eng, inj, truth, recs = _run({"host_stall": {"windows": [[4, 10]], "every": 2, "stall_s": 0.05}}, steps=14)
    assert sorted(inj.state.stalled_steps) == [4, 6, 8]
    gaps = {r.step: r.t_start_s - p.t_end_s for p, r in zip(recs, recs[1:])}
    assert all(gaps[s] >= 0.05 for s in (4, 6, 8))
    assert all(gaps[s] < 0.05 for s in gaps if s not in (4, 6, 8))
    assert {s for _, s, c in truth.rows if c == "host_stall"} == {4, 6, 8}


def test_host_stall_gc_collects_real_garbage():
    eng, inj, truth, recs = _run({"host_stall": {"windows": [[2, 3]], "how": "gc", "garbage_objects": 100_000}},
                                 steps=4)
    assert list(inj.state.stalled_steps) == [2] and inj.state.stalled_steps[2] > 0.005


def test_graph_miss_plans_none_and_pays_eager_launches():
    # 12 decodes > the largest captured size 8: decode steps run eager
    eng, inj, truth, recs = _run({"graph_miss": {"capture_sizes": [1, 2, 4, 8], "launch_overhead_s": 0.002}},
                                 steps=16)
    dec = [r for r in recs if r.kind == "decode"]
    none = [r for r in dec if r.graph_mode == "NONE"]
    full = [r for r in dec if r.graph_mode == "FULL"]
    assert none and full  # the batch shrinks below 8 as requests finish
    assert {s for _, s, c in truth.rows if c == "graph_fallback"} == {r.step for r in none}
    leaf = sum(1 for m in eng.model.modules() if not list(m.children()))
    # an eager step pauses once per leaf module call, a FULL step once
    assert min(r.forward_s for r in none) >= 0.002 * (leaf - 2)
    assert max(r.forward_s for r in none) > 2 * max(r.forward_s for r in full)


def test_kv_pressure_preempts_and_truth_names_it():
    eng, inj, truth, recs = _run({"kv_pressure": {"num_blocks": 22}}, n_req=10, prompt=40, max_tokens=30)
    assert sum(r.preempted_reqs for r in recs) > 0
    kv_steps = {s for _, s, c in truth.rows if c == "kv_pressure"}
    assert {r.step for r in recs if r.preempted_reqs} <= kv_steps
    assert len(kv_steps) > sum(1 for r in recs if r.preempted_reqs)  # recompute steps too
    assert not eng.has_unfinished() and eng.kv_manager.num_free_blocks == 22


def test_ep_hotspot_window_skews_ranks():
    eng, inj, truth, recs = _run({"ep_hotspot": {"world_size": 4, "windows": [[6, 10]], "strength": 30.0}},
                                 steps=14)
    inside = [r for r in recs if 6 <= r.step < 10]
    outside = [r for r in recs if r.step >= 2 and not 6 <= r.step < 10]
    assert all(r.expert_imbalance == pytest.approx(4.0) for r in inside)
    assert all(r.per_rank_tokens[0] == 0 and r.per_rank_tokens[1] > 0 for r in inside)
    assert max(r.expert_imbalance for r in outside) < 2.0
    assert {s for _, s, c in truth.rows if c == "ep_hotspot"} == {6, 7, 8, 9}
    assert all(r.expert_imbalance == seen for r, seen in zip(recs, inj.seen_by_later_observer))
    assert all(float(m.router_bias.abs().sum()) == 0 for m in eng.model.moe_layers)  # window closed


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_pd_transfer_matches_local_engine_and_counts_bytes(mode):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 128, (n,), generator=g).tolist() for n in (30, 7, 55, 18, 40, 12)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    local = Engine(EngineConfig(model=SMALL, num_threads=1)).generate(prompts, params)

    faults = FaultsConfig.from_dict({"pd_transfer": {"mode": mode, "every": 2}})
    eng = Engine(faults.apply(EngineConfig(model=SMALL, num_threads=1)))
    with FaultInjector(eng, faults) as inj:
        truth = TruthRecorder(eng, inj)
        ids = [inj.add_request(p, params) for p in prompts]
        recs = eng.run()
        outs = [eng.output(i) for i in ids]
        remote_lens = list(inj.pd.transferred_prompt_lens)
    assert outs == local
    assert sorted(remote_lens) == sorted(len(p) for p in prompts[::2])  # every 2nd request went remote
    moved = sum(r.kv_transfer_bytes for r in recs)
    assert moved == sum((n - 1) * SMALL.kv_bytes_per_token for n in remote_lens)
    pd_steps = {r.step for r in recs if r.kv_transfer_bytes > 0}
    assert pd_steps and {s for _, s, c in truth.rows if c == "pd_transfer"} == pd_steps
    assert all(r.kv_transfer_s > 0 for r in recs if r.kv_transfer_bytes > 0)
    assert eng.kv_manager.num_free_blocks == eng.config.cache.num_blocks
