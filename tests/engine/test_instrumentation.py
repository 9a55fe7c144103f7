"""Instrumentation on a real engine: files of the run directory, observer order, detach, multi-instance."""
import io
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.prometheus_server import free_port

from mixdiag.engine.config import EngineConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.hooks import NULL_TRACER
from mixdiag.engine.telemetry.instrumentation import Instrumentation, InstrumentationConfig
from mixdiag.engine.telemetry.metrics import EngineMetrics
from mixdiag.engine.telemetry.nvtx_tracer import NvtxTracer
from mixdiag.engine.core.request import SamplingParams
from mixdiag.engine.telemetry.sm_activity import SmEstimator
from mixdiag.errors import UserError


def small_engine(instance="engine0", n=4, max_tokens=6):
    eng = Engine(EngineConfig(num_threads=1, instance=instance))
    for i in range(n):
        eng.add_request(list(range(2, 30 + 40 * i)), SamplingParams(max_tokens=max_tokens))
    return eng


def prom_steps(path):
    for fam in text_string_to_metric_families(path.read_text()):
        if fam.name == "mixdiag_engine_steps":
            return {s.labels["kind"]: s.value for s in fam.samples if s.name.endswith("_total")}


def test_everything_on(tmp_path):
    eng = small_engine()
    seen = []
    before = seen.append  # an observer that was there first keeps running, after ours
    eng.observers.append(before)
    cfg = InstrumentationConfig(log_formats=("vllm", "sglang"), decode_log_interval=1, profile=(1, 3),
                                scrape_interval_s=0.05)
    inst = Instrumentation(cfg, eng, tmp_path)
    assert isinstance(eng.observers[0], SmEstimator) and isinstance(eng.observers[1], EngineMetrics)
    assert eng.observers[-1] is before and isinstance(eng.tracer, NvtxTracer)
    records = eng.run()
    summary = inst.close()
    assert eng.observers == [before] and eng.tracer is NULL_TRACER  # detached
    assert seen == records and records[0].sm_active_source == "estimated"
    busy = [r for r in records if r.kind != "idle"]
    log = (tmp_path / "engine.log").read_text().splitlines()
    assert sum("Iteration(" in l for l in log) == len(busy) == summary["log_lines"] - sum("batch," in l for l in log) - 1
    assert "server_args=ServerArgs(" in log[0] and "enable_mixed_chunk=True" in log[0]  # token_budget mixes
    trace = json.loads((tmp_path / "trace.json").read_text())
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("step "))
    assert [s.split()[1] for s in steps] == ["1", "2"] and summary["profile"]["partial"] is False
    counts = prom_steps(tmp_path / "metrics.prom")
    assert counts == {k: float(sum(r.kind == k for r in records)) for k in ("prefill", "decode", "mixed", "idle")}
    assert summary["scrapes"] >= 1 and list((tmp_path / "scrapes").glob("*.prom"))
    # the SM estimate reached the records and the Timeline says it is an estimate
    assert all(0.0 <= r.sm_active <= 1.0 for r in records)
    tl = eng.timeline(records, meta={"signals": {"engine0": inst.signals()}})
    assert tl.signal_quality("engine0", "sm_active") == "estimated" and tl.steps["sm_active"].notna().all()


def test_defaults_write_only_metrics_prom(tmp_path):
    eng = small_engine(n=2, max_tokens=3)
    inst = Instrumentation(InstrumentationConfig(), eng, tmp_path)
    eng.run()
    inst.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.prom"]


def test_no_nvtx_keeps_kineto_for_a_profile(tmp_path):
    eng = small_engine(n=2, max_tokens=3)
    inst = Instrumentation(InstrumentationConfig(nvtx=False, profile=(0, 2)), eng, tmp_path)
    assert not eng.tracer.nvtx_active and eng.tracer.kineto
    eng.run()
    inst.close()
    names = {e.get("name") for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert "forward" in names and any(str(n).startswith("step 0 ") for n in names)
    eng2 = small_engine(n=1, max_tokens=2)
    Instrumentation(InstrumentationConfig(nvtx=False), eng2).close()
    assert eng2.tracer is NULL_TRACER


def test_second_instance_names_and_shared_log(tmp_path):
    sink = io.StringIO()
    insts = []
    for rank in (0, 1):
        eng = small_engine(instance=f"engine{rank}", n=2, max_tokens=3)
        inst = Instrumentation(InstrumentationConfig(log_formats=("sglang", "vllm"), decode_log_interval=1,
                                                     profile=(0, 1), scrape_interval_s=10.0),
                               eng, tmp_path, multi_instance=True, shared_dir=True, log_sink=sink)
        eng.run()
        insts.append(inst.close())
    names = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {"metrics.prom", "metrics.engine1.prom", "trace.json", "trace.engine1.json"} <= names
    assert any(n.startswith("scrapes/engine1/") for n in names)
    text = sink.getvalue()
    assert "EngineCore_DP1 " in text and " DP1 TP1] " in text and "EngineCore_DP0 " in text
    assert "engine.log" not in names  # the shared stream took the lines
    eng = small_engine(instance="engine2", n=1, max_tokens=2)
    inst = Instrumentation(InstrumentationConfig(log_formats=("vllm",)), eng, tmp_path, shared_dir=True)
    eng.run()
    inst.close()
    assert "EngineCore_DP2 " in (tmp_path / "engine.engine2.log").read_text()  # own file without a shared sink


@pytest.mark.parametrize("kw,msg", [
    (dict(linger_s=1.0), "--linger needs --serve"),
    (dict(scrape_interval_s=0.0), "--scrape-interval"),
    (dict(serve_port=70000), "--serve port"),
    (dict(linger_s=-1.0, serve_port=0), "--linger must be"),
    (dict(decode_log_interval=0), "decode_log_interval"),
])
def test_config_validation(kw, msg):
    with pytest.raises(UserError, match=msg):
        InstrumentationConfig(**kw)


def test_outputs_need_a_directory():
    with pytest.raises(UserError, match="output directory"):
        Instrumentation(InstrumentationConfig(log_formats=("vllm",)), small_engine(n=1))


def test_own_directory_instance_keeps_contract_names_and_offsets_the_port(tmp_path):
    eng = small_engine(instance="engine1", n=1, max_tokens=2)
    inst = Instrumentation(InstrumentationConfig(serve_port=0, log_formats=("vllm",), profile=(0, 1)), eng, tmp_path)
    assert inst.rank == 1
    eng.run()
    inst.close()
    assert {p.name for p in tmp_path.iterdir()} == {"engine.log", "trace.json", "metrics.prom"}
    assert "(EngineCore_DP1 " in (tmp_path / "engine.log").read_text()
    port = free_port()  # engine3 serves on PORT + 3
    probe = small_engine(instance="engine3", n=1, max_tokens=1)
    with Instrumentation(InstrumentationConfig(serve_port=port - 3), probe) as i3:
        assert i3.server.port == port
