"""Times of a vLLM log's lines: ``MM-DD hh:mm:ss[.frac]`` without a year, docker / CRI stamps,
and lines without a time; for the fast Iteration lines (columns) and the per-line walk together.

vLLM prints no year: ``year=``, else the latest year that puts the first line in the past; a
month that runs backwards (December -> January) adds one. A line without a time takes the last
time before it. Both rules run over all lines in line order, whichever path reads them.
"""
from __future__ import annotations

import re
import time

import numpy as np

from mixdiag.collectors.logs.log_lines import naive_to_unix, strip_container_prefix
from mixdiag.collectors.logs.vllm_iterations import SplitLines
from mixdiag.collectors.text_input import is_garbage

PREFIX = re.compile(r"(?:\((?P<proc>[^)\s]+) pid=\d+\)\s+)?(?P<level>[A-Z]+) (?P<mo>\d\d)-(?P<d>\d\d) "
                     r"(?P<hms>\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))? \[?[\w.]+:\d+\]\s?")


def _recent_year(month: int, day: int, latest_s: float | None = None) -> int:
    """The year of ``latest_s`` (unix seconds; default now), or the one before when month-day would lie
    after it: a log's lines were written before the file was last modified, and before now."""
    now = time.gmtime(latest_s) if latest_s is not None else time.gmtime()
    if (month, day) > (now.tm_mon, now.tm_mday + 1):
        return now.tm_year - 1
    return now.tm_year


class LineTimes:
    """Times of every line, the fast Iteration lines' and the walk's together, as one walk in line
    order would give them: the clock's year rolls over where months run backwards on any line, and
    an untimed line takes the last time before it, whichever kind of line that was."""

    def __init__(self, sl: SplitLines, slow: list[str], year: int | None, written_s: float | None = None):
        """``written_s``: when the log file was last modified (unix seconds), a bound the first line
        lies before - a tighter one than now for a log read long after its run, and the only hint
        of its year a year-less log read alone carries (weak: a copy without -p moves it later)."""
        self.slow = slow  # the walk's lines, undecodable bytes cleaned
        self.pre: list[tuple | None] = []  # per walk line: None (not text) or (raw, body, proc, pm)
        t_slow: list[float] = []
        clock_i, clock_mo, clock_d = [], [], []
        zoned = 0  # lines a container runtime stamped (RFC 3339 UTC / unix seconds)
        for i, raw in enumerate(slow):
            if is_garbage(raw):
                self.pre.append(None)
                t_slow.append(np.nan)
                continue
            line, t = strip_container_prefix(raw)
            zoned += t is not None
            pm = PREFIX.search(line)
            if pm and t is None:
                clock_i.append(i)
                clock_mo.append(int(pm.group("mo")))
                clock_d.append(int(pm.group("d")))
            self.pre.append((raw, line[pm.end():] if pm else line, pm.group("proc") if pm else None, pm))
            t_slow.append(np.nan if t is None else t)
        fl = sl.fast
        nf = len(sl.fast_ln)
        ln = np.concatenate([sl.fast_ln, sl.slow_ln[clock_i]]).astype(np.int64)
        order = np.argsort(ln, kind="stable")
        mo = np.concatenate([fl.get("mo", np.zeros(0, np.int64)), np.array(clock_mo, np.int64)])[order]
        self.first_year = self.first_clock_ln = None
        self.year_note = None
        if len(order):
            d0 = int(np.concatenate([fl.get("d", np.zeros(0, np.int64)), np.array(clock_d, np.int64)])[order][0])
            latest = written_s if written_s is not None and written_s < time.time() else None
            self.first_year = year if year is not None else _recent_year(int(mo[0]), d0, latest)
            self.first_clock_ln = int(ln[order][0])
            if year is None:
                bound = ("the file's modification time (" + time.strftime("%Y-%m-%d", time.gmtime(latest)) + ")"
                         if latest is not None else "now")
                self.year_note = (f"vLLM log times have no year: assumed {self.first_year}, the latest year that puts "
                                  f"the first line before {bound} (pass year=, or read it with scrapes or traces "
                                  "of the same run)")
        years = np.empty(len(order), np.int64)
        years[order] = clock_years(self.first_year or 0, mo)
        self.t_fast = fast_times(fl, years[:nf]) if nf else np.zeros(0)
        for i, y in zip(clock_i, years[nf:].tolist()):
            pm = self.pre[i][3]
            t = naive_to_unix(y, int(pm.group("mo")), int(pm.group("d")), pm.group("hms"), pm.group("frac"))
            t_slow[i] = np.nan if t is None else t
        self.t_slow = np.array(t_slow, dtype=float)
        # A zone-less wall clock: vLLM's logger prints local time (logging's asctime), so unless a
        # container runtime stamped the lines (RFC 3339 UTC) the log's zone is not known
        # (collectors/logs/log_zone.py may place it beside unix-clock inputs of the same run).
        self.naive_zone = bool(nf or clock_i) and zoned == 0
        # an untimed line takes the last time before it; lines that are not text have none to give
        text_slow = np.array([p is not None for p in self.pre], dtype=bool)
        ln_all = np.concatenate([sl.fast_ln, sl.slow_ln[text_slow]])
        t_all = np.concatenate([self.t_fast, self.t_slow[text_slow]])
        order = np.argsort(ln_all, kind="stable")
        filled = np.empty(len(order))
        filled[order] = forward_fill(t_all[order])
        self.have_time = bool(np.any(~np.isnan(t_all)))
        self.t_row_fast = filled[:nf]
        self.t_row_slow = np.full(len(slow), np.nan)
        self.t_row_slow[text_slow] = filled[nf:]


def fast_times(fast: dict[str, np.ndarray], years: np.ndarray) -> np.ndarray:
    """Unix seconds of the fast lines (NaN where the date is impossible), as ``naive_to_unix`` gives.

    A log's lines share few distinct seconds: each is converted once, the fraction added column-wise.
    """
    if not len(years):
        return np.zeros(0)
    packed = ((((years * 100 + fast["mo"]) * 100 + fast["d"]) * 100 + fast["h"]) * 100 + fast["mi"]) * 100 + fast["s"]
    uniq, inv = np.unique(packed, return_inverse=True)
    base = np.empty(len(uniq))
    for i, p in enumerate(uniq.tolist()):
        rest, s = divmod(p, 100)
        rest, mi = divmod(rest, 100)
        rest, h = divmod(rest, 100)
        rest, d = divmod(rest, 100)
        y, mo = divmod(rest, 100)
        t = naive_to_unix(y, mo, d, f"{h:02d}:{mi:02d}:{s:02d}")
        base[i] = np.nan if t is None else t
    # the walk adds 0.0 without a fraction: the same double either way
    return base[inv.reshape(-1)] + fast["frac_s"]


def clock_years(year: int, months: np.ndarray) -> np.ndarray:
    """The year of each clock-timed line in line order: ``year`` plus one per month that runs backwards."""
    if not len(months):
        return np.zeros(0, np.int64)
    return year + np.concatenate([[0], np.cumsum(months[1:] < months[:-1])]).astype(np.int64)


def forward_fill(t: np.ndarray) -> np.ndarray:
    """Each NaN replaced by the last number before it (NaN while there is none)."""
    if not len(t):
        return t
    idx = np.where(np.isnan(t), 0, np.arange(len(t)))
    np.maximum.accumulate(idx, out=idx)
    return t[idx]
