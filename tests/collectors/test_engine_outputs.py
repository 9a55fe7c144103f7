"""The text collectors on what the reference engine really writes: engine.log in vLLM and SGLang
formats and timed /metrics scrapes; what they read back matches the engine's own step records."""
import pytest

from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.collectors.logs import sglang_log
from mixdiag.collectors.logs import vllm_log
from mixdiag.engine.config import EngineConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.telemetry.instrumentation import Instrumentation, InstrumentationConfig
from mixdiag.engine.core.request import SamplingParams

KINDS = ("prefill", "decode", "mixed", "idle")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    eng = Engine(EngineConfig(num_threads=1))
    for i in range(6):
        eng.add_request(list(range(2, 40 + 24 * i)), SamplingParams(max_tokens=50))
    inst = Instrumentation(InstrumentationConfig(log_formats=("vllm", "sglang"), decode_log_interval=5,
                                                 scrape_interval_s=0.02), eng, out)
    records = []
    while eng.has_unfinished():
        records.append(eng.step())
    inst.close()
    return out, records


def test_vllm_iteration_lines_give_the_engines_steps(run):
    out, records = run
    tl = vllm_log.read(out / "engine.log", instance="engine0")
    busy = [r for r in records if r.kind != "idle"]  # vLLM logs no line for an idle step
    s = tl.steps
    assert list(s["kind"]) == [r.kind for r in busy]
    assert list(s["prefill_tokens"]) == [r.prefill_tokens for r in busy]
    assert list(s["decode_reqs"]) == [r.decode_reqs for r in busy]
    assert (s["granularity"] == "step").all()
    assert {"mixed", "decode"} <= set(s["kind"])
    src = tl.meta["sources"][0]
    assert src["lines_parsed"] == len(busy) and src["lines_skipped"] == 0  # SGLang lines ignored


def test_sglang_lines_give_the_engines_prefill_steps(run):
    out, records = run
    tl = sglang_log.read(out / "engine.log", instance="engine0", enable_mixed_chunk=True)
    s = tl.steps
    with_prefill = [r for r in records if r.prefill_tokens > 0]
    pre = s[s["kind"].isin(["prefill", "mixed"])]
    assert list(pre["prefill_tokens"]) == [r.prefill_tokens for r in with_prefill]
    # with mixed chunk on, a Prefill line with running decodes is inferred mixed; the engine
    # (token-budget scheduler) folds every running decode into the step, so the inference holds
    assert list(pre["kind"]) == [r.kind for r in with_prefill]
    assert tl.meta["signals"]["engine0"]["kind"] == "inferred"
    decode_steps = sum(r.kind == "decode" for r in records)
    assert (s["kind"] == "decode").sum() == decode_steps // 5  # one Decode line per 5 decode steps


def test_timed_scrapes_give_interval_counts(run):
    out, records = run
    tl = scrape_reader.read(out / "scrapes", instance="engine0")
    first = scrape_reader.read(sorted((out / "scrapes").glob("*.prom"), key=lambda p: float(p.stem))[0], t_s=0.0)
    base = first.series[first.series["name"] == "mixdiag_engine_steps_total"]
    at_first = {lab.split("=")[1]: v for lab, v in zip(base["labels"], base["value"])}
    s = tl.steps
    assert len(s) >= 2 and (s["granularity"] == "interval").all()
    for k in KINDS:
        # everything after the first scrape is in the intervals: the run total minus what the first saw
        assert s[f"{k}_steps"].sum() == sum(r.kind == k for r in records) - at_first.get(k, 0.0), k
    assert s["t_start_s"].is_monotonic_increasing
