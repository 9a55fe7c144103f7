"""Engine-level properties of speculative decoding, the prefix cache and the micro-batching gate.

* greedy outputs are identical with spec decoding on or off, the prefix cache on or off, under
  every scheduler (and equal to the request run alone);
* no KV block leaks (cached blocks parked for reuse count as free), every ref count back to zero;
* the k = 5 scenario shows 6 rows per decode request, FULL for uniform decode, PIECEWISE when mixed;
* a same-step prefix reader makes the micro-batching gate refuse a split, and the record says so.

Float64 miniature model (as tests/engine/test_properties.py) so rounding cannot flip an argmax.
"""
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.model.model import build_model
from mixdiag.engine.core.request import SamplingParams

TINY = ModelConfig(vocab_size=23, hidden_size=16, num_layers=2, first_k_dense=1, num_heads=2, num_kv_heads=1,
                   head_dim=8, intermediate_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                   max_model_len=128, dtype="float64")
MODEL = build_model(TINY)
POLICIES = ["token_budget", "mix_running", "prefill_first"]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(policy="token_budget", k=0, prefix=False, budget=48, blocks=96, block_size=4, inflight=False,
         microbatch=False):
    sched = SchedulerConfig(policy=policy, max_num_batched_tokens=budget, chunked_prefill_size=budget,
                            num_spec_tokens=k, cudagraph_capture_sizes=(1, 2, 4, 8, 16, 32),
                            enable_microbatching=microbatch, microbatch_min_tokens=2)
    cache = CacheConfig(block_size=block_size, num_blocks=blocks, enable_prefix_caching=prefix,
                        allow_inflight_prefix_hits=inflight)
    return Engine(EngineConfig(model=TINY, cache=cache, scheduler=sched, num_threads=1), model=MODEL)


