"""DCGM exporter SM activity -> ``steps.sm_active`` by time overlap, or ``series`` alone.

dcgm-exporter names each metric after its DCGM field. The SM-activity candidates, best first:

=================================  =====================================================  ========
``DCGM_FI_PROF_SM_ACTIVE``         cycles with >= 1 warp resident, averaged over SMs      measured
``DCGM_FI_PROF_GR_ENGINE_ACTIVE``  time any graphics/compute engine is busy (on by default) estimated
``DCGM_FI_PROF_SM_OCCUPANCY``      resident warps / maximum                              estimated
``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` tensor-pipe busy cycles                               estimated
``DCGM_FI_DEV_GPU_UTIL``           share of time *any* kernel ran (percent, not SM use)  estimated
=================================  =====================================================  ========

SM_ACTIVE is commented out in dcgm-exporter's default counters, so a stock install has none; the
reader then falls back down the list (``fallback=False`` to refuse), marks the signal
``estimated`` and says which field it used in ``meta["sm_active_metric"]`` and a note. A DCGM
gauge is the average over the exporter's collect interval ending at the sample, so sample ``k``
covers ``(t_{k-1}, t_k]``; a step gets the time-weighted mean of the samples it overlaps (GPUs
of one instance averaged).

Sources: a scrape file or a directory of timed scrapes (via ``prometheus.scrape_reader``), a
Prometheus URL (via ``prometheus.server_reader``, options ``selector``/``start``/``end``/``step_s``),
or a Timeline. :func:`fill_intervals` is also what ``collectors.load`` applies to a Prometheus
window or a sampled exporter URL read as such.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

FORMAT = "dcgm"
SM_METRICS = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
              "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_GPU_UTIL")
#: Fields exported in percent rather than 0..1.
PERCENT = {"DCGM_FI_DEV_GPU_UTIL"}
_SNIFF = re.compile(rb"^DCGM_FI_\w+\{", re.M)
_GPU_LABELS = ("gpu", "GPU_I_ID")


def sniff(head: bytes, name: str) -> bool:
    """True when the head (or, for a directory of timed scrapes, its first scrape) holds
    dcgm-exporter samples (check this before generic prom-text)."""
    if os.path.isdir(name):
        from mixdiag.collectors.prometheus.prom_text import scrape_files

        try:
            files = scrape_files(name)[0]
            if not files:
                return False
            with open(files[0][1], "rb") as f:
                head = f.read(65536)
        except OSError:
            return False
    return _SNIFF.search(head[:65536]) is not None


def parse_gpu_map(text: str | None) -> dict[str, list[str]]:
    """``--gpu-map "vllm-0:8000=0,vllm-0:8000=1,vllm-1:8000=node1:9400/0"`` -> ``{instance: [GPU, ...]}``.

    A GPU is its ``gpu`` label value, or ``<exporter instance>/<gpu>`` when several exporters share
    GPU numbers. Repeating an instance lists several GPUs (averaged).
    """
    out: dict[str, list[str]] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        inst, sep, gpu = part.rpartition("=")
        if not sep or not inst.strip() or not gpu.strip():
            raise UserError(f"--gpu-map entry {part!r}: expected INSTANCE=GPU (e.g. vllm-0:8000=0)")
        out.setdefault(inst.strip(), []).append(gpu.strip())
    return out


def _samples(ser: pd.DataFrame, used: str) -> pd.DataFrame:
    sel = ser[ser["name"] == used].copy()
    sel["value"] = sel["value"] * (0.01 if used in PERCENT else 1.0)
    sel["gpu"] = [next((lab[k] for k in _GPU_LABELS if k in lab), "?") for lab in map(_labels, sel["labels"])]
    return sel


def _mapped(sel: pd.DataFrame, mapping: Mapping[str, Sequence[str]]) -> pd.DataFrame:
    qualified = sel["instance"] + "/" + sel["gpu"]
    rows = [sel[sel["gpu"].isin([str(g) for g in gpus]) | qualified.isin([str(g) for g in gpus])]
            .assign(instance=inst) for inst, gpus in mapping.items()]
    return pd.concat(rows, ignore_index=True) if rows else sel.iloc[0:0]


def fill_intervals(tl: Timeline, gpu_map: Mapping[str, Sequence[str]] | None = None, metric: str = "auto",
                   fallback: bool = True) -> Timeline:
    """``tl`` with ``sm_active`` on its interval rows from the DCGM series it carries itself (a
    directory of timed dcgm-exporter scrapes, a Prometheus window, a sampled exporter URL).

    A row instance takes the GPUs ``gpu_map`` gives it, else every GPU whose series has the same
    instance. Unchanged when there are no DCGM series, no rows, or no SM-activity field.
    """
    if tl.steps is None or not len(tl.steps) or tl.series is None or not len(tl.series):
        return tl
    ser = tl.series[tl.series["name"].str.startswith("DCGM_FI_")]
    if not len(ser):
        return tl
    used, quality = choose_metric(ser["name"].unique(), metric, fallback)
    if used is None:
        return tl
    sel = _samples(ser, used)
    mapping = {str(k): list(v) for k, v in (gpu_map or {}).items()}
    for inst in pd.unique(tl.steps["instance"]):
        if inst not in mapping and (sel["instance"] == inst).any():
            mapping[inst] = sorted(sel.loc[sel["instance"] == inst, "gpu"].unique())
    samples = _mapped(sel, mapping)
    if not len(samples):
        return tl
    steps = attach_sm_active(tl.steps, samples)
    meta = dict(tl.meta)
    sig = {k: dict(v) for k, v in meta.get("signals", {}).items()}
    filled = set(pd.unique(samples["instance"]))
    for inst in filled:
        sig.setdefault(inst, {})["sm_active"] = quality
    meta["signals"] = sig
    meta["sm_active_metric"] = used
    note = f"sm_active of {len(filled)} instance(s) from {used}"
    if used != SM_METRICS[0]:
        note += " (a proxy, not SM activity)"
    meta["notes"] = list(meta.get("notes", [])) + [note]
    return Timeline(steps, tl.tokens, tl.series, meta)


def _labels(s: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in s.split(",") if "=" in p) if s else {}


def choose_metric(names: Sequence[str], metric: str = "auto", fallback: bool = True) -> tuple[str | None, str]:
    """``(field used, quality)`` among the field names present; ``(None, 'absent')`` when none fits."""
    present = set(names)
    if metric != "auto":
        if metric not in present:
            raise UserError(f"{metric} is not in the DCGM data (found: {', '.join(sorted(present)) or 'none'})")
        return metric, "measured" if metric == SM_METRICS[0] else "estimated"
    for i, m in enumerate(SM_METRICS if fallback else SM_METRICS[:1]):
        if m in present:
            return m, "measured" if i == 0 else "estimated"
    return None, "absent"


def overlap_mean(t_sample: np.ndarray, value: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Time-weighted mean of a piecewise-constant gauge over each ``[start, end]``.

    Sample ``k`` holds on ``(t_{k-1}, t_k]``; the first one on a period before it (the median
    spacing). Zero-length windows take the sample covering their instant; windows outside the
    sampled span get NaN.
    """
    order = np.argsort(t_sample, kind="stable")
    t, v = t_sample[order].astype("float64"), value[order].astype("float64")
    out = np.full(len(start), np.nan)
    if len(t) == 0:
        return out
    period = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    b = np.concatenate([[t[0] - period], t])                   # breakpoints, len n+1
    cum = np.concatenate([[0.0], np.cumsum(v * np.diff(b))])   # integral at each breakpoint
    s = np.clip(start, b[0], b[-1])
    e = np.clip(end, b[0], b[-1])
    width = e - s
    covered = (end >= b[0]) & (start <= b[-1])
    pos = width > 0
    out[pos & covered] = (np.interp(e, b, cum) - np.interp(s, b, cum))[pos & covered] / width[pos & covered]
    inst = ~pos & covered
    if inst.any():
        k = np.clip(np.searchsorted(b[1:], s[inst], side="left"), 0, len(v) - 1)
        out[inst] = v[k]
    return out


