"""What the vLLM and SGLang log readers share: container prefixes, clocks, rows -> Timeline.

Log lines reach users through ``docker logs --timestamps`` / ``kubectl logs --timestamps``
(an RFC 3339 time first), CRI files (``<time> stdout F <line>``), compose (``svc-1  | <line>``),
or raw. :func:`strip_container_prefix` takes those off and returns the container's time, which
is UTC with a year and sub-seconds, so it is preferred over the server's own timestamp.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd

from mixdiag.schema import Timeline

from mixdiag.collectors.logs.step_frame import event_rows, order_steps
from mixdiag.collectors.text_input import LineStats, rfc3339_to_unix

_RFC3339 = re.compile(r"^\s*(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d)?\s+(?:(?:stdout|stderr) [FP] )?")
_COMPOSE = re.compile(r"^[\w.-]+\s+\|\s")
# A handler whose format starts with Python logging's %(created)f (the vLLM testbed's iteration
# records): unix seconds, 2001-2286, then a space.
_UNIX = re.compile(r"^\s*(1\d{9}(?:\.\d+)?)\s+")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_container_prefix(line: str) -> tuple[str, float | None]:
    """``(line without docker/CRI/compose or unix-seconds prefix, that time as unix seconds or None)``.

    ANSI colour codes (vLLM colours its level names on a terminal) are removed first.
    """
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    t = None
    m = _RFC3339.match(line)
    if m:
        t = rfc3339_to_unix(m.group(1), m.group(2))
        line = line[m.end():]
    else:
        m = _UNIX.match(line)
        if m:
            t = float(m.group(1))
            line = line[m.end():]
    m = _COMPOSE.match(line)
    if m:
        line = line[m.end():]
    return line, t


def naive_to_unix(year: int, month: int, day: int, hms: str, frac: str | None = None) -> float | None:
    """A log's naive wall time read as UTC (servers rarely print a zone); None if impossible."""
    base = _second_to_unix(year, month, day, hms)
    if base is None:
        return None
    return base + (float("0." + frac) if frac else 0.0)


@functools.lru_cache(maxsize=4096)  # log lines share their second; sub-seconds stay out of the key
def _second_to_unix(year: int, month: int, day: int, hms: str) -> float | None:
    try:
        h, m, s = (int(x) for x in hms.split(":"))
        dt = datetime(year, month, day, h, m, s, tzinfo=timezone.utc)
    except ValueError:
        return None
    return dt.timestamp()


def parse_number(text: str) -> float | None:
    """``12``, ``0.5``, ``57.9%`` (kept as 57.9), ``True``/``False`` (1/0); None otherwise."""
    t = text.strip().rstrip(".").strip()
    if t in ("True", "False"):
        return 1.0 if t == "True" else 0.0
    if t.endswith("%"):
        t = t[:-1].strip()
    try:
        v = float(t)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


@functools.lru_cache(maxsize=1024)
def slug(key: str) -> str:
    """``#new-token`` -> ``new_token``; ``gen throughput (token/s)`` -> ``gen_throughput_token_per_s``."""
    s = key.strip().lstrip("#").replace("/s", "_per_s").replace("(ms)", "ms").replace("%", "pct")
    return re.sub(r"[^a-zA-Z0-9]+", "_", s).strip("_").lower()


