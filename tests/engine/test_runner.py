"""run_workload: arrivals on the step clock, jumps over idle gaps, the submit seam; summarize."""
from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.model.model import build_model
from mixdiag.engine.testbed.runner import run_workload, summarize
from mixdiag.engine.testbed.workload import LengthDist, RequestGroup, Workload, generate

TINY = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, first_k_dense=1, num_heads=4, num_kv_heads=2,
                   head_dim=8, intermediate_size=48, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                   max_model_len=128, dtype="float64")
MODEL = build_model(TINY)


def engine():
    return Engine(EngineConfig(model=TINY, cache=CacheConfig(block_size=4, num_blocks=64),
                               scheduler=SchedulerConfig(max_num_batched_tokens=32), num_threads=1), model=MODEL)


def items(*groups):
    return generate(Workload(groups=groups), 0, TINY.vocab_size, TINY.max_model_len)


def test_arrivals_follow_step_clock_and_idle_gaps_are_skipped():
    wl = items(RequestGroup(name="a", count=1, start=0, prompt_len=LengthDist(value=4), output_len=LengthDist(value=2)),
               RequestGroup(name="b", count=1, start=50, prompt_len=LengthDist(value=4), output_len=LengthDist(value=2)))
    e = engine()
    res = run_workload(e, wl)
    assert [r.kind for r in res.records] == ["prefill", "decode", "prefill", "decode"]
    assert res.submitted == ["a-0", "b-0"] and not res.truncated
    assert [r.step for r in res.records] == [0, 1, 2, 3]


def test_request_joins_running_batch_at_its_step():
    wl = items(RequestGroup(name="a", count=2, prompt_len=LengthDist(value=4), output_len=LengthDist(value=8)),
               RequestGroup(name="b", count=1, start=3, prompt_len=LengthDist(value=10), output_len=LengthDist(value=1)))
    res = run_workload(engine(), wl)
    assert [r.kind for r in res.records][:5] == ["prefill", "decode", "decode", "mixed", "decode"]


def test_max_steps_truncates_and_submit_seam():
    wl = items(RequestGroup(count=3, prompt_len=LengthDist(value=4), output_len=LengthDist(value=20)))
    e, seen = engine(), []

    def submit(prompt, params, **kw):
        seen.append(kw["request_id"])
        return e.add_request(prompt, params, **kw)

    res = run_workload(e, wl, max_steps=4, submit=submit)
    assert len(res.records) == 4 and res.truncated and seen == ["default-0", "default-1", "default-2"]
    s = summarize(e, res, e.timeline(res.records))
    assert s["steps_by_kind"]["prefill"] == 1 and s["requests"]["finished"] == 0 and s["ttft_s"]["count"] == 3
    assert s["itl_s"]["count"] == 3 * 3 and s["output_tokens"] == 12