@functools.lru_cache(maxsize=None)
def alone(prompt: tuple, max_tokens: int) -> tuple:
    e = make()
    rid = e.add_request(list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    e.run()
    return tuple(e.output(rid))


# Prompts drawn from two shared prefixes (so the cache hits) plus a random suffix; low-entropy
# tokens so n-gram drafts are sometimes right.
prefixes = [[3, 4, 5, 3, 4, 5, 6, 7, 8, 9], [11, 12, 11, 12, 13]]
request_st = st.tuples(st.integers(0, 2), st.lists(st.integers(0, 6), min_size=1, max_size=20),
                       st.integers(1, 12), st.integers(0, 6))   # prefix id (2 = none), suffix, max_tokens, arrival


def drive(e, reqs):
    ids, recs, pending, step = {}, [], sorted(range(len(reqs)), key=lambda i: reqs[i][3]), 0
    while pending or e.has_unfinished():
        while pending and reqs[pending[0]][3] <= step:
            i = pending.pop(0)
            ids[i] = e.add_request(prompt_of(reqs[i]), SamplingParams(max_tokens=reqs[i][2], ignore_eos=True))
        rec = e.step()
        recs.append(rec)
        assert rec.total_tokens <= rec.token_budget
        step += 1
        assert step < 3000, "no progress"
    return ids, recs


def prompt_of(r):
    pid, suffix, _, _ = r
    return (prefixes[pid] if pid < 2 else []) + list(suffix)


def assert_no_leak(e):
    kv = e.kv_manager
    assert kv.num_free_blocks == e.config.cache.num_blocks
    assert not any(kv.pool.ref_counts) and not kv.block_ids


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(reqs=st.lists(request_st, min_size=1, max_size=6), k=st.sampled_from([0, 1, 3, 5]), prefix=st.booleans(),
       inflight=st.booleans(), budget=st.integers(12, 48), block_size=st.sampled_from([2, 4]))
def test_greedy_outputs_identical_with_spec_and_prefix_cache(policy, reqs, k, prefix, inflight, budget, block_size):
    # inflight: vLLM-style hits on blocks written in the same step; a whole step writes every KV
    # before any attention read, so those hits are correct too
    e = make(policy, k=k, prefix=prefix, budget=budget, block_size=block_size, inflight=inflight)
    ids, recs = drive(e, reqs)
    for i, r in enumerate(reqs):
        assert tuple(e.output(ids[i])) == alone(tuple(prompt_of(r)), r[2]), (policy, k, prefix)
    assert_no_leak(e)
    if k:
        for rec in recs:   # a decode request with drafts contributes its 1 + d verification rows
            assert rec.decode_rows >= rec.decode_reqs
            assert rec.spec_accepted_tokens <= rec.spec_draft_tokens
    if prefix:
        assert sum(rec.prefix_hit_tokens for rec in recs) <= sum(rec.prefix_query_tokens for rec in recs)


@SETTINGS
@given(reqs=st.lists(request_st, min_size=2, max_size=6), blocks=st.integers(23, 36))
def test_small_pool_with_spec_and_prefix_cache_preempts_and_outputs_hold(reqs, blocks):
    # blocks >= 23: any single request (<= 30 prompt + 12 output + 3 draft tokens, block_size 2) fits alone
    e = make("token_budget", k=3, prefix=True, budget=32, blocks=blocks, block_size=2)
    ids, _ = drive(e, reqs)
    for i, r in enumerate(reqs):
        assert tuple(e.output(ids[i])) == alone(tuple(prompt_of(r)), r[2])
    assert_no_leak(e)


def test_prefix_cache_hits_recorded_and_skip_computation():
    e = make(prefix=True, budget=64)
    shared = list(range(1, 17))                     # 4 full blocks of 4
    a = e.add_request(shared + [2], SamplingParams(max_tokens=3, ignore_eos=True))
    e.run()
    b = e.add_request(shared + [3, 4], SamplingParams(max_tokens=3, ignore_eos=True))
    rec = e.step()
    assert rec.prefix_hit_tokens == 16 and rec.prefix_query_tokens == 18
    assert rec.prefill_tokens == 2                  # only the suffix is computed
    e.run()
    assert tuple(e.output(b)) == alone(tuple(shared + [3, 4]), 3)
    assert tuple(e.output(a)) == alone(tuple(shared + [2]), 3)
    assert_no_leak(e)


def test_same_step_prefix_reader_refuses_microbatch_split():
    """Two requests with one prefix admitted in the same step, vLLM-style in-flight hits allowed:
    the second reads blocks the first is writing, so the gate refuses to split the step."""
    e = make(prefix=True, budget=64, inflight=True, microbatch=True)
    shared = list(range(1, 17))
    e.add_request(shared + [2], SamplingParams(max_tokens=2, ignore_eos=True))
    e.add_request(shared + [3, 4, 5], SamplingParams(max_tokens=2, ignore_eos=True))
    rec = e.step()
    assert rec.prefix_hit_tokens == 16
    assert not rec.ubatch_split and rec.ubatch_reason == "prefix_readers"
    e.run()
    # run whole, the step wrote the shared blocks before the second request read them
    assert [tuple(e.output(r)) for r in ("req-0", "req-1")] == [alone(tuple(shared + [2]), 2),
                                                               alone(tuple(shared + [3, 4, 5]), 2)]
    # with the in-flight-block rule (default), the second request gets no hit and the split goes ahead
    e2 = make(prefix=True, budget=64, microbatch=True)
    e2.add_request(shared + [2], SamplingParams(max_tokens=2, ignore_eos=True))
    e2.add_request(shared + [3, 4, 5], SamplingParams(max_tokens=2, ignore_eos=True))
    rec2 = e2.step()
    assert rec2.prefix_hit_tokens == 0 and rec2.ubatch_split and rec2.ubatch_reason == "split"


def test_sampling_with_spec_runs_and_counts_acceptance():
    e = make(k=3)
    ids = [e.add_request([1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=20, temperature=0.8, seed=s, ignore_eos=True))
           for s in range(4)]
    recs = e.run()
    assert all(len(e.output(i)) == 20 for i in ids)
    assert sum(r.spec_draft_tokens for r in recs) > 0
    assert_no_leak(e)


def test_spec_decode_scenario_rows_and_graph_modes():
    from mixdiag.engine.testbed.scenario import load
    from mixdiag.engine.testbed.workload import generate

    sc = load("spec-decode")
    assert sc.engine.scheduler.num_spec_tokens == 5
    e = Engine(sc.engine)
    items = generate(sc.workload, sc.seed, sc.engine.model.vocab_size, sc.engine.model.max_model_len)
    pending = sorted(items, key=lambda w: w.arrival)
    recs = []
    for step in range(18):          # past the burst's prefill and into the first long prompt (step 12)
        while pending and pending[0].arrival <= step:
            w = pending.pop(0)
            e.add_request(w.prompt, w.params)
        recs.append(e.step())
    decode = [r for r in recs if r.kind == "decode"]
    mixed = [r for r in recs if r.kind == "mixed"]
    assert decode and mixed
    assert all(r.decode_rows == 6 * r.decode_reqs for r in decode + mixed)
    assert all(r.graph_mode == "FULL" and r.graph_bucket >= r.decode_rows for r in decode)
    assert all(r.graph_mode == "PIECEWISE" for r in mixed)
    assert not any(r.graph_replayed for r in recs)            # CPU: planned, never replayed
    # the shared system prompt: every chat request but those admitted with the first (in flight)
    assert sum(r.prefix_hit_tokens for r in recs) >= 24 * 96


@pytest.mark.parametrize("draft_slots,want", [(0, [32]), (4, [28]), (10, [22])])
def test_token_budget_reserves_draft_slots(draft_slots, want):
    """vLLM: num_new_tokens = min(need, token_budget, input_budget - draft_slots), and each
    scheduled request uses n + draft_slots input slots."""
    sched = SchedulerConfig(max_num_batched_tokens=32, draft_slots=draft_slots, cudagraph_capture_sizes=(8,))
    e = Engine(EngineConfig(model=TINY, cache=CacheConfig(block_size=4, num_blocks=64), scheduler=sched,
                            num_threads=1), model=MODEL)
    e.add_request([i % 20 for i in range(40)], SamplingParams(max_tokens=2))
    e.add_request([5] * 10, SamplingParams(max_tokens=2))
    rec = e.step()
    assert list(rec.num_scheduled_tokens.values()) == want   # the second prompt finds no input slots left
