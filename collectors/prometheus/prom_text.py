"""Prometheus text exposition: one ``/metrics`` scrape, or a directory of timed scrapes.

Reads what vLLM (``vllm:`` colon names, old and new names, ``engine``/``model_name`` labels),
SGLang (``sglang:`` and ``sglang_`` names) and mixdiag's engine (``mixdiag_engine_*``) expose.
A single scrape gives gauges and raw counter values as ``series``; a sequence of scrapes (files
named ``<unix_time_s>.prom`` in a directory, or ``(t_s, text)`` pairs via :func:`read_scrapes`)
gives one ``interval`` row per pair of consecutive scrapes (see :mod:`.prom_intervals`).

Lenient about format drift, strict about honesty: every line is parsed, ignored (comments,
``# HELP``/``# TYPE``, ``*_created``) or skipped and counted (bad syntax, a bad value, a duplicate
series, a last line cut mid-way).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from mixdiag import wire
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus.prom_intervals import TimedScrape, build_timeline, is_gauge
from mixdiag.collectors.text_input import LineStats, is_garbage, read_lines, source_name, split_lines

FORMAT = "prom-text"

LabelKey = tuple[tuple[str, str], ...]  # sorted (name, value) pairs

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^\s*({_NAME})\s*(\{{.*\}})?\s*([^\s#]+)(?:\s+(-?\d+(?:\.\d+)?))?\s*(?:#.*)?$")
_VALUE = re.compile(r"^[+-]?(?:[Ii]nf(?:inity)?|NaN|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_TYPE = re.compile(rf"^#\s*TYPE\s+({_NAME})\s+(\w+)")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_SNIFF = re.compile(rb"^(?:# (?:HELP|TYPE) |(?:vllm|sglang|" + wire.METRIC_PREFIX.encode() + rb"|DCGM_FI)[:_]\w*[{ ])", re.M)
_SCRAPE_FILE = re.compile(r"^(\d+(?:\.\d+)?)\.prom$")
# Scrape names users' own loops write: a unix time in s or ms anywhere (scrape-1730000000123.prom),
# or an RFC 3339 time (2026-04-05T20:02:51Z.prom, metrics_2026-04-05_20-02-51.txt).
_SCRAPE_EXT = (".prom", ".txt", ".metrics", ".openmetrics")
_NAME_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T_ ](\d\d)[:\-]?(\d\d)[:\-]?(\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?")
_NAME_UNIX = re.compile(r"(?<![\d.])(\d{13}|\d{10})(?:\.(\d+))?(?![\d])")


def canonical_name(name: str) -> str:
    """``sglang_x``/``vllm_x`` (underscore variants) -> ``sglang:x``/``vllm:x``; others unchanged."""
    for prefix in ("sglang_", "vllm_"):
        if name.startswith(prefix):
            return prefix[:-1] + ":" + name[len(prefix):]
    return name


def _unescape(v: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], v)


def parse_labels(body: str) -> LabelKey | None:
    """``{a="x",b="y"}`` -> sorted pairs; None when the label set does not parse."""
    inner = body.strip()[1:-1]
    out: dict[str, str] = {}
    pos = 0
    while pos < len(inner):
        if not inner[pos:].strip():
            break
        m = _LABEL.match(inner, pos)
        if m is None:
            return None
        out[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return tuple(sorted(out.items()))


def parse_value(text: str) -> float | None:
    """A sample value (``1.5e3``, ``+Inf``, ``NaN``); None when it is not one."""
    if not _VALUE.match(text):
        return None
    return float(text)


@dataclass
class Scrape:
    """One exposition: ``samples[name][labels] = value`` plus the ``# TYPE`` of each family."""

    samples: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    timestamps_ms: set[int] = field(default_factory=set)
    #: family -> earliest ``<family>_created`` value (unix s): when its counter started from 0
    created: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, labels: LabelKey, value: float) -> bool:
        """Store a sample; False if that series is already present (a duplicate)."""
        series = self.samples.setdefault(name, {})
        if labels in series:
            return False
        series[labels] = value
        return True

    def __len__(self) -> int:
        return sum(len(v) for v in self.samples.values())


