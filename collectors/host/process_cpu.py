"""The engine process's CPU time from process-exporter scrapes (format ``process-exporter``):
``namedprocess_namegroup_cpu_seconds_total{groupname, mode}`` (ncabatoff/process-exporter: utime and
stime of ``/proc/<pid>/stat`` as seconds, summed over the group's processes) -> ``engine_cpu_s`` on the
interval rows of the inputs given with it: the CPU seconds the engine process got in each interval.

Why it bears on a cause: an engine step is host work (scheduling, launches; on vLLM's CPU backend
the forward itself). A stopped or descheduled engine process (SIGSTOP, a cgroup throttle, a noisy
neighbour on its cores) gets no CPU while requests wait - the host stall, measured by the kernel's
accounting, not inferred from missing tokens. The diagnosis compares each interval with the
engine's own usual rate (detection/host_idle.py). A GC pause runs *on* the CPU and does not show.

Which group is the engine: ``engine_group=`` (the ``groupname`` a user's process-exporter config
gave it), else a group named after vLLM's engine process title (``VLLM::EngineCore``; process-exporter's
default ``{{.Comm}}`` name is its 15-character ``comm``, ``VLLM::EngineCor``), else the only group.
Counters are summed over ``mode``; a counter that falls (a restarted process) starts a new run, and
the interval across the restart is left empty.

Sources: one scrape file or a directory of timed scrapes (``<unix_time_s>.prom``). Read alone it
gives series only; given with an engine's inputs, its counter fills their interval rows by time.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

FORMAT = "process-exporter"
CPU_METRIC = "namedprocess_namegroup_cpu_seconds_total"
#: vLLM names its engine-core process ``VLLM::EngineCore`` (``bind_process_name``); comm keeps 15 characters
ENGINE_GROUPS = re.compile(r"^VLLM::EngineCor")
_SNIFF = re.compile(rb"^namedprocess_namegroup_cpu_seconds_total\{", re.M)


def sniff(head: bytes, name: str) -> bool:
    """True when the head (or a scrape directory's first file) holds process-exporter CPU counters."""
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


def _labels(s: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in s.split(",") if "=" in p) if s else {}


def engine_counter(series: pd.DataFrame, engine_group: str | None = None) -> tuple[str, pd.Series]:
    """(group, cumulative CPU seconds by sample time) of the engine's group; UserError when none fits."""
    cpu = series[series["name"] == CPU_METRIC]
    if not len(cpu):
        raise UserError(f"no {CPU_METRIC} series in the input (is this a process-exporter scrape?)")
    groups = [_labels(s).get("groupname", "") for s in cpu["labels"]]
    cpu = cpu.assign(group=groups)
    names = sorted(set(groups))
    if engine_group is not None:
        pick = engine_group if engine_group in names else None
    else:
        found = [g for g in names if ENGINE_GROUPS.match(g)]
        pick = found[0] if len(found) == 1 else (names[0] if len(names) == 1 else None)
    if pick is None:
        raise UserError(f"which process group is the engine? groups: {', '.join(names)[:200]} "
                        "(name it with engine_group=)")
    per_t = cpu[cpu["group"] == pick].groupby("t_s")["value"].sum().sort_index()
    return pick, per_t


def cpu_between(per_t: pd.Series, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """CPU seconds in each window [t0, t1] from the cumulative counter, linear between samples; NaN for
    a window outside the samples or across a counter reset."""
    ts, v = per_t.index.to_numpy(dtype=float), per_t.to_numpy(dtype=float)
    out = np.full(len(t0), np.nan)
    if len(ts) < 2:
        return out
    # a reset (the process restarted): samples before and after are separate runs
    run = np.concatenate([[0], np.cumsum(np.diff(v) < 0)])
    tol = 0.05 * float(np.median(np.diff(ts)))   # scrapes on one grid land within milliseconds
    ok = (t0 >= ts[0] - tol) & (t1 <= ts[-1] + tol) & (t1 > t0)
    a, b = np.clip(t0, ts[0], ts[-1]), np.clip(t1, ts[0], ts[-1])
    same = run[np.searchsorted(ts, a, side="right") - 1] == run[np.clip(np.searchsorted(ts, b, side="left"), 0, len(ts) - 1)]
    out[ok & same] = (np.interp(b, ts, v) - np.interp(a, ts, v))[ok & same]
    return out


def attach(steps: pd.DataFrame, per_t: pd.Series, instance: str) -> pd.DataFrame:
    """``steps`` with ``engine_cpu_s`` on ``instance``'s interval rows."""
    steps = steps.copy()
    rows = ((steps["instance"] == instance) & (steps["granularity"] == "interval")).to_numpy(dtype=bool)
    if "engine_cpu_s" not in steps:
        steps["engine_cpu_s"] = np.nan
    vals = cpu_between(per_t, steps.loc[rows, "t_start_s"].to_numpy(dtype=float),
                       steps.loc[rows, "t_end_s"].to_numpy(dtype=float))
    steps.loc[rows, "engine_cpu_s"] = np.clip(vals, 0.0, None)
    return steps


def read(source, *, instance: str | None = None, steps: Timeline | None = None, engine_group: str | None = None,
         **options) -> Timeline:
    """The engine group's CPU counter as series, and ``engine_cpu_s`` on ``steps``' interval rows when
    given (its one instance; with several, nothing is mapped and a note says so)."""
    from mixdiag.collectors.prometheus import scrape_reader

    src = scrape_reader.read(source, instance=instance)
    group, per_t = engine_counter(src.series, engine_group)
    ser = src.series[src.series["name"].str.startswith("namedprocess_namegroup_")]
    notes = [f"engine CPU time: process group {group!r} ({len(per_t)} samples)"]
    if steps is None:
        return Timeline(None, None, ser, {"source": FORMAT, "clock": src.meta.get("clock", "unix"),
                                          "sources": list(src.meta.get("sources", [])), "notes": notes})
    meta = dict(steps.meta)
    insts = list(pd.unique(steps.steps["instance"])) if len(steps.steps) else []
    new_steps = steps.steps
    if len(insts) == 1 and (steps.steps["granularity"] == "interval").any():
        new_steps = attach(steps.steps, per_t, insts[0])
        sig = {k: dict(v) for k, v in meta.get("signals", {}).items()}
        sig.setdefault(insts[0], {})["engine_cpu"] = "measured"
        meta["signals"] = sig
    elif len(insts) > 1:
        notes.append(f"{len(insts)} instances: engine CPU time not mapped (give one server's inputs)")
    else:
        notes.append("no interval rows to carry the engine's CPU time (scrapes of the engine give them)")
    meta["notes"] = list(meta.get("notes", [])) + notes
    meta["sources"] = list(meta.get("sources", [])) + list(src.meta.get("sources", []))
    series = pd.concat([steps.series, ser], ignore_index=True) if len(steps.series) else ser
    return Timeline(new_steps, steps.tokens, series, meta, steps.activity)
