"""NVML SM-activity sampler (live, on a GPU machine) and the reader of the CSV it writes.

The sampler prefers GPM ``SM_UTIL`` (Hopper and newer: the share of SMs busy, the same quantity
as DCGM's SM_ACTIVE, read from two GPM samples ``interval_s`` apart). Elsewhere it falls back to
``nvmlDeviceGetUtilizationRates().gpu`` - the share of time *any* kernel ran - which reads 100 %
for a launch-bound decode that keeps a few SMs busy; the reader marks it ``estimated``.

CSV (``FORMAT = "nvml-csv"``)::

    t_s,gpu_index,gpu_uuid,metric,value
    1767225600.100,0,GPU-...,gpm_sm_util,0.734

``metric`` is ``gpm_sm_util`` or ``gpu_util``; ``value`` is a ratio 0..1; ``t_s`` is unix seconds at
the end of the sample's window. ``nvidia-ml-py`` (the ``gpu`` extra) is imported only by the
sampler; without it, or without a driver, the sampler stops with a one-line error.
"""
from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.gpu_probe import METRICS, choose_source, gpm_sm_util, load_nvml
from mixdiag.collectors.text_input import csv_records, source_name

__all__ = ["FORMAT", "HEADER", "sniff", "sample", "read"]

FORMAT = "nvml-csv"
HEADER = ("t_s", "gpu_index", "gpu_uuid", "metric", "value")


def sniff(head: bytes, name: str) -> bool:
    """True when the first line is this CSV's header."""
    first = head.split(b"\n", 1)[0].strip().decode("utf-8", "replace")
    return first == ",".join(HEADER)


# ---- live sampling (GPU machines; NVML access lives in mixdiag.gpu_probe) ----------------------------------
def sample(out: str | os.PathLike, *, device_index: int = 0, interval_s: float = 0.1, duration_s: float = 10.0,
           source: str = "auto", nvml: Any = None, clock=time.time, sleep=time.sleep,
           on_sample=None) -> Path:
    """Sample one GPU every ``interval_s`` for ``duration_s`` into a new CSV at ``out``.

    ``source`` is ``auto`` (GPM when supported), ``gpm_sm_util`` or ``gpu_util``. Refuses to
    overwrite an existing file. ``nvml``/``clock``/``sleep`` are injectable for tests;
    ``on_sample(metric, value)`` is called after each row (progress display).
    """
    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; choose another path (nothing is overwritten)")
    if not (interval_s > 0 and duration_s > 0):
        raise UserError("interval_s and duration_s must be positive")
    nv = nvml if nvml is not None else load_nvml()
    handle = nv.nvmlDeviceGetHandleByIndex(device_index)
    uuid = nv.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    src = choose_source(nv, handle) if source == "auto" else source
    if src not in METRICS:
        raise UserError(f"unknown NVML source {source!r}; use auto, gpm_sm_util or gpu_util")
    n = max(1, int(round(duration_s / interval_s)))
    with open(out, "x", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        if src == "gpm_sm_util":
            s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
            try:
                nv.nvmlGpmSampleGet(handle, s1)
                for _ in range(n):
                    sleep(interval_s)
                    nv.nvmlGpmSampleGet(handle, s2)
                    v = gpm_sm_util(nv, s1, s2)
                    w.writerow((f"{clock():.6f}", device_index, uuid, src, f"{v:.6f}"))
                    s1, s2 = s2, s1
                    if on_sample is not None:
                        on_sample(src, v)
            finally:
                nv.nvmlGpmSampleFree(s1)
                nv.nvmlGpmSampleFree(s2)
        else:
            for _ in range(n):
                sleep(interval_s)
                v = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
                w.writerow((f"{clock():.6f}", device_index, uuid, src, f"{v:.6f}"))
                if on_sample is not None:
                    on_sample(src, v)
    return out


# ---- reading the CSV ------------------------------------------------------------------------------
def read(source, *, instance: str | None = None, steps: Timeline | pd.DataFrame | None = None,
         **options) -> Timeline:
    """Read a sampler CSV into series ``nvml_<metric>`` (and ``steps.sm_active`` when ``steps`` given)."""
    recs, stats = csv_records(source, FORMAT, HEADER, "an NVML sampler CSV")
    base = instance or Path(source_name(source)).stem
    rows = []
    for raw, (t, gpu, uuid, metric, value) in recs:
        try:
            t_s, v = float(t), float(value)
        except ValueError:
            stats.skipped(raw, "time or value not a number")
            continue
        if metric not in METRICS or not (math.isfinite(t_s) and (math.isnan(v) or 0.0 <= v <= 1.0)):
            stats.skipped(raw, "unknown metric, bad time or value outside 0..1")
            continue
        stats.parsed()
        if not math.isnan(v):
            rows.append({"instance": base, "name": f"nvml_{metric}", "labels": f"gpu={gpu},uuid={uuid}",
                         "t_s": t_s, "value": v})
    series = pd.DataFrame(rows) if rows else None
    used = sorted({r["name"][5:] for r in rows})
    quality = "measured" if used == ["gpm_sm_util"] else ("estimated" if used else "absent")
    notes = [] if quality != "estimated" else \
        ["sm_active from NVML utilization: the share of time any kernel ran, not SM activity (weaker)"]
    meta = {"source": FORMAT, "clock": "unix", "sources": [stats.to_meta()], "notes": notes,
            "sm_active_metric": ",".join(used) or None, "partial": stats.to_meta()["partial"]}
    tl = Timeline(series=series, meta=dict(meta, signals={base: {"sm_active": quality}}))
    if steps is None or series is None:
        return tl
    from mixdiag.collectors.gpu.dcgm import attach_sm_active

    base_steps = steps.steps if isinstance(steps, Timeline) else steps
    insts = list(pd.unique(base_steps["instance"]))
    if len(insts) != 1:
        raise UserError(f"nvml: {len(insts)} step instances; map the GPU to one by reading each separately")
    samples = tl.series.assign(instance=insts[0])
    new_steps = attach_sm_active(base_steps, samples)
    signals = {insts[0]: {"sm_active": quality}}
    if isinstance(steps, Timeline):
        sig = {k: dict(v) for k, v in steps.meta.get("signals", {}).items()}
        sig.setdefault(insts[0], {}).update(signals[insts[0]])
        meta["sources"] = list(steps.meta.get("sources", [])) + meta["sources"]
        ser = pd.concat([steps.series, tl.series], ignore_index=True) if len(steps.series) else tl.series
        return Timeline(new_steps, steps.tokens, ser, dict(meta, signals=sig))
    return Timeline(new_steps, None, tl.series, dict(meta, signals=signals))
