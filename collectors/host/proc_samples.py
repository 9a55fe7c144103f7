"""The OS's view of an engine process: a sampler of ``/proc/PID/stat`` and ``/proc/PID/schedstat`` (Linux) and
the reader of the CSV it writes - host stalls measured by the kernel, where the engine exposes none.

vLLM 0.32 exposes no host time in ``/metrics`` or its default log, so a stall of its EngineCore process (stopped
by a signal, a debugger, a container pause; or runnable but starved of CPU by a neighbour) is invisible to every
other source: the running requests' next tokens just come late. The kernel sees it: a stopped task is in state
``T`` (``t`` when traced), and a runnable task that waits for a CPU accumulates ``run_delay`` (the second field
of ``/proc/PID/schedstat``, nanoseconds spent on a run queue, ``Documentation/scheduler/sched-stats.rst``).
Both are read from the engine's main thread - the thread that runs the engine loop (vLLM's ``EngineCore``
process; SGLang's scheduler process).

CSV (``FORMAT = "host-samples"``)::

    t_s,pid,state,cpu_s,run_delay_s
    1767225600.010,4188,R,12.340000,0.081234

``t_s``: unix seconds when the sample was read; ``state``: the one-letter task state; ``cpu_s``: user + system
CPU time; ``run_delay_s``: cumulative run-queue wait (empty where the kernel keeps no schedstat).

Read back as timed events (each stamped at its end, value = its length in seconds); the join lends the stops to
the scrape intervals (the longest per interval) and to the steps they overlapped (collectors/join_cells.py, column
``host_stopped_s``). The starvations stay a series: no testbed truth checks them yet (docs/collectors-text.md):

* ``host:stopped_s`` - a run of samples in state T/t: from midway between the last sample before it and its
  first, to midway between its last and the first after it (the sampling interval bounds the error);
* ``host:cpu_starved_s`` - a run of sample gaps in each of which run-queue wait grew by at least half the gap and
  at least ``STARVED_MIN_S``: the task was runnable but off-CPU for most of that time; the run counts when its wait
  passes one scheduling period (``STARVED_RUN_MIN_S``). The value is the wait.

A zero event at the first and last sample marks the sampled span: intervals inside it with no event read a
measured 0. Rows the reader cannot use are counted and reported (``meta["sources"]``), never dropped silently.
"""
from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mixdiag.collectors.text_input import csv_records, source_name
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

__all__ = ["FORMAT", "HEADER", "sniff", "read_proc", "sample", "read", "events"]

FORMAT = "host-samples"
HEADER = ("t_s", "pid", "state", "cpu_s", "run_delay_s")
STOPPED = ("T", "t")
#: run-queue wait grown by at least this much across one sample gap (and half the gap) counts as starved: well
#: above the scheduler's own latency (tens of microseconds to a few ms on a loaded machine)
STARVED_MIN_S = 0.005
#: a run of such gaps is a CPU starvation only when its wait passes one scheduling period: CFS gives every runnable
#: task a turn within ``sched_latency_ns`` (6 ms x (1 + log2 CPUs), 24 ms from 8 CPUs up), so a shorter wait is
#: ordinary time-slicing of a busy host, a longer one a task kept off the CPU (an oversubscribed or hogged host)
STARVED_RUN_MIN_S = 0.024
STOPPED_SERIES, STARVED_SERIES = "host:stopped_s", "host:cpu_starved_s"
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def sniff(head: bytes, name: str) -> bool:
    """True when the first line is this CSV's header."""
    return head.split(b"\n", 1)[0].strip().decode("utf-8", "replace") == ",".join(HEADER)


