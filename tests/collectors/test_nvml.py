"""nvml: the CSV reader, and the sampler's GPM/utilization choice with a stand-in for pynvml.

The sampler needs a GPU and a driver; only that part uses a fake NVML module (this machine has none).
"""
import io
import math
import sys
import types

import pandas as pd
import pytest

from mixdiag import gpu_probe
from mixdiag.collectors.gpu import nvml
from mixdiag.errors import UserError

CSV = """t_s,gpu_index,gpu_uuid,metric,value
100.0,0,GPU-a,gpm_sm_util,0.250000
101.0,0,GPU-a,gpm_sm_util,0.750000
102.0,0,GPU-a,gpm_sm_util,nan
oops,0,GPU-a,gpm_sm_util,0.5
103.0,0,GPU-a,gpm_sm_util,1.5
104.0,0,GPU\ra,gpm_sm_util,0.5

"""


def test_reader_counts_and_maps_onto_steps():
    steps = pd.DataFrame({"instance": ["e"] * 2, "step": [0, 1], "t_start_s": [100.5, 100.5], "t_end_s": [100.5, 101.0],
                          "granularity": ["step"] * 2, "kind": ["decode", "mixed"]})
    tl = nvml.read(io.StringIO(CSV), steps=steps)
    src = tl.meta["sources"][0]
    # 8 lines: header + blank ignored, 3 parsed (the NaN one is read as 'no value'), 3 skipped (found by the fuzzer:
    # a stray CR inside a line)
    assert (src["lines_total"], src["lines_parsed"], src["lines_skipped"], src["lines_ignored"]) == (8, 3, 3, 2)
    assert list(tl.steps["sm_active"]) == pytest.approx([0.75, 0.75])
    assert tl.meta["signals"]["e"]["sm_active"] == "measured" and tl.meta["partial"] is True
    assert len(tl.series) == 2


def test_utilization_is_flagged_weaker():
    text = "t_s,gpu_index,gpu_uuid,metric,value\n1.0,0,GPU-a,gpu_util,1.0\n"
    tl = nvml.read(io.StringIO(text), instance="g")
    assert tl.meta["signals"]["g"]["sm_active"] == "estimated"
    assert tl.meta["sm_active_metric"] == "gpu_util" and "not SM activity" in tl.meta["notes"][0]


def test_not_nvml_csv():
    with pytest.raises(UserError, match="not an NVML sampler CSV"):
        nvml.read(io.StringIO("a,b\n1,2\n"))
    assert nvml.sniff(CSV.encode(), "x.csv") and not nvml.sniff(b"a,b\n", "x.csv")


def test_sampler_without_nvidia_ml_py_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(UserError, match="nvidia-ml-py") as e:
        nvml.sample(tmp_path / "s.csv", duration_s=0.1)
    assert "\n" not in str(e.value)


class FakeNVML(types.SimpleNamespace):
    """Stands in for pynvml on a machine without a GPU: GPM support flag, fixed SM_UTIL values."""

    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, gpm: bool | None, sm_util=(40.0, 60.0), util=(30,)):
        super().__init__()
        self.gpm, self.sm_util, self.util = gpm, list(sm_util), list(util)
        self.freed = 0
        if gpm is None:  # an nvidia-ml-py without GPM functions at all
            return
        self.nvmlGpmQueryDeviceSupport = self._support

    def _support(self, handle):
        if self.gpm == "raise":
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return types.SimpleNamespace(isSupportedDevice=int(bool(self.gpm)))

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, h):
        return b"GPU-fake"

    def nvmlGpmSampleAlloc(self):
        return object()

    def nvmlGpmSampleFree(self, s):
        self.freed += 1

    def nvmlGpmSampleGet(self, h, s):
        pass

    def c_nvmlGpmMetricsGet_t(self):
        return types.SimpleNamespace(metrics=[types.SimpleNamespace(metricId=0, value=0.0, nvmlReturn=0)])

    def nvmlGpmMetricsGet(self, mg):
        assert mg.metrics[0].metricId == gpu_probe.GPM_METRIC_SM_UTIL and mg.sample1 is not mg.sample2
        mg.metrics[0].value = self.sm_util.pop(0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self.util.pop(0), memory=0)


@pytest.mark.parametrize("gpm,want", [(True, "gpm_sm_util"), (False, "gpu_util"), ("raise", "gpu_util"),
                                      (None, "gpu_util")])
def test_choose_source(gpm, want):
    assert gpu_probe.choose_source(FakeNVML(gpm), ("handle", 0)) == want


@pytest.mark.parametrize("gpm,metric,values", [(True, "gpm_sm_util", [0.4, 0.6]), (False, "gpu_util", [0.3, 0.5])])
def test_sampler_writes_csv_the_reader_reads(tmp_path, gpm, metric, values):
    fake = FakeNVML(gpm, util=(30, 50))
    ticks = iter([10.0, 10.1])
    out = nvml.sample(tmp_path / "s.csv", interval_s=0.1, duration_s=0.2, nvml=fake, clock=lambda: next(ticks),
                      sleep=lambda s: None)
    tl = nvml.read(out)
    assert list(tl.series["value"]) == pytest.approx(values) and set(tl.series["name"]) == {f"nvml_{metric}"}
    assert list(tl.series["t_s"]) == [10.0, 10.1]
    assert fake.freed == (2 if gpm else 0)
    with pytest.raises(UserError, match="exists"):
        nvml.sample(out, nvml=fake)


def test_gpm_error_value_is_nan():
    fake = FakeNVML(True)
    mg_holder = {}

    def failing(mg):
        mg.metrics[0].nvmlReturn = 3
        mg_holder["mg"] = mg
    fake.nvmlGpmMetricsGet = failing
    assert math.isnan(gpu_probe.gpm_sm_util(fake, object(), object()))


@pytest.mark.parametrize("gpm,metric,quality,values", [(True, "gpm_sm_util", "measured", [0.4, 0.6]),
                                                      (False, "gpu_util", "estimated", [0.3, 0.5])])
def test_sm_probe_reads_window_by_window_and_frees_on_close(gpm, metric, quality, values):
    from mixdiag.gpu_probe import open_sm_probe

    fake = FakeNVML(gpm, util=(30, 50))
    fake.shutdown = 0
    fake.nvmlShutdown = lambda: setattr(fake, "shutdown", fake.shutdown + 1)
    probe = open_sm_probe(0, nvml=fake)
    assert (probe.metric, probe.quality) == (metric, quality)
    assert [probe(), probe.read()] == pytest.approx(values)
    probe.close()
    assert fake.freed == (2 if gpm else 0) and fake.shutdown == 1


def test_sm_probe_without_nvidia_ml_py_is_a_one_line_error(monkeypatch):
    from mixdiag.gpu_probe import open_sm_probe

    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(UserError, match="nvidia-ml-py"):
        open_sm_probe(0)