@dataclass
class LogRows:
    """Rows collected while reading one log: steps rows per instance, series rows, signals."""

    stats: LineStats
    steps: list[dict] = field(default_factory=list)
    series: list[dict] = field(default_factory=list)
    signals: dict[str, dict[str, str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def add_series(self, instance: str, name: str, t_s: float, value: float, labels: str = "") -> None:
        if value is not None and math.isfinite(value):
            self.series.append({"instance": instance, "name": name, "labels": labels, "t_s": t_s, "value": value})

    def signal(self, instance: str, column: str, quality: str) -> None:
        sig = self.signals.setdefault(instance, {})
        # never upgrade: once a column is estimated/inferred anywhere in the instance, say so
        order = ("measured", "estimated", "inferred", "absent")
        if column not in sig or order.index(quality) > order.index(sig[column]):
            sig[column] = quality

    def timeline(self, fmt: str, clock: str, steps_frame: pd.DataFrame | None = None) -> Timeline:
        """Number the step rows per instance in line order, keep time from going backwards.

        ``steps_frame``: the rows as a frame instead of ``self.steps`` (sorted and numbered here by
        :func:`step_frame.order_steps`, the same rule).
        """
        if steps_frame is not None:
            steps, clamped = order_steps(steps_frame) if len(steps_frame) else (None, 0)
            return self._timeline(fmt, clock, steps, clamped)
        rows = []
        last_t: dict[str, float] = {}
        counter: dict[str, int] = {}
        clamped = 0
        for r in self.steps:
            inst = r["instance"]
            t0 = r["t_start_s"]
            if inst in last_t and t0 < last_t[inst]:
                # a line logged with an earlier time than the previous one (clock step, reordering)
                shift = last_t[inst] - t0
                r["t_start_s"], r["t_end_s"] = t0 + shift, r["t_end_s"] + shift
                clamped += 1
            last_t[inst] = r["t_start_s"]
            # in place: the rows are this reader's own, and a million copies would double the memory
            r["step"] = counter.get(inst, 0)
            counter[inst] = r["step"] + 1
            rows.append(r)
        return self._timeline(fmt, clock, pd.DataFrame(rows) if rows else None, clamped)

    def _timeline(self, fmt: str, clock: str, steps: pd.DataFrame | None, clamped: int) -> Timeline:
        if clamped:
            self.stats.note(f"{clamped} row(s) logged earlier than the row before them: moved forward to keep time order")
        # series are samples: time order within each series (lines may be logged out of order)
        series = pd.DataFrame(sorted(self.series, key=lambda r: r["t_s"])) if self.series else None
        meta = {"source": fmt, "clock": clock, "sources": [self.stats.to_meta()], "signals": self.signals,
                "partial": bool(self.stats.partial or self.stats.lines_skipped)}
        meta.update(self.meta)
        return Timeline(steps=steps, series=series, meta=meta)


def attach_events(steps: list[dict], events: list[tuple[str, float | None, str, float, str]]) -> int:
    """Fold per-line values into the rows they belong to; returns how many found no row.

    ``events`` are ``(instance, t_s, column, value, how)`` with ``how`` ``sum`` (counts: preemptions,
    retractions, KV bytes/seconds, graph steps), ``mean`` (ratios: expert imbalance) or ``min`` (the
    smallest batch a graph mode ran). An event
    goes to the first interval row (in time order) with ``t_start_s < t <= t_end_s``; else to the
    last step row (``t_start_s == t_end_s``: logs stamp steps with one time) at or before it (the
    event describes work just done); else, logged before every row, to the first row when that
    row ends at or after it.

    Each instance's rows are searched by a sorted merge (``np.searchsorted``), never by a scan per
    event: a 10-minute iteration log has a million rows and thousands of events.
    """
    by_inst: dict[str, list[dict]] = {}
    for r in steps:
        by_inst.setdefault(r["instance"], []).append(r)
    ev_by_inst: dict[str, list[tuple]] = {}
    orphans = 0
    for e in events:
        if e[0] not in by_inst or e[1] is None or not math.isfinite(e[3]):
            orphans += 1
        else:
            ev_by_inst.setdefault(e[0], []).append(e)
    acc: dict[tuple[int, str], tuple[str, list[float]]] = {}
    for inst, evs in ev_by_inst.items():
        rows = by_inst[inst]
        rows.sort(key=lambda r: r["t_start_s"] if r["t_start_s"] is not None else -math.inf)
        t0 = np.array([np.nan if r["t_start_s"] is None else r["t_start_s"] for r in rows], dtype=float)
        t1 = np.array([np.nan if r["t_end_s"] is None else r["t_end_s"] for r in rows], dtype=float)
        targets = event_rows(t0, t1, np.array([e[1] for e in evs], dtype=float))
        for e, i in zip(evs, targets.tolist()):
            if i < 0:
                orphans += 1
                continue
            acc.setdefault((i, e[2]), (e[4], []))[1].append(e[3])
        for (i, col), (how, nums) in acc.items():
            r = rows[i]
            prev = r.get(col)
            base = prev if isinstance(prev, float) and math.isfinite(prev) and how == "sum" else 0.0
            r[col] = base + sum(nums) if how == "sum" else min(nums) if how == "min" else sum(nums) / len(nums)
        acc.clear()
    return orphans


def _first_last_t(tl: Timeline) -> tuple[float, float] | None:
    ts = []
    if tl.steps is not None and len(tl.steps):
        ts += [float(tl.steps["t_start_s"].min()), float(tl.steps["t_end_s"].max())]
    if tl.series is not None and len(tl.series):
        ts += [float(tl.series["t_s"].min()), float(tl.series["t_s"].max())]
    ts = [t for t in ts if math.isfinite(t)]
    return (min(ts), max(ts)) if ts else None


def align_assumed_years(timelines: list[Timeline], inputs: list[tuple[Any, str]], read, options: dict) -> list[Timeline]:
    """Re-read year-less logs (``meta["year_assumed"]``) in the year of the unix-clock inputs beside them.

    vLLM prints ``MM-DD hh:mm:ss``; alone, the reader assumes the latest year that puts the log in
    the past. Fused with scrapes, traces or a container-stamped log of the same run, the right year
    is the one (among the reference's year and its neighbours, for runs across New Year) that puts
    the log's first line closest to the reference span. ``read(src, fmt, year=...)`` re-reads.
    """
    refs = [_first_last_t(tl) for tl in timelines
            if tl.meta.get("clock") == "unix" and "year_assumed" not in tl.meta]
    refs = [r for r in refs if r is not None]
    if not refs:
        return timelines
    lo, hi = min(r[0] for r in refs), max(r[1] for r in refs)
    out = []
    for tl, (src, fmt) in zip(timelines, inputs):
        span = _first_last_t(tl) if "year_assumed" in tl.meta else None
        if span is None:
            out.append(tl)
            continue
        first = datetime.fromtimestamp(span[0], tz=timezone.utc)
        ref_year = datetime.fromtimestamp(lo, tz=timezone.utc).year

        def gap(year: int) -> float:
            t = naive_to_unix(year, first.month, first.day, first.strftime("%H:%M:%S"))
            return math.inf if t is None else (0.0 if lo <= t <= hi else min(abs(t - lo), abs(t - hi)))

        best = min((ref_year - 1, ref_year, ref_year + 1), key=gap)
        if best == tl.meta["year_assumed"]:
            out.append(tl)
            continue
        new = read(src, fmt, year=best, **options)
        new.meta["notes"] = list(new.meta.get("notes", [])) + [
            f"log year taken from the unix-clock inputs read with it: {best}"]
        new.meta.pop("year_assumed", None)
        out.append(new)
    return out
