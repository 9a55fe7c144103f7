"""Prometheus HTTP API: ``query_range`` over a window and a label selector, many targets at once.

This is how mixdiag reads a fleet: Prometheus (or whatever federates it: Thanos, Mimir, VictoriaMetrics
speak the same API) is the distributed store. One Timeline instance per ``instance`` label (and per
vLLM ``engine`` / SGLang ``dp_rank`` where a target has several); the rows are the same interval
rows :mod:`.prom_text` builds from files, so everything downstream reads both alike.

The values at each ``step`` are what PromQL returns for a bare selector: the newest sample at or
before the step (within the lookback). Interval rows therefore lag the true scrape times by up to
one scrape interval; choose ``step_s`` >= the scrape interval.
"""
from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

from mixdiag import wire
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus.prom_intervals import ITL_HISTOGRAMS, TimedScrape, build_timeline
from mixdiag.collectors.prometheus.prom_text import Scrape, canonical_name
from mixdiag.collectors.text_input import LineStats

FORMAT = "prom-http"
#: Metric-name prefixes fetched: vLLM, SGLang (both spellings), mixdiag's engine, DCGM exporter.
PREFIXES = ("vllm:", "vllm_", "sglang:", "sglang_", wire.METRIC_PREFIX + "_", "DCGM_FI_")
#: Prometheus refuses a range query with more than 11,000 points per series.
MAX_POINTS = 10_000
_DROP_LABELS = ("__name__", "job")


def sniff(head: bytes, name: str) -> bool:
    """A Prometheus server is addressed by URL, never by file content."""
    return name.startswith(("http://", "https://"))


def _matchers(selector: str) -> str:
    """``{job="x", instance=~"a.*"}`` or ``job="x"`` -> the matcher list without braces."""
    sel = (selector or "").strip()
    if sel.startswith("{") and sel.endswith("}"):
        sel = sel[1:-1].strip()
    if "{" in sel or "}" in sel:
        raise UserError(f"selector {selector!r}: give label matchers only, e.g. '{{job=\"vllm\"}}'")
    return sel.rstrip(",")


def queries(selector: str = "") -> list[str]:
    """The PromQL selectors fetched: every non-bucket series, the ITL histogram buckets, ``up``."""
    extra = _matchers(selector)
    extra = ", " + extra if extra else ""
    # Metric names hold only [a-zA-Z0-9_:], so they need no regex escaping.
    names = "|".join(p + ".*" for p in PREFIXES)
    # Histograms whose buckets the interval rows read: ITL, and the dialects' TTFT / iteration tokens.
    from mixdiag.collectors.prometheus.dialect_columns import ITERATION_TOKENS, TTFT_HISTOGRAMS
    hists = tuple(ITL_HISTOGRAMS) + tuple(TTFT_HISTOGRAMS) + tuple(ITERATION_TOKENS)
    itl = "|".join(h + "_bucket" for h in hists)
    itl += "|" + "|".join(h.replace(":", "_", 1) + "_bucket" for h in hists if ":" in h)
    # `up` marks when a target was down: its counters restart from zero when it comes back, so
    # the first interval after a down point counts everything (not just what the next scrape adds).
    return [f'{{__name__=~"{names}", __name__!~".*_bucket"{extra}}}', f'{{__name__=~"{itl}"{extra}}}',
            f'{{__name__="up"{extra}}}']


def _post(url: str, path: str, params: dict, timeout_s: float) -> bytes:
    """The body of an API answer (an HTTP error's too, when it is the API's JSON error document)."""
    body = urllib.parse.urlencode(params).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=body,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        try:
            out = e.read()
            json.loads(out)
            return out
        except (ValueError, OSError):
            raise UserError(f"Prometheus at {url} answered HTTP {e.code} to {path}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise UserError(f"cannot reach Prometheus at {url}: {getattr(e, 'reason', e)}") from None


def _data(url: str, path: str, raw: bytes) -> dict:
    """``data`` of an API answer; UserError for an error document or a body that is no JSON."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise UserError(f"Prometheus at {url}: {path} did not answer JSON") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc if not isinstance(doc, dict) else doc.get("error", doc)
        raise UserError(f"Prometheus at {url}: {doc.get('errorType', 'error') if isinstance(doc, dict) else 'error'}: "
                        f"{err}")
    return doc["data"]


def _get(url: str, path: str, params: dict, timeout_s: float) -> dict:
    return _data(url, path, _post(url, path, params, timeout_s))


def _fmt_s(seconds: float) -> str:
    """Seconds for the API without losing digits (``%g`` would round 12.3456789 to 12.3457)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


def query_range(url: str, promql: str, start: float, end: float, step_s: float,
                timeout_s: float = 30.0) -> list[dict]:
    """``/api/v1/query_range`` as a list of ``{metric, values}``; long windows are fetched in chunks."""
    out: dict[tuple, dict] = {}
    span = step_s * MAX_POINTS
    t = start
    while t <= end:
        t_end = min(end, t + span)
        data = _get(url, "/api/v1/query_range", {"query": promql, "start": f"{t:.3f}", "end": f"{t_end:.3f}",
                                                 "step": _fmt_s(step_s)}, timeout_s)
        if data.get("resultType") != "matrix":
            raise UserError(f"Prometheus at {url}: expected a matrix, got {data.get('resultType')}")
        for series in data["result"]:
            key = tuple(sorted(series["metric"].items()))
            tgt = out.setdefault(key, {"metric": series["metric"], "values": []})
            seen = {v[0] for v in tgt["values"]}
            tgt["values"].extend(v for v in series.get("values", []) if v[0] not in seen)
        t = t_end + step_s
    return list(out.values())


_URL_PARAMS = ("selector", "start", "end", "step", "window", "aggregate")


def _seconds(name: str, text: str) -> float:
    """Unix seconds or RFC 3339 (``2026-11-30T05:00:00Z``) -> float seconds; durations in seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    if name in ("start", "end"):
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise UserError(f"URL parameter {name}={text!r}: expected seconds" + (" or RFC 3339" if name != "step" else ""))


def split_url(url: str) -> tuple[str, dict]:
    """``http://h:9090/?selector={job="x"}&window=600&step=5`` -> (server URL, parameters).

    Lets ``mixdiag ingest URL`` carry the window and selector in the one argument it takes.
    Parameters: ``selector``, ``start``/``end`` (unix seconds or RFC 3339), ``step``, ``window``
    (seconds). Unknown parameters are refused, so a typo is not silently ignored.
    """
    parts = urllib.parse.urlsplit(url)
    params = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(params) - set(_URL_PARAMS))
    if unknown:
        raise UserError(f"unknown URL parameter(s) {', '.join(unknown)}; use {', '.join(_URL_PARAMS)}")
    out: dict = {}
    for k, vals in params.items():
        out[k] = vals[-1] if k in ("selector", "aggregate") else _seconds(k, vals[-1])
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return base, out


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
    from mixdiag.collectors.prometheus import prom_aggregate as agg  # the fleet path

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
    from mixdiag.collectors.gpu import dcgm

    return dcgm.fill_intervals(tl, options.get("gpu_map"))  # DCGM_FI_PROF_* series -> sm_active
