"""Correctness properties of every scheduler, over random arrivals, prompts, budgets and pool sizes.

* a request's greedy output is the same alone as mixed into any batch (and after preemption);
* no step exceeds its token budget; long prefills respect ``long_prefill_token_threshold``;
* every KV block is back in the pool once all requests finished or were aborted.

The model is a float64 miniature so batch-shape-dependent rounding cannot flip an argmax.
"""
import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.model.model import build_model
from mixdiag.engine.core.request import SamplingParams, Status

TINY = ModelConfig(vocab_size=61, hidden_size=16, num_layers=2, first_k_dense=1, num_heads=2, num_kv_heads=1,
                   head_dim=8, intermediate_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                   max_model_len=128, dtype="float64")
MODEL = build_model(TINY)
POLICIES = ["token_budget", "mix_running", "prefill_first"]
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(policy, budget=512, thr=0, blocks=256, block_size=4, mixed=True):
    sched = SchedulerConfig(policy=policy, max_num_batched_tokens=budget, chunked_prefill_size=budget,
                            long_prefill_token_threshold=thr, enable_mixed_chunk=mixed,
                            cudagraph_capture_sizes=(1, 2, 4, 8))
    cfg = EngineConfig(model=TINY, cache=CacheConfig(block_size=block_size, num_blocks=blocks), scheduler=sched,
                       num_threads=1)
    return Engine(cfg, model=MODEL)


@functools.lru_cache(maxsize=None)
def alone(prompt: tuple, max_tokens: int) -> tuple:
    e = make("token_budget")
    rid = e.add_request(list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    e.run()
    return tuple(e.output(rid))


requests_st = st.lists(st.tuples(st.lists(st.integers(0, TINY.vocab_size - 1), min_size=1, max_size=40),
                                 st.integers(1, 6), st.integers(0, 8)),   # prompt, max_tokens, arrival step
                       min_size=1, max_size=6)


def drive(e, reqs, aborts=()):
    """Add requests at their arrival steps, abort some; check per-step invariants; return ids and records."""
    ids, recs, pending = {}, [], sorted(range(len(reqs)), key=lambda i: reqs[i][2])
    step = 0
    while pending or e.has_unfinished():
        while pending and reqs[pending[0]][2] <= step:
            i = pending.pop(0)
            p, n, _ = reqs[i]
            ids[i] = e.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
        for i in aborts:
            if i in ids and step == reqs[i][2] + 1:
                e.abort(ids[i])
        r = e.step()
        recs.append(r)
        assert r.total_tokens <= r.token_budget, (r.total_tokens, r.token_budget)
        step += 1
        assert step < 2000, "engine made no progress"
    return ids, recs


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(reqs=requests_st, budget=st.integers(8, 48), thr=st.sampled_from([0, 0, 5, 16]),
       block_size=st.sampled_from([2, 4, 8]), mixed=st.booleans())
def test_greedy_output_same_alone_and_mixed(policy, reqs, budget, thr, block_size, mixed):
    e = make(policy, budget=budget, thr=thr, block_size=block_size, mixed=mixed)
    ids, recs = drive(e, reqs)
    for i, (p, n, _) in enumerate(reqs):
        assert tuple(e.output(ids[i])) == alone(tuple(p), n)
    assert e.kv_manager.num_free_blocks == e.config.cache.num_blocks
    if policy == "token_budget" and thr:
        assert all(n <= thr for r in recs for rid, n in r.num_scheduled_tokens.items())
    if policy == "prefill_first":
        assert not any(r.kind == "mixed" for r in recs)


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(reqs=requests_st, budget=st.integers(8, 48), blocks=st.integers(24, 40))
def test_small_pool_preempts_and_outputs_hold(policy, reqs, budget, blocks):
    # blocks >= 24: any single request (<= 46 tokens, block_size 2) fits the pool alone
    e = make(policy, budget=budget, blocks=blocks, block_size=2)
    ids, recs = drive(e, reqs)
    for i, (p, n, _) in enumerate(reqs):
        assert tuple(e.output(ids[i])) == alone(tuple(p), n)
    assert e.kv_manager.num_free_blocks == blocks


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(reqs=requests_st, budget=st.integers(8, 48), data=st.data())
def test_aborts_leak_no_blocks(policy, reqs, budget, data):
    aborts = data.draw(st.sets(st.integers(0, len(reqs) - 1)))
    e = make(policy, budget=budget, blocks=64)
    ids, _ = drive(e, reqs, aborts)
    assert e.kv_manager.num_free_blocks == 64 and not e.has_unfinished()
    for i, rid in ids.items():
        assert e.request(rid).status.finished
        if i not in aborts:
            assert e.request(rid).status == Status.FINISHED_LENGTH
            assert tuple(e.output(rid)) == alone(tuple(reqs[i][0]), reqs[i][1])
