"""Reader of Prometheus text exposition files (format ``prom-text``): one scrape, a directory of
timed scrapes, or ``(t_s, text)`` pairs polled live -> a Timeline.

A sequence of scrapes (files named ``<unix_time_s>.prom`` in a directory, or pairs via
:func:`read_scrapes`) gives one ``interval`` row per pair of consecutive scrapes
(:mod:`.prom_intervals`). One scrape (a single dump file, or an endpoint sampled once) has no
interval between two scrapes, but its counters and histograms hold everything since the process
started: :func:`since_start` turns it into one interval row per target covering process start ->
scrape (``process_start_time_seconds`` when exposed), so ITL quantiles, token totals and
preemptions of the whole run reach the report.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus import concatenated
from mixdiag.collectors.prometheus.prom_common import SPLIT_LABELS, TimedScrape, is_gauge
from mixdiag.collectors.prometheus.prom_intervals import build_timeline
from mixdiag.collectors.prometheus.prom_text import (FORMAT, SCRAPE_EXTENSIONS, Scrape, looks_like_exposition,
                                                     name_time, parse_lines, scrape_files)
from mixdiag.collectors.text_input import LineStats, read_lines, source_name, split_lines

#: The gauge prometheus_client's process collector exposes (vLLM and SGLang serve it).
START_METRIC = "process_start_time_seconds"
_START_SAMPLE = "mixdiag_since_start_marker"  # internal placeholder, dropped from the output


def sniff(head: bytes, name: str) -> bool:
    """True for a text exposition (``# TYPE`` lines or known metric names) or a ``*.prom`` file."""
    if name.endswith(".prom"):
        return True
    if os.path.isdir(name):
        try:
            return any(p.name.lower().endswith(".prom") or name_time(p.name) is not None and
                       p.name.lower().endswith(SCRAPE_EXTENSIONS) for p in Path(name).iterdir())
        except OSError:
            return False
    return looks_like_exposition(head)


def _scrape_time(scrape: Scrape, t_s: float | None, stats: LineStats) -> tuple[float, str]:
    if t_s is not None:
        return float(t_s), "unix"
    if len(scrape.timestamps_ms) == 1:
        return next(iter(scrape.timestamps_ms)) / 1000.0, "unix"
    stats.note("scrape time unknown (no t_s given, no single sample timestamp): t = 0 on a relative clock")
    return 0.0, "relative"


def creation_scrape(timed: list[TimedScrape], max_periods: float = 2.0) -> TimedScrape | None:
    """The scrape the counters imply at their creation: every counter and histogram series of the
    first scrape at 0, at the earliest ``*_created`` time - or None.

    prometheus_client (vLLM's and SGLang's metrics library) exposes ``<family>_created``, the time a
    counter started from 0; a labelled child is created at first use, so it was 0 before. The work
    done before the first scrape is then one interval like the others, not lost. Only for one
    target (one ``instance``), and only when the creation lies at most ``max_periods`` scrape
    periods before the first scrape: a process started hours earlier would make one interval far
    coarser than the rest, whose quantiles do not compare."""
    if len(timed) < 2:
        return None
    first = timed[0]
    created = [t for t in first.scrape.created.values() if t < first.t_s]
    if not created:
        return None
    t0 = min(created)
    gaps = sorted(b.t_s - a.t_s for a, b in zip(timed, timed[1:]))
    period = gaps[len(gaps) // 2]
    if not period > 0 or first.t_s - t0 > max_periods * period:
        return None
    insts = {dict(lab).get("instance") for series in first.scrape.samples.values() for lab in series}
    if len(insts) > 1:
        return None
    zero = Scrape(types=dict(first.scrape.types))
    for name, series in first.scrape.samples.items():
        if not is_gauge(name, first.scrape.types):
            for labels in series:
                zero.add(name, labels, 0.0)
    if first.stats is not None:
        first.stats.note(f"the first interval starts at the counters' creation ({first.t_s - t0:.2f} s before the "
                         "first scrape, *_created): they count from 0 there")
    return TimedScrape(t0, zero, None)


def _read_dir(d: Path, base: str) -> Timeline:
    """Timed scrapes in ``d`` (instance ``base``); each sub-directory holding timed scrapes is one
    more instance named after it (a run directory's ``scrapes/engine1/`` of a multi-instance run)."""
    files, other = scrape_files(d)
    by_mtime = 0
    if not files:  # names without a time: the files' modification times, flagged
        files, other = scrape_files(d, mtime=True)
        by_mtime = len(files)
    subdirs = [d / name for name in other if (d / name).is_dir() and scrape_files(d / name)[0]]
    if not files and not subdirs:
        raise UserError(f"{d}: no scrape files (*.prom with a unix or RFC 3339 time in the name) in this directory")
    parts = [_read_dir(sd, sd.name) for sd in subdirs]
    if files:
        timed = []
        for t, p in files:
            lines, ends, stats = read_lines(p, FORMAT)
            timed.append(TimedScrape(t, parse_lines(lines, ends, stats), stats))
        rest = [n for n in other if (d / n) not in subdirs]
        if by_mtime:
            timed[0].stats.note(f"{by_mtime} scrape file name(s) carry no time: timed by file modification "
                                "time (unix clock; as exact as the copy that kept it)")
        unplaced = [n for n in rest if (d / n).is_file() and n.lower().endswith(SCRAPE_EXTENSIONS)]
        rest = [n for n in rest if n not in unplaced]
        if rest:
            timed[0].stats.note(f"{len(rest)} other file(s) in the directory not read, e.g. {rest[0]}")
        timed.sort(key=lambda s: s.t_s)
        origin = creation_scrape(timed)
        if origin is not None:
            timed.insert(0, origin)
        parts.insert(0, build_timeline(timed, base, clock="unix", fmt=FORMAT,
                                       sources=[_unplaced_entry(d / n) for n in unplaced]))
    if len(parts) == 1:
        return parts[0]
    tl = Timeline.concat(parts)
    tl.meta["metric_sources"] = {k: v for p in parts for k, v in p.meta.get("metric_sources", {}).items()}
    tl.meta["notes"] = [n for p in parts for n in p.meta.get("notes", [])]
    return tl


def _unplaced_entry(path: Path) -> dict:
    """The sources entry of a scrape-named file that could not be placed in time: every line skipped."""
    lines, _, stats = read_lines(path, FORMAT)
    for line in lines:
        stats.skipped(line, "scrape file whose name carries no time: not placed among the scrapes")
    if not lines:
        stats.incomplete("empty scrape file whose name carries no time")
    return stats.to_meta()


def read(source, *, instance: str | None = None, t_s: float | None = None, **options) -> Timeline:
    """Read one scrape (path or file object) or a directory of ``<unix_time_s>.prom`` scrapes.

    ``instance`` names the Timeline instance (default: the file or directory name); series with
    several ``engine`` (vLLM DP) or ``dp_rank`` (SGLang) values become one instance each.
    """
    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        return _read_dir(Path(source), instance or Path(source).resolve().name)
    lines, ends, stats = read_lines(source, FORMAT)
    ranges = concatenated.split(lines)
    if ranges:  # several scrapes appended to one file (a `curl >> file` loop)
        timed, clock = concatenated.timed_parts(lines, ends, stats, ranges, options.get("interval_s"))
        if clock == "unix":
            origin = creation_scrape(timed)
            if origin is not None:
                timed.insert(0, origin)
        return build_timeline(timed, instance or Path(source_name(source)).stem, clock=clock, fmt=FORMAT)
    scrape = parse_lines(lines, ends, stats)
    if lines and stats.lines_parsed == 0 and not scrape.types:
        raise UserError(f"{source_name(source)}: not a Prometheus text exposition (no sample line parsed)")
    t, clock = _scrape_time(scrape, t_s, stats)
    base = instance or Path(source_name(source)).stem
    return since_start(scrape, t, base, clock=clock, fmt=FORMAT, stats=stats)


def read_scrapes(pairs: Iterable[tuple[float, str]], *, instance: str = "scrape", **options) -> Timeline:
    """A sequence of ``(t_s, exposition_text)`` pairs (e.g. polled live) -> interval rows."""
    timed = []
    for i, (t, text) in enumerate(pairs):
        if not math.isfinite(float(t)):
            raise UserError(f"scrape {i}: time {t!r} is not a finite number")
        lines, ends = split_lines(text)
        stats = LineStats(format=FORMAT, path=f"<scrape {i} at t={float(t):.3f}>", lines_total=len(lines))
        timed.append(TimedScrape(float(t), parse_lines(lines, ends, stats), stats))
    timed.sort(key=lambda s: s.t_s)
    return build_timeline(timed, instance, clock="unix", fmt=FORMAT)


def _marker_scrape(scrape) -> object:
    """An empty scrape holding one placeholder sample per target/DP-rank label set of ``scrape``
    (so every target of the dump gets a predecessor in which all its counters were zero)."""
    keys = set()
    for series in scrape.samples.values():
        for labels in series:
            keys.add(tuple((k, v) for k, v in labels if k == "instance" or k in SPLIT_LABELS))
    out = Scrape()
    for k in keys or {()}:
        out.add(_START_SAMPLE, k, 0.0)
    return out


def process_start(scrape) -> float | None:
    """The newest ``process_start_time_seconds`` of the scrape (unix s), or None."""
    vals = [v for v in scrape.samples.get(START_METRIC, {}).values() if math.isfinite(v) and v > 0]
    return max(vals) if vals else None


def since_start(scrape, t_s: float, base: str, *, clock: str = "unix", fmt: str = "prom-endpoint",
                stats=None) -> Timeline:
    """One dump -> one interval row per target covering process start -> ``t_s`` (counters from zero).

    The row's ``t_start_s`` is ``process_start_time_seconds`` when the scrape has it and the scrape
    time is on the unix clock; otherwise the start is unknown and the row is zero-length at ``t_s``
    (noted). ``meta["since_start"]`` marks the Timeline so the report prints a summary.
    """
    start = process_start(scrape)
    known = start is not None and clock == "unix" and start <= t_s
    t0 = start if known else t_s
    # Series and honesty counters as for any single scrape (every sample kept); rows from a
    # predecessor in which every counter of every target was zero.
    tl = build_timeline([TimedScrape(t_s, scrape, stats)], base, clock=clock, fmt=fmt)
    rows = build_timeline([TimedScrape(t0, _marker_scrape(scrape)), TimedScrape(t_s, scrape)],
                          base, clock=clock, fmt=fmt)
    steps, series = rows.steps, tl.series
    meta = dict(tl.meta)
    meta["signals"], meta["metric_sources"] = rows.meta["signals"], rows.meta["metric_sources"]
    if rows.meta.get("quantile_bounds"):  # quantiles that are only bounds: the report says "<= x" / ">= x"
        meta["quantile_bounds"] = rows.meta["quantile_bounds"]
    meta["notes"] = [n for n in meta.get("notes", []) if not n.startswith("one scrape: no intervals")]
    meta["since_start"] = {"t_start_s": t0, "t_end_s": t_s, "start_known": known}
    meta["notes"] = list(meta.get("notes", [])) + [
        "one scrape: a since-start row per target (counters and histograms hold everything since the "
        "process started)" + ("" if known else f"; process start unknown ({START_METRIC} absent or not "
                                                  "on the scrape's clock): zero-length row")]
    return Timeline(steps, None, series, meta)
