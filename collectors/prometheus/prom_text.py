"""Prometheus text exposition parsing: one ``/metrics`` text -> a :class:`Scrape`, and the times
that scrape file names carry. Parsing only: turning scrapes into a Timeline is
:mod:`.scrape_reader`'s (files, directories, ``(t_s, text)`` pairs) and :mod:`.prom_intervals`'.

Parses what vLLM (``vllm:`` colon names, old and new names, ``engine``/``model_name`` labels),
SGLang (``sglang:`` and ``sglang_`` names) and mixdiag's engine (``mixdiag_engine_*``) expose.
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
from typing import Sequence

from mixdiag import wire

from mixdiag.collectors.prometheus.prom_common import LabelKey
from mixdiag.collectors.text_input import LineStats, is_garbage, rfc3339_to_unix, split_lines

FORMAT = "prom-text"

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
SCRAPE_EXTENSIONS = (".prom", ".txt", ".metrics", ".openmetrics")
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
    return parse_lines(lines, ends if final_newline is None else final_newline, stats)


def parse_lines(lines: Sequence[str], ends_with_newline: bool, stats: LineStats) -> Scrape:
    """Parse already split lines (``ends_with_newline``: the text ended in one); counted in ``stats``."""
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
    cut = incomplete_histograms(scrape)
    if cut:
        stats.incomplete(f"exposition cut? {len(cut)} histogram series without their +Inf bucket or _count, "
                         f"e.g. {cut[0]}: its quantiles and counts are not used as whole")
    return scrape


def incomplete_histograms(scrape: Scrape) -> list[str]:
    """Histogram series (``family{labels}``) missing their ``+Inf`` bucket or their ``_count``.

    Every histogram series ends with ``le="+Inf"`` and ``_count`` (client libraries always write
    both), so a series without them is the sign of an exposition cut mid-family at a line end,
    where no half line shows the cut.
    """
    out = []
    for name, series in scrape.samples.items():
        if not name.endswith("_bucket"):
            continue
        fam = name[: -len("_bucket")]
        counts = scrape.samples.get(fam + "_count", {})
        groups: dict[LabelKey, bool] = {}
        for labels in series:
            rest = tuple((k, v) for k, v in labels if k != "le")
            has_inf = any(k == "le" and v.strip().lower() in ("+inf", "inf") for k, v in labels)
            groups[rest] = groups.get(rest, False) or has_inf
        for rest, has_inf in groups.items():
            if not has_inf or rest not in counts:
                lab = ",".join(f'{k}="{v}"' for k, v in rest)
                out.append(f"{fam}{{{lab}}}" if lab else fam)
    return out


def _normalise_counter_names(scrape: Scrape) -> None:
    """Counters typed ``counter`` but exposed without ``_total`` (old clients) get the suffix."""
    for fam, typ in scrape.types.items():
        if typ == "counter" and not fam.endswith("_total") and fam in scrape.samples:
            target = scrape.samples.setdefault(fam + "_total", {})
            for k, v in scrape.samples.pop(fam).items():
                target.setdefault(k, v)


def looks_like_exposition(head: bytes) -> bool:
    """Whether bytes hold Prometheus text exposition (``# HELP``/``# TYPE`` lines or known metric names)."""
    return _SNIFF.search(head[:65536]) is not None


def name_time(name: str) -> float | None:
    """The unix time a scrape file's name carries (s or ms anywhere, or RFC 3339); None if none."""
    stem = name
    for ext in SCRAPE_EXTENSIONS:
        if stem.lower().endswith(ext):
            stem = stem[: -len(ext)]
            break
    m = _NAME_RFC3339.search(stem)
    if m:
        y, mo, d, hh, mi, ss, frac, zone = m.groups()
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
        t = name_time(p.name) if p.is_file() and p.name.lower().endswith(SCRAPE_EXTENSIONS) else None
        if t is None and mtime and p.is_file() and p.name.lower().endswith((".prom", ".metrics")):
            t = p.stat().st_mtime
        if t is not None:
            found.append((t, p))
        else:
            other.append(p.name)
    found.sort()
    return found, other


