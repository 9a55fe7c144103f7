"""Several scrapes appended to one file, the capture an operator makes by hand::

    while sleep 1; do date +%s; curl -s localhost:8000/metrics; done >> metrics.txt

Read as one scrape, such a file held each series many times (all but one skipped as duplicates) and
gave one since-start row. Here it is split where the exposition starts again: where the file's first
``# HELP``/``# TYPE`` line repeats (the first sample's series when it has no comments), provided
consecutive parts share most of their series (two different targets appended are not a time series).

Times, best first: a time line just before a part - unix seconds (``date +%s``, optionally with a
fraction or in ms), RFC 3339 / ISO 8601 with a zone (``date -Iseconds``), or ``date``'s default
``Wed Dec  2 07:37:05 UTC 2026`` in UTC/GMT - with or without a leading ``#``; else one sample
timestamp shared by the part; else the parts sit ``interval_s`` apart (default 1 s) on a relative
clock, and a note says the spacing was assumed. Time lines count as parsed, the rest as usual.
"""
from __future__ import annotations

import re

from mixdiag.collectors.prometheus.prom_common import TimedScrape
from mixdiag.collectors.prometheus.prom_text import parse_lines
from mixdiag.collectors.text_input import LineStats, rfc3339_to_unix

#: consecutive parts must share at least this share of their sample series to be one target's scrapes
MIN_SHARED = 0.8
_UNIX = re.compile(r"^#?\s*(\d{10}(?:\.\d+)?|\d{13})\s*$")
_ISO = re.compile(r"^#?\s*(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d(?:[.,]\d+)?)(Z|[+-]\d\d:?\d\d)\s*$")
_DATE = re.compile(r"^#?\s*[A-Z][a-z]{2},? +([A-Z][a-z]{2}) +(\d{1,2}) +(\d\d:\d\d:\d\d) +(UTC|GMT) +(\d{4})\s*$")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s")


def line_time(line: str) -> float | None:
    """Unix seconds of a time line (module doc), or None."""
    s = line.strip()
    m = _UNIX.match(s)
    if m:
        v = float(m.group(1))
        return v / 1000.0 if len(m.group(1)) == 13 else v
    m = _ISO.match(s)
    if m:
        return rfc3339_to_unix(f"{m.group(1)}T{m.group(2).replace(',', '.')}", m.group(3))
    m = _DATE.match(s)
    if m and m.group(1) in _MONTHS:
        mo = _MONTHS.index(m.group(1)) + 1
        return rfc3339_to_unix(f"{m.group(5)}-{mo:02d}-{int(m.group(2)):02d}T{m.group(3)}", None)  # UTC/GMT
    return None


def _starts(lines: list[str]) -> list[int]:
    """Line numbers where an exposition starts (again)."""
    first = next((ln.strip() for ln in lines if ln.startswith(("# HELP ", "# TYPE "))), None)
    if first is not None:
        return [i for i, ln in enumerate(lines) if ln.strip() == first]
    key = next((m.group(1) for ln in lines if (m := _SERIES.match(ln.strip()))), None)
    if key is None:
        return []
    return [i for i, ln in enumerate(lines) if (m := _SERIES.match(ln.strip())) and m.group(1) == key]


def _series(lines: list[str]) -> set[str]:
    return {m.group(1) for ln in lines if (m := _SERIES.match(ln.strip()))}


def split(lines: list[str]) -> list[tuple[int, int]] | None:
    """``(start, end)`` line ranges of the appended scrapes (time lines before a part belong to it),
    or None when the file holds one scrape (or parts of different targets)."""
    starts = _starts(lines)
    if len(starts) < 2:
        return None
    # a part begins at its time line (and blank lines) just before the exposition restarts
    begins = []
    for s in starts:
        b = s
        while b > 0 and (not lines[b - 1].strip() or line_time(lines[b - 1]) is not None) and b - 1 not in begins:
            b -= 1
        begins.append(b)
    begins[0] = 0
    ranges = list(zip(begins, begins[1:] + [len(lines)]))
    sets = [_series(lines[a:b]) for a, b in ranges]
    for x, y in zip(sets, sets[1:]):
        if not x or not y or len(x & y) < MIN_SHARED * max(len(x), len(y)):
            return None
    return ranges


def timed_parts(lines: list[str], ends: bool, stats: LineStats, ranges: list[tuple[int, int]],
                interval_s: float | None) -> tuple[list[TimedScrape], str]:
    """The parts parsed and timed: ``(scrapes, clock)``. Every line is counted in the file's one
    ``stats`` (the first scrape carries it: one sources entry per input), and a note says how the
    parts were timed."""
    parts, times = [], []
    for a, b in ranges:
        t = None
        keep = []
        for ln in lines[a:b]:
            lt = line_time(ln)
            if lt is not None and t is None:  # the part's time line: read (parsed), not a sample
                t = lt
                stats.parsed()
                continue
            keep.append(ln)
        scrape = parse_lines(keep, ends if b == len(lines) else True, stats)
        if t is None and len(scrape.timestamps_ms) == 1:
            t = next(iter(scrape.timestamps_ms)) / 1000.0
        parts.append(scrape)
        times.append(t)
    if all(t is not None for t in times) and all(b > a for a, b in zip(times, times[1:])):
        clock = "unix"
        stats.note(f"{len(parts)} scrapes appended in one file, each timed by the time line or sample "
                   "timestamp before it")
    else:
        clock, step = "relative", float(interval_s or 1.0)
        times = [k * step for k in range(len(parts))]
        stats.note(f"{len(parts)} scrapes appended in one file without a time for each (a `date +%s` line "
                   f"before each gives one): placed {step:g} s apart on a relative clock"
                   + ("" if interval_s else " (assumed; pass interval_s= / --interval S)"))
    return [TimedScrape(t, s, stats if k == 0 else None) for k, (t, s) in enumerate(zip(times, parts))], clock
