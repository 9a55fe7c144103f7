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


def _get(url: str, path: str, params: dict, timeout_s: float) -> dict:
    body = urllib.parse.urlencode(params).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=body,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            doc = json.loads(e.read())
        except (ValueError, OSError):
            raise UserError(f"Prometheus at {url} answered HTTP {e.code} to {path}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise UserError(f"cannot reach Prometheus at {url}: {getattr(e, 'reason', e)}") from None
    except ValueError:
        raise UserError(f"Prometheus at {url}: {path} did not answer JSON") from None
    if doc.get("status") != "success":
        raise UserError(f"Prometheus at {url}: {doc.get('errorType', 'error')}: {doc.get('error', doc)}")
    return doc["data"]


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
    if aggregate == "yes" or (aggregate == "auto" and instance is None
                              and count_vllm_targets(source, selector, end, timeout_s) >= AGGREGATE_FROM_TARGETS):
        return read_aggregated(source, start, end, step_s, selector, max(timeout_s, 60.0), stats)
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


# --- Fleet path: let Prometheus aggregate (one query per signal, not one series per sample) ---------
#: Per-target keys of the aggregation (vLLM DP engine as its own instance, as in the raw path).
_BY = "instance, engine"
#: Column -> PromQL template over one step (``{r}``) and the selector (``{s}``); vLLM names
#: (formats.md §1.1), the ITL histogram falling back to its pre-0.11 name with ``or``. The range is
#: the step plus 1 ms: Prometheus 2 selects ``[t-r, t]`` and 3 selects ``(t-r, t]``, so both see the
#: sample one step back and ``increase`` extrapolates by at most 1 ms. (An exact ``x - x offset``
#: with reset handling costs Prometheus twice the evaluation time on a 500-target fleet.)
def _inc(name: str) -> str:
    return f"increase({name}{{s}}[{{r}}])"


def _inc_either(base: str, suffix: str) -> str:
    return f"({_inc('vllm:' + base + suffix)} or {_inc('vllm:time_per_output_token_seconds' + suffix)})"


AGG_QUERIES: dict[str, str] = {
    "prefill_tokens": f"sum by ({{by}}) ({_inc('vllm:prompt_tokens_total')})",
    "output_tokens": f"sum by ({{by}}) ({_inc('vllm:generation_tokens_total')})",
    "preempted_reqs": f"sum by ({{by}}) ({_inc('vllm:num_preemptions_total')})",
    "running_reqs": "sum by ({by}) (vllm:num_requests_running{s})",
    "waiting_reqs": "sum by ({by}) (vllm:num_requests_waiting{s})",
    "itl_count": f"sum by ({{by}}) {_inc_either('inter_token_latency_seconds', '_count')}",
    "itl_sum": f"sum by ({{by}}) {_inc_either('inter_token_latency_seconds', '_sum')}",
}
# P90 is left out: each quantile re-evaluates the bucket increases, and the diagnosis reads P50/P99.
for _col, _q in (("itl_p50_s", 0.5), ("itl_p99_s", 0.99)):
    AGG_QUERIES[_col] = (f"histogram_quantile({_q}, sum by ({{by}}, le) "
                         f"{_inc_either('inter_token_latency_seconds', '_bucket')})")
#: Histograms whose per-target bucket increases are fetched whole (one query each) because their
#: reading depends on a per-row value (steps larger than the running batch, dialects.py).
AGG_BUCKETS = {"vllm:iteration_tokens_total_bucket":
               f"sum by ({{by}}, le) ({_inc('vllm:iteration_tokens_total_bucket')})"}
#: ``auto`` aggregates in Prometheus from this many vLLM targets on (below it, raw series are cheap).
AGGREGATE_FROM_TARGETS = 20


def _agg_promql(template: str, selector: str, step_s: float) -> str:
    m = _matchers(selector)
    return template.format(by=_BY, s="{" + m + "}" if m else "", r=f"{int(round(step_s * 1000)) + 1}ms")


def count_vllm_targets(url: str, selector: str, at: float, timeout_s: float = 30.0) -> int:
    """How many targets expose ``vllm:generation_tokens_total`` at ``at`` (one instant query)."""
    m = _matchers(selector)
    q = f"count(count by (instance) (last_over_time(vllm:generation_tokens_total{{{m}}}[1h])))"
    data = _get(url, "/api/v1/query", {"query": q, "time": f"{at:.3f}"}, timeout_s)
    res = data.get("result") or []
    return int(float(res[0]["value"][1])) if res else 0


def read_aggregated(url: str, start: float, end: float, step_s: float, selector: str = "",
                    timeout_s: float = 60.0, stats: LineStats | None = None) -> Timeline:
    """Interval rows computed by Prometheus: per target and step, token increases, gauges and ITL
    quantiles (``histogram_quantile`` of the bucket increases), one ``query_range`` per column.

    The row ending at ``t`` covers ``(t - step, t]``; ``increase`` extrapolates to the window edges,
    so token counts are not integers (as in any Grafana panel built on them).
    """
    import pandas as pd

    cols: dict[tuple[str, float], dict] = {}
    for col, tmpl in AGG_QUERIES.items():
        for series in query_range(url, _agg_promql(tmpl, selector, step_s), start + step_s, end, step_s, timeout_s):
            m = series["metric"]
            inst = m.get("instance", "prometheus") + (f"/engine{m['engine']}" if "engine" in m else "")
            for t, v in series["values"]:
                try:
                    cols.setdefault((inst, float(t)), {})[col] = float(v)
                except (TypeError, ValueError):
                    continue
            if stats is not None:
                stats.lines_total += 1
                stats.parsed()
    buckets: dict[tuple[str, float], dict] = {}
    for name, tmpl in AGG_BUCKETS.items():
        for series in query_range(url, _agg_promql(tmpl, selector, step_s), start + step_s, end, step_s, timeout_s):
            m = series["metric"]
            inst = m.get("instance", "prometheus") + (f"/engine{m['engine']}" if "engine" in m else "")
            key = (("le", m.get("le", "")),)
            for t, v in series["values"]:
                try:
                    buckets.setdefault((inst, float(t)), {}).setdefault(name, {})[key] = float(v)
                except (TypeError, ValueError):
                    continue
    multi_engine = len({i.split("/engine")[1] for i, _ in cols if "/engine" in i}) > 1
    from mixdiag.collectors.prometheus.dialect_columns import dialect_columns, quality
    used_by: dict[str, dict[str, str]] = {}
    rows = []
    for (inst, t), vals in sorted(cols.items()):
        name = inst if multi_engine else inst.split("/engine")[0]
        row = {"instance": name, "t_start_s": t - step_s, "t_end_s": t, "granularity": "interval", **vals}
        s, c = row.pop("itl_sum", math.nan), row.get("itl_count", math.nan)
        row["itl_mean_s"] = s / c if c and c > 0 and math.isfinite(s) else math.nan
        for q in ("itl_p50_s", "itl_p90_s", "itl_p99_s"):
            if q in row and not math.isfinite(row[q]):
                row[q] = math.nan  # no outputs in the step: histogram_quantile answers NaN
        row["kind"] = "idle" if row.get("prefill_tokens") == 0 and row.get("output_tokens") == 0 else "unknown"
        if (inst, t) in buckets:
            # the dialect rules read increases: an empty "previous" view makes each value its own increase
            row.update(dialect_columns({}, buckets[(inst, t)], row, used_by.setdefault(name, {})))
        rows.append(row)
    steps = pd.DataFrame(rows) if rows else None
    if steps is not None:
        steps["step"] = steps.groupby("instance").cumcount()
    used = {c: "promql" for c in AGG_QUERIES if c != "itl_sum"}
    insts = sorted(set(steps["instance"])) if steps is not None else []
    signals = {i: {**{c: "measured" for c in used}, **{c: quality(v) for c, v in used_by.get(i, {}).items()}}
               for i in insts}
    meta = {"source": FORMAT, "clock": "unix", "sources": [stats.to_meta()] if stats else [], "signals": signals,
            "metric_sources": {i: {**used, **used_by.get(i, {})} for i in insts},
            "notes": [f"aggregated in Prometheus: {len(AGG_QUERIES) + len(AGG_BUCKETS)} range queries for "
                      f"{len(insts)} targets"],
            "partial": False, "targets": insts}
    return Timeline(steps=steps, series=None, meta=meta)