def parse(text: str, stats: LineStats | None = None, *, final_newline: bool | None = None) -> Scrape:
    """Parse one exposition text; every line is counted in ``stats`` (created when omitted)."""
    lines, ends = split_lines(text)
    if stats is None:
        stats = LineStats(format=FORMAT, path="<text>", lines_total=len(lines))
    return _parse_lines(lines, ends if final_newline is None else final_newline, stats)


def _parse_lines(lines: Sequence[str], ends_with_newline: bool, stats: LineStats) -> Scrape:
    scrape = Scrape()
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line:
            stats.ignored()
            continue
        if is_garbage(raw):
            stats.skipped(raw, "not text")
            continue
        if line.startswith("#"):
            m = _TYPE.match(line)
            if m:
                scrape.types[canonical_name(m.group(1))] = m.group(2).lower()
            stats.ignored()
            continue
        if i == last and not ends_with_newline:
            # The exposition format ends every line with \n: a last line without one was cut.
            stats.skipped(raw, "last line has no newline (cut mid-line?)")
            stats.partial = True
            stats.note("input ends mid-line: the last line was not used")
            continue
        m = _SAMPLE.match(line)
        if m is None:
            stats.skipped(raw, "not a sample line")
            continue
        name, body, vtext, ts = m.groups()
        labels: LabelKey | None = ()
        if body:
            labels = parse_labels(body)
            if labels is None:
                stats.skipped(raw, "bad label set")
                continue
        value = parse_value(vtext)
        if value is None:
            stats.skipped(raw, "bad value")
            continue
        name = canonical_name(name)
        if name.endswith("_created"):
            stats.ignored()  # creation timestamps of counters, not data: kept only as the counters' origin
            fam = name[: -len("_created")]
            if math.isfinite(value) and value > 0:
                scrape.created[fam] = min(value, scrape.created.get(fam, value))
            continue
        if ts is not None:
            scrape.timestamps_ms.add(int(float(ts)))
        if not scrape.add(name, labels, value):
            stats.skipped(raw, "duplicate series")
            continue
        stats.parsed()
    _normalise_counter_names(scrape)
    return scrape


def _normalise_counter_names(scrape: Scrape) -> None:
    """Counters typed ``counter`` but exposed without ``_total`` (old clients) get the suffix."""
    for fam, typ in scrape.types.items():
        if typ == "counter" and not fam.endswith("_total") and fam in scrape.samples:
            target = scrape.samples.setdefault(fam + "_total", {})
            for k, v in scrape.samples.pop(fam).items():
                target.setdefault(k, v)


def sniff(head: bytes, name: str) -> bool:
    """True for a text exposition (``# TYPE`` lines or known metric names) or a ``*.prom`` file."""
    if name.endswith(".prom"):
        return True
    if os.path.isdir(name):
        try:
            return any(p.name.lower().endswith(".prom") or name_time(p.name) is not None and
                       p.name.lower().endswith(_SCRAPE_EXT) for p in Path(name).iterdir())
        except OSError:
            return False
    return _SNIFF.search(head[:65536]) is not None


def _scrape_time(scrape: Scrape, t_s: float | None, stats: LineStats) -> tuple[float, str]:
    if t_s is not None:
        return float(t_s), "unix"
    if len(scrape.timestamps_ms) == 1:
        return next(iter(scrape.timestamps_ms)) / 1000.0, "unix"
    stats.note("scrape time unknown (no t_s given, no single sample timestamp): t = 0 on a relative clock")
    return 0.0, "relative"


def name_time(name: str) -> float | None:
    """The unix time a scrape file's name carries (s or ms anywhere, or RFC 3339); None if none."""
    stem = name
    for ext in _SCRAPE_EXT:
        if stem.lower().endswith(ext):
            stem = stem[: -len(ext)]
            break
    m = _NAME_RFC3339.search(stem)
    if m:
        y, mo, d, hh, mi, ss, frac, zone = m.groups()
        from mixdiag.collectors.logs.log_lines import rfc3339_to_unix
        t = rfc3339_to_unix(f"{y}-{mo}-{d}T{hh}:{mi}:{ss}" + (f".{frac}" if frac else ""), zone)
        if t is not None:
            return t
    for m in _NAME_UNIX.finditer(stem):
        digits, frac = m.groups()
        t = int(digits) / (1000.0 if len(digits) == 13 else 1.0) + (float("0." + frac) if frac else 0.0)
        if 946684800 <= t < 4102444800:  # 2000..2100: a clock reading, not a counter or a pid
            return t
    return None


