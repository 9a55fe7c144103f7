"""Policy-specific behaviour of the three schedulers."""
import pytest

from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.model.model import build_model
from mixdiag.engine.core.request import SamplingParams
from mixdiag.engine.core.schedulers import ForwardMode

TINY = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, first_k_dense=1, num_heads=4, num_kv_heads=2,
                   head_dim=8, intermediate_size=48, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                   max_model_len=256, dtype="float64")
MODEL = build_model(TINY)
LONG = SamplingParams(max_tokens=30, ignore_eos=True)


def engine(policy, blocks=128, **sched):
    cfg = EngineConfig(model=TINY, cache=CacheConfig(block_size=4, num_blocks=blocks),
                       scheduler=SchedulerConfig(policy=policy, **sched), num_threads=1)
    return Engine(cfg, model=MODEL)


def with_decodes(e, n=3):
    """n requests past their prefill, decoding."""
    ids = [e.add_request([i + 1, 2, 3], LONG) for i in range(n)]
    e.step()
    assert all(e.request(i).is_decode for i in ids)
    return ids


def test_token_budget_decodes_first_then_chunks():
    e = engine("token_budget", max_num_batched_tokens=20)
    with_decodes(e)
    e.add_request(list(range(1, 41)), LONG)
    r1, r2, r3 = e.step(), e.step(), e.step()
    assert [(r.kind, r.decode_rows, r.prefill_tokens) for r in (r1, r2, r3)] == \
        [("mixed", 3, 17), ("mixed", 3, 17), ("mixed", 3, 6)]
    assert all(r.total_tokens <= 20 for r in (r1, r2, r3))


def test_token_budget_long_prefill_threshold():
    e = engine("token_budget", max_num_batched_tokens=64, long_prefill_token_threshold=8)
    a = e.add_request(list(range(1, 30)), LONG)
    b = e.add_request(list(range(1, 30)), LONG)
    r = e.step()
    assert r.num_scheduled_tokens == {a: 8, b: 8}


def test_prefill_first_never_mixes_and_stalls_decodes():
    e = engine("prefill_first", max_num_batched_tokens=16)
    with_decodes(e)
    e.add_request(list(range(1, 41)), LONG)
    kinds = [e.step().kind for _ in range(4)]
    assert kinds == ["prefill", "prefill", "prefill", "decode"]


def test_mix_running_mixes_as_one_token_extends():
    e = engine("mix_running", chunked_prefill_size=16)
    dec = with_decodes(e)
    e.add_request(list(range(1, 41)), LONG)
    r = e.step()
    assert r.forward_mode == ForwardMode.MIXED.value and r.kind == "mixed"
    assert all(r.num_scheduled_tokens[d] == 1 for d in dec)
    assert r.prefill_tokens == 16 - 3 and r.total_tokens == 16      # decode rows reserved out of the chunk


@pytest.mark.parametrize("flag", ["logprobs", "input_embeds", "beam"])
def test_mix_running_refuses_to_mix(flag):
    e = engine("mix_running", chunked_prefill_size=16)
    kw, params = {}, LONG
    if flag == "logprobs":
        params = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=True)
    elif flag == "input_embeds":
        kw["has_input_embeds"] = True
    dec = [e.add_request([1, 2, 3], LONG, beam_group="g" if flag == "beam" else None)]
    e.step()
    e.add_request(list(range(1, 41)), params, **kw)
    r = e.step()
    assert r.kind == "prefill" and r.forward_mode == "EXTEND" and dec[0] not in r.num_scheduled_tokens


def test_mix_running_check_decode_mem_keeps_decodes_out():
    # 3 decoders hold 1 block each with 3 of 4 slots used; their next token fits in place, so make them
    # need a fresh block: prompts of 4 tokens fill a block exactly.
    e = engine("mix_running", blocks=9, chunked_prefill_size=40)
    dec = [e.add_request([i + 1, 2, 3, 4], LONG) for i in range(3)]
    e.step()                                       # 3 blocks used, 6 free; each decode needs a new block
    e.add_request(list(range(1, 21)), SamplingParams(max_tokens=1, ignore_eos=True))   # 20 tokens: 5 blocks
    r = e.step()
    assert r.kind == "prefill" and not set(dec) & set(r.num_scheduled_tokens)
    assert r.forward_mode == "EXTEND"


def test_mix_running_without_mixed_chunk():
    e = engine("mix_running", chunked_prefill_size=16, enable_mixed_chunk=False)
    with_decodes(e)
    e.add_request(list(range(1, 41)), LONG)
    assert [e.step().kind for _ in range(3)] == ["prefill"] * 3


@pytest.mark.parametrize("policy", ["token_budget", "mix_running", "prefill_first"])
def test_preemption_by_recompute_gives_same_output(policy):
    prompts = [[i + 1] * 6 for i in range(4)]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    roomy = engine(policy)
    want = roomy.generate(prompts, params)
    tight = engine(policy, blocks=16)              # 4 requests x 26 tokens need 28 blocks: preemption
    ids = [tight.add_request(p, params) for p in prompts]
    recs = tight.run()
    assert sum(r.preempted_reqs for r in recs) > 0
    assert [tight.output(i) for i in ids] == want
    assert tight.kv_manager.num_free_blocks == 16
