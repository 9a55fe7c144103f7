"""An engine's live ``/metrics`` URL: sample it for a while, or summarise one dump since process start.

``mixdiag analyze http://host:8000/metrics`` must not be read as a Prometheus server (that answers
HTTP 404/501 to ``/api/v1/query_range``). :func:`url_kind` tells the two apart: a URL whose path
ends in ``/metrics`` is an engine; otherwise ``<url>/api/v1/status/buildinfo`` answering Prometheus
JSON means a server; otherwise a URL that answers text exposition is an engine.

:func:`read` scrapes the endpoint every ``interval_s`` for ``duration_s`` (a progress bar on
stderr; Ctrl-C stops early and keeps what was collected, flagged partial) and builds the Timeline
exactly as a directory of timed scrapes would (:func:`.prom_text.read_scrapes`).

One scrape (``duration_s=0``, or a single dump file) has no interval between two scrapes, but its
counters and histograms hold everything since the process started. :func:`since_start` turns it
into one interval row per target covering process start -> scrape (``process_start_time_seconds``
when exposed), so ITL quantiles, token totals and preemptions of the whole run reach the report.
"""
from __future__ import annotations

import json
import math
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus.prom_intervals import SPLIT_LABELS, TimedScrape, build_timeline

FORMAT = "prom-endpoint"
DEFAULT_DURATION_S = 60.0
DEFAULT_INTERVAL_S = 1.0
#: Sampling longer than a day is a mistake (use Prometheus for that); bound it.
MAX_DURATION_S = 86_400.0
PROBE_TIMEOUT_S = 5.0
#: The gauge prometheus_client's process collector exposes (vLLM and SGLang serve it).
START_METRIC = "process_start_time_seconds"
_START_SAMPLE = "mixdiag_since_start_marker"  # internal placeholder, dropped from the output
_kinds: dict[str, str] = {}


def _strip_query(url: str) -> str:
    p = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((p.scheme, p.netloc, p.path, "", ""))


def _is_prometheus(url: str, timeout_s: float) -> bool:
    """``GET <url>/api/v1/status/buildinfo`` answers ``{"status": "success", ...}``."""
    probe = _strip_query(url).rstrip("/") + "/api/v1/status/buildinfo"
    try:
        with urllib.request.urlopen(probe, timeout=timeout_s) as r:  # noqa: S310 (http/https only)
            doc = json.loads(r.read(1 << 20))
    except (urllib.error.URLError, OSError, ValueError, TimeoutError):
        return False
    return isinstance(doc, dict) and doc.get("status") == "success"


def _looks_like_exposition(text: str) -> bool:
    from mixdiag.collectors.prometheus import prom_text

    return prom_text.sniff(text[:65536].encode("utf-8", "replace"), "")


def url_kind(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """``"engine"`` (text exposition) or ``"prometheus"`` (HTTP API); UserError when neither answers."""
    if url in _kinds:
        return _kinds[url]
    if urllib.parse.urlsplit(url).path.rstrip("/").endswith("/metrics"):
        kind = "engine"
    elif _is_prometheus(url, timeout_s):
        kind = "prometheus"
    else:
        from mixdiag.collectors.prometheus.live import fetch_text

        try:
            why = "" if _looks_like_exposition(fetch_text(url, timeout_s=timeout_s)) else "no text exposition"
        except UserError as e:
            why = str(e).split(": ", 1)[-1]
        if why:
            raise UserError(f"{url}: neither a Prometheus server (no /api/v1/status/buildinfo) "
                            f"nor a /metrics endpoint ({why})")
        kind = "engine"
    _kinds[url] = kind
    return kind


def sniff(head: bytes, name: str) -> bool:
    """A URL that is an engine's metrics endpoint, not a Prometheus server (probes the network)."""
    if not name.startswith(("http://", "https://")):
        return False
    try:
        return url_kind(name) == "engine"
    except UserError:
        return True  # neither kind: claim it, so read() says why in one line (not "HTTP 501" from the API)


def _marker_scrape(scrape) -> object:
    """An empty scrape holding one placeholder sample per target/DP-rank label set of ``scrape``
    (so every target of the dump gets a predecessor in which all its counters were zero)."""
    from mixdiag.collectors.prometheus.prom_text import Scrape

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


def since_start(scrape, t_s: float, base: str, *, clock: str = "unix", fmt: str = FORMAT,
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
    meta["notes"] = [n for n in meta.get("notes", []) if not n.startswith("one scrape: no intervals")]
    meta["since_start"] = {"t_start_s": t0, "t_end_s": t_s, "start_known": known}
    meta["notes"] = list(meta.get("notes", [])) + [
        "one scrape: a since-start row per target (counters and histograms hold everything since the "
        "process started)" + ("" if known else f"; process start unknown ({START_METRIC} absent or not "
                                                  "on the scrape's clock): zero-length row")]
    return Timeline(steps, None, series, meta)


def summary_lines(tl: Timeline) -> list[str]:
    """Human lines for a since-start Timeline: per instance ITL P50/P99, token totals, preemptions."""
    info = tl.meta.get("since_start")
    if not info or tl.steps is None or not len(tl.steps):
        return []
    span = info["t_end_s"] - info["t_start_s"]
    head = f"since process start ({span:.0f} s)" if info.get("start_known") else "since process start"
    out = [f"One scrape: {head}, from the counters and histograms:"]

    def num(row, col, fmt):
        v = row.get(col)
        return fmt.format(v) if v is not None and isinstance(v, (int, float)) and math.isfinite(v) else "-"

    for _, r in tl.steps.iterrows():
        row = r.to_dict()
        parts = [f"ITL P50 {num(row, 'itl_p50_s', '{:.4f}')} s, P99 {num(row, 'itl_p99_s', '{:.4f}')} s "
                 f"({num(row, 'itl_count', '{:.0f}')} outputs)",
                 f"prompt tokens {num(row, 'prefill_tokens', '{:.0f}')}",
                 f"generation tokens {num(row, 'output_tokens', '{:.0f}')}",
                 f"preemptions {num(row, 'preempted_reqs', '{:.0f}')}"]
        steps = {k: row.get(f"{k}_steps") for k in ("prefill", "decode", "mixed")}
        total = sum(v for v in steps.values() if isinstance(v, float) and math.isfinite(v))
        if total > 0 and isinstance(steps["mixed"], float) and math.isfinite(steps["mixed"]):
            parts.append(f"mixed steps {steps['mixed'] / total:.1%}")
        elif isinstance(row.get("large_step_share"), float) and math.isfinite(row["large_step_share"]):
            parts.append(f"large-step share {row['large_step_share']:.1%}")
        out.append(f"  {row['instance']}: " + "; ".join(parts))
    return out


SUMMARY_COLUMNS = ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_mean_s", "itl_count", "prefill_tokens",
                   "output_tokens", "preempted_reqs", "running_reqs", "waiting_reqs", "mixed_steps",
                   "large_step_share")


def summary_rows(tl: Timeline) -> dict[str, dict]:
    """``{instance: {column: value}}`` of a since-start Timeline (JSON-ready; NaN -> None)."""
    if not tl.meta.get("since_start") or tl.steps is None:
        return {}
    out = {}
    for _, r in tl.steps.iterrows():
        vals = {c: r.get(c) for c in SUMMARY_COLUMNS if c in tl.steps}
        out[str(r["instance"])] = {c: (float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None)
                                   for c, v in vals.items()}
    out_meta = tl.meta["since_start"]
    return {"t_start_s": out_meta["t_start_s"], "t_end_s": out_meta["t_end_s"],
            "start_known": out_meta["start_known"], "instances": out}


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="scrape", file=sys.stderr, leave=False, desc="sampling /metrics")


