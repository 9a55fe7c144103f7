"""Reader of a Prometheus server (format ``prom-http``): a window of every target matching a selector.

One Timeline instance per ``instance`` label (and per vLLM ``engine`` / SGLang ``dp_rank`` where a
target has several); the rows are the same interval rows :mod:`.scrape_reader` builds from files,
so everything downstream reads both alike. From :data:`.prom_aggregate.AGGREGATE_FROM_TARGETS`
vLLM targets on, Prometheus computes the increases itself (:mod:`.prom_aggregate`).

The values at each ``step`` are what PromQL returns for a bare selector: the newest sample at or
before the step (within the lookback). Interval rows therefore lag the true scrape times by up to
one scrape interval; choose ``step_s`` >= the scrape interval. DCGM series in the window become
``sm_active`` in ``collectors.load`` (:func:`mixdiag.collectors.gpu.dcgm.fill_intervals`).
"""
from __future__ import annotations

import math
import time

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus import prom_aggregate as agg  # the fleet path
from mixdiag.collectors.prometheus.prom_common import TimedScrape
from mixdiag.collectors.prometheus.prom_http import queries, query_range, split_url
from mixdiag.collectors.prometheus.prom_intervals import build_timeline
from mixdiag.collectors.prometheus.prom_text import Scrape, canonical_name
from mixdiag.collectors.text_input import LineStats

FORMAT = "prom-http"
_DROP_LABELS = ("__name__", "job")


def sniff(head: bytes, name: str) -> bool:
    """A Prometheus server is addressed by URL, never by file content."""
    return name.startswith(("http://", "https://"))


def read(source: str, *, instance: str | None = None, selector: str = "", start: float | None = None,
         end: float | None = None, step_s: float = 15.0, window_s: float = 3600.0,
         timeout_s: float = 30.0, **options) -> Timeline:
    """Read ``[start, end]`` (default: the last ``window_s`` seconds) of every matching target.

    ``source`` is the server URL (``http://host:9090``, optionally with the window in its query,
    see :func:`split_url`); ``selector`` narrows the targets (``{job="vllm"}``). ``instance``
    renames the Timeline instance when exactly one target matched.
    """
    if not isinstance(source, str) or not source.startswith(("http://", "https://")):
        raise UserError(f"prom-http needs a Prometheus URL like http://host:9090, got {source!r}")
    source, from_url = split_url(source)
    selector = selector or from_url.get("selector", "")
    start = start if start is not None else from_url.get("start")
    end = end if end is not None else from_url.get("end")
    step_s = from_url.get("step", step_s)
    window_s = from_url.get("window", window_s)
    if not (step_s > 0 and math.isfinite(step_s)):
        raise UserError(f"step_s must be a positive number of seconds, got {step_s!r}")
    end = float(end) if end is not None else time.time()
    start = float(start) if start is not None else end - window_s
    if not start < end:
        raise UserError(f"empty window: start {start} is not before end {end}")
    stats = LineStats(format=FORMAT, path=source)
    stats.note(f"window [{start:.3f}, {end:.3f}] step {step_s:g}s; selector {selector or '(none)'}")
    aggregate = str(options.get("aggregate") or from_url.get("aggregate") or "auto")
    if aggregate not in ("auto", "yes", "no"):
        raise UserError(f"aggregate={aggregate!r}: use auto, yes or no")
    if aggregate == "yes" or (aggregate == "auto" and instance is None
                              and agg.count_vllm_targets(source, selector, end, timeout_s) >= agg.AGGREGATE_FROM_TARGETS):
        return agg.read_aggregated(source, start, end, step_s, selector, max(timeout_s, 60.0), stats)
    by_t: dict[float, Scrape] = {}
    for q in queries(selector):
        for series in query_range(source, q, start, end, step_s, timeout_s):
            stats.lines_total += 1
            metric = series["metric"]
            name = canonical_name(metric.get("__name__", ""))
            labels = tuple(sorted((k, v) for k, v in metric.items() if k not in _DROP_LABELS))
            bad = 0
            for t, v in series["values"]:
                try:
                    val = float(v)
                except (TypeError, ValueError):
                    bad += 1
                    continue
                by_t.setdefault(float(t), Scrape()).add(name, labels, val)
            if bad:
                stats.skipped(f"{name}{dict(labels)}", f"{bad} non-numeric value(s)")
            else:
                stats.parsed()
    if not by_t:
        stats.partial = True
        stats.note("no series matched the selector in the window")
    timed = [TimedScrape(t, s) for t, s in sorted(by_t.items())]
    targets = sorted({dict(k).get("instance") for s in by_t.values() for fam in s.samples.values() for k in fam}
                     - {None})
    if instance is not None and len(targets) > 1:
        raise UserError(f"instance={instance!r} names one target, but the selector matched {len(targets)}: "
                        f"{', '.join(targets[:5])}")
    if instance is not None:
        for s in by_t.values():
            for name, fam in list(s.samples.items()):
                s.samples[name] = {tuple((k, instance if k == "instance" else v) for k, v in lab): val
                                   for lab, val in fam.items()}
    tl = build_timeline(timed, instance or "prometheus", clock="unix", fmt=FORMAT, sources=[stats.to_meta()])
    tl.meta["targets"] = targets
    return tl