def scrape_files(directory: str | os.PathLike, *, mtime: bool = False) -> tuple[list[tuple[float, Path]], list[str]]:
    """``(t_s, path)`` of every timed scrape in ``directory`` (time order) and the other names.

    A scrape is a ``.prom``/``.txt``/``.metrics`` file whose name carries a unix time (s or ms) or an
    RFC 3339 time; with ``mtime=True`` a ``.prom``/``.metrics`` file without one is timed by its
    modification time (the caller says so in a note).
    """
    d = Path(directory)
    found, other = [], []
    for p in sorted(d.iterdir()):
        t = name_time(p.name) if p.is_file() and p.name.lower().endswith(_SCRAPE_EXT) else None
        if t is None and mtime and p.is_file() and p.name.lower().endswith((".prom", ".metrics")):
            t = p.stat().st_mtime
        if t is not None:
            found.append((t, p))
        else:
            other.append(p.name)
    found.sort()
    return found, other


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
            timed.append(TimedScrape(t, _parse_lines(lines, ends, stats), stats))
        rest = [n for n in other if (d / n) not in subdirs]
        if by_mtime:
            timed[0].stats.note(f"{by_mtime} scrape file name(s) carry no time: timed by file modification "
                                "time (unix clock; as exact as the copy that kept it)")
        if rest:
            timed[0].stats.note(f"{len(rest)} other file(s) in the directory not read, e.g. {rest[0]}")
        timed.sort(key=lambda s: s.t_s)
        origin = creation_scrape(timed)
        if origin is not None:
            timed.insert(0, origin)
        parts.insert(0, build_timeline(timed, base, clock="unix", fmt=FORMAT))
    if len(parts) == 1:
        return parts[0]
    tl = Timeline.concat(parts)
    tl.meta["metric_sources"] = {k: v for p in parts for k, v in p.meta.get("metric_sources", {}).items()}
    tl.meta["notes"] = [n for p in parts for n in p.meta.get("notes", [])]
    return tl


def read(source, *, instance: str | None = None, t_s: float | None = None, **options) -> Timeline:
    """Read one scrape (path or file object) or a directory of ``<unix_time_s>.prom`` scrapes.

    ``instance`` names the Timeline instance (default: the file or directory name); series with
    several ``engine`` (vLLM DP) or ``dp_rank`` (SGLang) values become one instance each.
    """
    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        return _read_dir(Path(source), instance or Path(source).resolve().name)
    lines, ends, stats = read_lines(source, FORMAT)
    scrape = _parse_lines(lines, ends, stats)
    if lines and stats.lines_parsed == 0 and not scrape.types:
        raise UserError(f"{source_name(source)}: not a Prometheus text exposition (no sample line parsed)")
    t, clock = _scrape_time(scrape, t_s, stats)
    base = instance or Path(source_name(source)).stem
    from mixdiag.collectors.prometheus.endpoint import since_start  # one dump: totals since process start

    return since_start(scrape, t, base, clock=clock, fmt=FORMAT, stats=stats)


def read_scrapes(pairs: Iterable[tuple[float, str]], *, instance: str = "scrape", **options) -> Timeline:
    """A sequence of ``(t_s, exposition_text)`` pairs (e.g. polled live) -> interval rows."""
    timed = []
    for i, (t, text) in enumerate(pairs):
        if not math.isfinite(float(t)):
            raise UserError(f"scrape {i}: time {t!r} is not a finite number")
        lines, ends = split_lines(text)
        stats = LineStats(format=FORMAT, path=f"<scrape {i} at t={float(t):.3f}>", lines_total=len(lines))
        timed.append(TimedScrape(float(t), _parse_lines(lines, ends, stats), stats))
    timed.sort(key=lambda s: s.t_s)
    return build_timeline(timed, instance, clock="unix", fmt=FORMAT)