def sample(url: str, duration_s: float, interval_s: float, *, progress: bool = True,
           fetch: Callable[[str], str] | None = None, clock: Callable[[], float] = time.time,
           sleep: Callable[[float], None] = time.sleep) -> tuple[list[tuple[float, str]], bool]:
    """``(t_s, text)`` scrapes of ``url`` every ``interval_s`` for ``duration_s``; and whether it
    was cut short (Ctrl-C). A failed scrape after the first is skipped (counted); the first must work."""
    from mixdiag.collectors.prometheus.live import fetch_text

    fetch = fetch or fetch_text
    n = int(math.floor(duration_s / interval_s + 1e-9)) + 1
    pairs: list[tuple[float, str]] = []
    bar = _progress(n, progress)
    t_first = time.monotonic()
    failed = 0
    interrupted = False
    try:
        for k in range(n):
            wait = t_first + k * interval_s - time.monotonic()
            if wait > 0:
                sleep(wait)
            try:
                pairs.append((clock(), fetch(url)))
            except UserError:
                if not pairs:
                    raise
                failed += 1
            if bar is not None:
                bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    if failed:
        pairs_note = f"{failed} scrape(s) failed and were skipped"
        pairs.append((math.nan, pairs_note))  # carried to read(), which notes and drops it
    return pairs, interrupted


def read(source: str, *, instance: str | None = None, duration_s: float | None = None,
         interval_s: float | None = None, progress: bool | None = None, **options) -> Timeline:
    """Sample an engine's ``/metrics`` URL and build interval rows (or a since-start row for one scrape)."""
    from mixdiag.collectors.prometheus import prom_text

    if not isinstance(source, str) or not source.startswith(("http://", "https://")):
        raise UserError(f"{FORMAT} needs an http(s) URL of an engine's /metrics, got {source!r}")
    duration_s = DEFAULT_DURATION_S if duration_s is None else float(duration_s)
    interval_s = DEFAULT_INTERVAL_S if interval_s is None else float(interval_s)
    if not (0 <= duration_s <= MAX_DURATION_S):
        raise UserError(f"--duration must be 0..{MAX_DURATION_S:.0f} s, got {duration_s:g}")
    if not (0.05 <= interval_s <= 3600):
        raise UserError(f"--interval must be 0.05..3600 s, got {interval_s:g}")
    url_kind(source)  # one-line UserError for a URL that is neither kind (cached after detection)
    if progress is None:
        progress = sys.stderr.isatty()
    pairs, interrupted = sample(source, duration_s, interval_s, progress=progress)
    notes = [text for t, text in pairs if not math.isfinite(t)]
    pairs = [(t, text) for t, text in pairs if math.isfinite(t)]
    name = instance or urllib.parse.urlsplit(source).netloc
    if not pairs:
        raise UserError(f"{source}: interrupted before the first scrape")
    if len(pairs) == 1:
        scrape = prom_text.parse(pairs[0][1])
        tl = since_start(scrape, pairs[0][0], name)
    else:
        tl = prom_text.read_scrapes(pairs, instance=name)
    from mixdiag.collectors.gpu import dcgm

    tl = dcgm.fill_intervals(tl, options.get("gpu_map"))  # a dcgm-exporter URL: sm_active per interval
    meta = dict(tl.meta)
    meta["notes"] = list(meta.get("notes", [])) + notes + [
        f"sampled {source}: {len(pairs)} scrape(s) every {interval_s:g} s"
        + (" (stopped early by Ctrl-C: partial)" if interrupted else "")]
    if interrupted:
        meta["partial"] = True
    meta["endpoint"] = {"url": source, "scrapes": len(pairs), "interval_s": interval_s,
                        "duration_s": duration_s, "interrupted": interrupted}
    return Timeline(tl.steps, tl.tokens, tl.series, meta)