def attach_sm_active(steps: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with ``sm_active`` from ``samples`` (columns ``instance``, ``t_s``, ``value`` 0..1,
    ``gpu``): per step instance, the GPUs mapped to it are averaged sample-time by sample-time."""
    steps = steps.copy()
    for inst, grp in samples.groupby("instance"):
        mask = (steps["instance"] == inst).to_numpy()
        if not mask.any():
            continue
        per_t = grp.groupby("t_s")["value"].mean()  # mean over the instance's GPUs
        vals = overlap_mean(per_t.index.to_numpy(), per_t.to_numpy(), steps.loc[mask, "t_start_s"].to_numpy(),
                            steps.loc[mask, "t_end_s"].to_numpy())
        steps.loc[mask, "sm_active"] = np.clip(vals, 0.0, 1.0)
    return steps


def _source_timeline(source, instance, options) -> Timeline:
    if isinstance(source, Timeline):
        return source
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        from mixdiag.collectors.prometheus import server_reader
        keys = ("selector", "start", "end", "step_s", "window_s", "timeout_s")
        return server_reader.read(source, **{k: options[k] for k in keys if k in options})
    from mixdiag.collectors.prometheus import scrape_reader
    return scrape_reader.read(source, instance=instance, **{k: options[k] for k in ("t_s",) if k in options})


def read(source, *, instance: str | None = None, steps: Timeline | pd.DataFrame | None = None,
         gpu_map: Mapping[str, Sequence[str]] | None = None, metric: str = "auto", fallback: bool = True,
         **options) -> Timeline:
    """DCGM SM activity as series, and mapped onto ``steps`` (a Timeline or steps frame) when given.

    ``gpu_map`` maps a steps instance to the ``gpu`` label values serving it (``"<instance>/<gpu>"``
    when several exporters share GPU numbers, e.g. ``"node-1:9400/0"``); without it, one steps
    instance takes every GPU of the source, and several instances are left alone (noted).
    """
    src = _source_timeline(source, instance, options)
    if steps is None and "since_start" not in src.meta and src.steps is not None and len(src.steps):
        # timed scrapes (a directory, a Prometheus window): their own interval rows get sm_active
        return fill_intervals(src, gpu_map, metric, fallback)
    ser = src.series[src.series["name"].str.startswith("DCGM_FI_")]
    if len(ser) == 0:
        raise UserError("no DCGM_FI_* series in the input (is this a dcgm-exporter scrape?)")
    used, quality = choose_metric(ser["name"].unique(), metric, fallback)
    notes = [f"SM-activity fields found: {', '.join(sorted(set(ser['name']) & set(SM_METRICS))) or 'none'}"]
    if used is None:
        notes.append("no SM-activity series (DCGM_FI_PROF_SM_ACTIVE is commented out in dcgm-exporter's "
                     "default counters; enable it, or allow a proxy with fallback=True)")
    elif used != SM_METRICS[0]:
        notes.append(f"sm_active from {used}: a proxy, not SM activity"
                     + (" (GPU_UTIL reads 100% while any kernel runs, however few SMs it uses)"
                        if used == "DCGM_FI_DEV_GPU_UTIL" else ""))
    base_steps = steps.steps if isinstance(steps, Timeline) else steps
    meta = {"source": FORMAT, "clock": src.meta.get("clock", "unix"), "sources": list(src.meta.get("sources", [])),
            "sm_active_metric": used, "notes": notes, "partial": bool(src.meta.get("partial"))}
    out_series = ser.copy()
    signals: dict[str, dict[str, str]] = {}
    if used is not None and base_steps is not None and len(base_steps):
        sel = ser[ser["name"] == used].copy()
        sel["value"] = sel["value"] * (0.01 if used in PERCENT else 1.0)
        sel["gpu"] = [next((lab[k] for k in _GPU_LABELS if k in lab), "?") for lab in map(_labels, sel["labels"])]
        step_insts = list(pd.unique(base_steps["instance"]))
        mapping = dict(gpu_map or {})
        if not mapping and len(step_insts) == 1:
            mapping = {step_insts[0]: sorted(sel["gpu"].unique())}
        elif not mapping:
            notes.append(f"{len(step_insts)} step instances and no gpu_map: sm_active not mapped")
        # a GPU is named by its gpu label, or "<source instance>/<gpu>" when several hosts share numbers
        qualified = sel["instance"] + "/" + sel["gpu"]
        rows = [sel[sel["gpu"].isin([str(g) for g in gpus]) | qualified.isin([str(g) for g in gpus])]
                .assign(instance=inst) for inst, gpus in mapping.items()]
        samples = pd.concat(rows, ignore_index=True) if rows else sel.iloc[0:0]
        new_steps = attach_sm_active(base_steps, samples) if len(samples) else base_steps
        for inst in mapping:
            signals[inst] = {"sm_active": quality}
        if isinstance(steps, Timeline):
            meta["sources"] = list(steps.meta.get("sources", [])) + meta["sources"]
            sig = {k: dict(v) for k, v in steps.meta.get("signals", {}).items()}
            for k, v in signals.items():
                sig.setdefault(k, {}).update(v)
            signals = sig
            meta["clock"] = steps.meta.get("clock", meta["clock"])
            series = pd.concat([steps.series, out_series], ignore_index=True) if len(steps.series) else out_series
            meta["signals"] = signals
            return Timeline(new_steps, steps.tokens, series, meta)
        meta["signals"] = signals
        return Timeline(new_steps, None, out_series, meta)
    meta["signals"] = signals
    return Timeline(None, None, out_series, meta)
