"""SM activity: the CPU estimate reproduces the roofline sawtooth and is labelled estimated; NVML path flags quality."""
import sys

import pytest

from mixdiag.engine.config import ModelConfig
from mixdiag.engine.core.records import StepRecord
from mixdiag.engine.telemetry.sm_activity import DeviceModel, NvmlSmSampler, SmEstimator, make_sm_source
from mixdiag.errors import UserError

SMALL = ModelConfig.preset("small")
CAPACITY = 16 * 4096


def step(kind, prefill=0, decode=0, usage=0.05):
    return StepRecord(step=0, t_start_s=0.0, t_end_s=0.01, kind=kind, prefill_tokens=prefill,
                      prefill_reqs=1 if prefill else 0, decode_reqs=decode, decode_rows=decode, kv_usage=usage)


@pytest.fixture
def est():
    return SmEstimator(SMALL, DeviceModel(), kv_capacity_tokens=CAPACITY)


@pytest.mark.parametrize("record,lo,hi", [
    (step("decode", decode=32), 0.0, 0.35),          # memory-bound: weights + KV for 32 rows
    (step("decode", decode=1), 0.0, 0.05),
    (step("prefill", prefill=512), 0.6, 1.0),         # 512 tokens: experts see ~64 each, near the ridge
    (step("prefill", prefill=2048), 0.99, 1.0),       # compute-bound chunk
    (step("mixed", prefill=512, decode=32), 0.6, 1.0),
    (step("idle"), 0.0, 0.0),
])
def test_sawtooth_ranges(est, record, lo, hi):
    assert lo <= est.estimate(record) <= hi


def test_sawtooth_contrast(est):
    decode = est.estimate(step("decode", decode=32))
    assert est.estimate(step("mixed", prefill=512, decode=32)) > 5 * decode


def test_monotone_in_batch_and_writes_estimated(est):
    vals = [est.estimate(step("decode", decode=b)) for b in (1, 8, 32, 128)]
    assert vals == sorted(vals) and vals[0] < vals[-1]
    r = step("decode", decode=32)
    est(r)
    assert r.sm_active == pytest.approx(vals[2]) and r.sm_active_source == "estimated"


def test_cost_arithmetic_matches_hand_count():
    # one dense layer, no MoE: flops = 2*params_per_token*T + 2*lm_head*logits + attention pairs
    m = ModelConfig(vocab_size=100, hidden_size=8, num_layers=1, first_k_dense=1, num_heads=2, num_kv_heads=1,
                    head_dim=4, intermediate_size=16)
    dev = DeviceModel(peak_flops=1e3, mem_bw_bytes_s=1e3, bytes_per_param=2)
    c = SmEstimator(m, dev).cost(prefill_tokens=0, decode_rows=2, logits_rows=2, kv_tokens_held=10)
    attn = 8 * (2 * 4 + 2 * 1 * 4) + 2 * 4 * 8  # qkv + o projections
    mlp = 3 * 8 * 16
    flops = 2 * (attn + mlp) * 2 + 2 * 8 * 100 * 2 + 4 * 2 * 4 * 1 * 10
    nbytes = (attn + mlp + 8 * 100) * 2 + (10 + 2) * (2 * 1 * 1 * 4 * 2)
    assert c.flops == pytest.approx(flops) and c.bytes == pytest.approx(nbytes)
    assert c.sm_active == pytest.approx(min(1.0, (flops / 1e3) / max(flops / 1e3, nbytes / 1e3)))


def test_device_choice():
    assert isinstance(make_sm_source("cpu", SMALL), SmEstimator)
    with pytest.raises(UserError):
        DeviceModel(peak_flops=0)


class FakeNvml:
    """The slice of pynvml the sampler calls; GPM support switchable (pre-Hopper vs Hopper)."""

    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, gpm, util=37):
        self.gpm, self.util, self.freed, self.n = gpm, util, 0, 0

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetHandleByIndex(self, i): return ("dev", i)

    def nvmlGpmQueryDeviceSupport(self, h):
        if not self.gpm:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return type("S", (), {"isSupportedDevice": 1})()

    def nvmlDeviceGetUtilizationRates(self, h): return type("U", (), {"gpu": self.util})()
    def nvmlGpmSampleAlloc(self):
        self.n += 1
        return {"id": self.n, "taken": 0}

    def nvmlGpmSampleGet(self, h, s):
        self.clock = getattr(self, "clock", 0) + 1
        s["taken"] = self.clock

    def nvmlGpmSampleFree(self, s): self.freed += 1

    def c_nvmlGpmMetricsGet_t(self):
        metric = type("M", (), {"metricId": 0, "value": 0.0, "nvmlReturn": 0})()
        return type("R", (), {"metrics": [metric]})()

    def nvmlGpmMetricsGet(self, req):
        assert req.metrics[0].metricId == 2  # NVML_GPM_METRIC_SM_UTIL
        assert req.sample2["taken"] > req.sample1["taken"]  # window: previous read -> now
        req.metrics[0].value = 62.5


@pytest.mark.parametrize("gpm,source,value", [(True, "measured", 0.625), (False, "estimated", 0.37)])
def test_nvml_quality_flags(gpm, source, value):
    nv = FakeNvml(gpm)
    s = NvmlSmSampler(0, nvml=nv)
    for _ in range(3):
        r = step("decode", decode=4)
        s(r)
        assert r.sm_active_source == source and r.sm_active == pytest.approx(value)
    s.close()
    assert nv.freed == (2 if gpm else 0) and nv.n == (2 if gpm else 0)  # two GPM buffers, reused


def test_cuda_without_nvml_falls_back_to_a_labelled_estimate(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as on a machine without nvidia-ml-py
    src = make_sm_source("cuda:0", SMALL, CAPACITY)
    assert isinstance(src, SmEstimator) and src.source == "estimated" and "nvidia-ml-py" in src.note
    with pytest.raises(UserError, match="nvidia-ml-py"):
        make_sm_source("cuda:0", SMALL, require_nvml=True)
