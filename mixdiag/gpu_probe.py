"""Live NVML access for one GPU: load NVML, pick the SM-activity metric, read it window by window.

Base layer, shared by two rooms that must not import each other: the engine's SM-activity observer
opens a probe through :func:`open_sm_probe`, and the CSV sampler in :mod:`mixdiag.collectors.gpu.nvml`
builds on the same helpers. Imports nothing beyond :mod:`mixdiag.errors`; ``pynvml`` (the ``gpu``
extra) only when NVML is loaded.
"""
from __future__ import annotations

import math
from typing import Any

from mixdiag.errors import UserError

#: NVML_GPM_METRIC_SM_UTIL (nvml.h): percent of SMs busy over the window between two GPM samples.
GPM_METRIC_SM_UTIL = 2
#: metric -> signal quality: GPM SM_UTIL is SM activity; device utilization only "a kernel ran".
METRICS = {"gpm_sm_util": "measured", "gpu_util": "estimated"}


def load_nvml() -> Any:
    """Import and initialise ``pynvml``; one-line :class:`UserError` when it cannot run here."""
    try:
        import pynvml  # noqa: PLC0415  (optional 'gpu' extra, imported only when sampling)
    except ImportError:
        raise UserError("NVML sampling needs nvidia-ml-py: pip install 'mixdiag[gpu]'") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # pynvml.NVMLError_* (no driver, no GPU): one line, no traceback
        raise UserError(f"NVML is not available on this machine: {e}") from None
    return pynvml


def choose_source(nvml: Any, handle: Any) -> str:
    """``gpm_sm_util`` when the device supports GPM (Hopper+), else ``gpu_util``."""
    query = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
    if query is None:
        return "gpu_util"  # nvidia-ml-py older than GPM support
    try:
        support = query(handle)
    except Exception:  # NVMLError_NotSupported and friends
        return "gpu_util"
    return "gpm_sm_util" if getattr(support, "isSupportedDevice", 0) else "gpu_util"


def gpm_sm_util(nvml: Any, sample1: Any, sample2: Any) -> float:
    """SM_UTIL between two GPM samples, as a ratio 0..1 (NaN when NVML reports an error for it)."""
    mg = nvml.c_nvmlGpmMetricsGet_t()
    mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 1
    mg.sample1, mg.sample2 = sample1, sample2
    mg.metrics[0].metricId = GPM_METRIC_SM_UTIL
    nvml.nvmlGpmMetricsGet(mg)
    m = mg.metrics[0]
    if getattr(m, "nvmlReturn", 0) != 0:
        return math.nan
    return max(0.0, min(1.0, float(m.value) / 100.0))


class SmProbe:
    """SM activity of one GPU since the previous :meth:`read` (GPM) or over NVML's last utilization window.

    ``metric`` is ``gpm_sm_util`` or ``gpu_util``; ``quality`` the signal quality it earns
    (``measured`` / ``estimated``). Calling the probe is :meth:`read`.
    """

    def __init__(self, nvml: Any, device_index: int = 0):
        self._nvml = nvml
        self._handle = nvml.nvmlDeviceGetHandleByIndex(device_index)
        self.metric = choose_source(nvml, self._handle)
        self.quality = METRICS[self.metric]
        self._samples = None
        if self.metric == "gpm_sm_util":  # two GPM buffers, swapped each read: the window is previous read -> now
            self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            nvml.nvmlGpmSampleGet(self._handle, self._samples[0])

    def read(self) -> float:
        """SM activity 0..1 since the previous read (GPM) or NVML's last utilization window."""
        nvml = self._nvml
        if self._samples is None:
            return nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0
        prev, cur = self._samples
        nvml.nvmlGpmSampleGet(self._handle, cur)
        self._samples = [cur, prev]
        return gpm_sm_util(nvml, prev, cur)

    __call__ = read

    def close(self) -> None:
        """Free the GPM buffers and shut NVML down (idempotent for the buffers)."""
        if self._samples is not None:
            for s in self._samples:
                self._nvml.nvmlGpmSampleFree(s)
            self._samples = None
        self._nvml.nvmlShutdown()


def open_sm_probe(device_index: int = 0, *, nvml: Any = None) -> SmProbe:
    """A live :class:`SmProbe` on GPU ``device_index``; one-line UserError when NVML cannot run here.

    ``nvml`` replaces the ``pynvml`` module (tests).
    """
    return SmProbe(nvml if nvml is not None else load_nvml(), device_index)