def read_proc(pid: int, proc: str = "/proc") -> tuple[str, float, float] | None:
    """(state, cpu_s, run_delay_s) of ``pid``'s main thread now; None once the process is gone.
    ``run_delay_s`` is NaN where the kernel keeps no schedstat."""
    try:
        stat = Path(f"{proc}/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name is in parentheses and may hold spaces or ')': the fields start after the last ')'
    rest = stat[stat.rindex(")") + 2:].split()
    state, utime, stime = rest[0], int(rest[11]), int(rest[12])   # fields 3, 14, 15 of proc(5)
    try:
        delay = int(Path(f"{proc}/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (FileNotFoundError, IndexError, ValueError):
        delay = math.nan
    return state, (utime + stime) / _CLK_TCK, delay


def sample(pid: int, out: str | os.PathLike, *, interval_s: float = 0.01, duration_s: float | None = None,
           stop=None, clock=time.time, sleep=time.sleep, proc: str = "/proc") -> Path:
    """Sample ``pid`` every ``interval_s`` into a new CSV at ``out`` until ``duration_s`` passed, ``stop`` (a
    ``threading.Event``) is set or the process is gone. Refuses to overwrite an existing file."""
    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; choose another path (nothing is overwritten)")
    if not interval_s > 0 or (duration_s is not None and not duration_s > 0):
        raise UserError("the sampling interval and duration must be positive seconds")
    if read_proc(pid, proc) is None:
        raise UserError(f"no process {pid} to sample (/proc/{pid}/stat)")
    t_end = None if duration_s is None else clock() + duration_s
    with open(out, "x", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        n = 0
        while stop is None or not stop.is_set():
            got = read_proc(pid, proc)
            t = clock()
            if got is None:
                break
            state, cpu, delay = got
            w.writerow((f"{t:.6f}", pid, state, f"{cpu:.6f}", "" if math.isnan(delay) else f"{delay:.6f}"))
            n += 1
            if n % 100 == 0:
                f.flush()   # a reader of a live capture sees it grow
            if t_end is not None and t >= t_end:
                break
            sleep(interval_s)
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[first, last] index pairs of the True runs of ``mask``."""
    out, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j + 1 < len(mask) and mask[j + 1]:
                j += 1
            out.append((i, j))
            i = j + 1
        else:
            i += 1
    return out


def events(t: np.ndarray, state: np.ndarray, delay: np.ndarray) -> list[tuple[str, float, float]]:
    """(series, end t_s, seconds) of every stop and CPU starvation in one process's samples (sorted by time)
    - the module doc's rules - plus the zero events that mark the sampled span."""
    n = len(t)
    if n == 0:
        return []
    out = [(STOPPED_SERIES, float(t[0]), 0.0)]
    stopped = np.isin(state, STOPPED)
    for i, j in _runs(stopped):
        a = t[i] if i == 0 else 0.5 * (t[i - 1] + t[i])
        b = t[j] if j == n - 1 else 0.5 * (t[j] + t[j + 1])
        out.append((STOPPED_SERIES, float(b), float(b - a)))
    if n > 1:
        dt, dd = np.diff(t), np.diff(delay)
        with np.errstate(invalid="ignore"):
            # a stopped task is not runnable: its gaps are the stop's, not starvation
            starved = (dd >= 0.5 * dt) & (dd >= STARVED_MIN_S) & ~stopped[1:] & ~stopped[:-1]
        for i, j in _runs(starved):
            wait = float(np.sum(dd[i:j + 1]))
            if wait >= STARVED_RUN_MIN_S:
                out.append((STARVED_SERIES, float(t[j + 1]), wait))
    out.append((STOPPED_SERIES, float(t[-1]), 0.0))
    return sorted(out, key=lambda e: e[1])


def read(source, *, instance: str | None = None, **options) -> Timeline:
    """Read a sampler CSV into the series ``host:stopped_s`` and ``host:cpu_starved_s`` (module doc)."""
    lines, stats = csv_records(source, FORMAT, HEADER, "a host sampler CSV")
    recs: dict[int, list[tuple[float, str, float]]] = {}
    for raw, (t, pid, state, _cpu, delay) in lines:
        try:
            t_s, p, d = float(t), int(pid), (float(delay) if delay.strip() else math.nan)
        except ValueError:
            stats.skipped(raw, "time, pid or run-queue wait not a number")
            continue
        if not math.isfinite(t_s) or len(state.strip()) != 1:
            stats.skipped(raw, "bad time or state")
            continue
        stats.parsed()
        recs.setdefault(p, []).append((t_s, state.strip(), d))
    if len(recs) > 1:
        raise UserError(f"{source_name(source)}: samples of {len(recs)} processes; sample one engine process a file")
    base = instance or (f"host-pid{next(iter(recs))}" if recs else Path(source_name(source)).stem)
    rows = []
    for pid, rr in recs.items():
        rr.sort()
        t = np.array([r[0] for r in rr])
        ev = events(t, np.array([r[1] for r in rr]), np.array([r[2] for r in rr]))
        rows += [{"instance": base, "name": name, "labels": f"pid={pid}", "t_s": te, "value": v}
                 for name, te, v in ev]
    meta = {"source": FORMAT, "clock": "unix", "sources": [stats.to_meta()], "partial": stats.to_meta()["partial"],
            "notes": [], "signals": {base: {"host_time": "measured" if rows else "absent"}}}
    return Timeline(series=pd.DataFrame(rows) if rows else None, meta=meta)
