"""An engine's live ``/metrics`` URL (format ``prom-endpoint``): sample it for a while, or
summarise one dump since process start.

``mixdiag analyze http://host:8000/metrics`` must not be read as a Prometheus server (that answers
HTTP 404/501 to ``/api/v1/query_range``): :func:`.prom_http.url_kind` tells the two apart.

:func:`read` scrapes the endpoint every ``interval_s`` for ``duration_s`` (a progress bar on
stderr; Ctrl-C stops early and keeps what was collected, flagged partial) and builds the Timeline
exactly as a directory of timed scrapes would (:func:`.scrape_reader.read_scrapes`); one scrape
becomes a since-start row per target (:func:`.scrape_reader.since_start`). A dcgm-exporter URL's
DCGM series become ``sm_active`` in ``collectors.load``.
"""
from __future__ import annotations

import math
import sys
import time
import urllib.parse
from typing import Callable

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus import prom_text
from mixdiag.collectors.prometheus.prom_http import fetch_text, url_kind
from mixdiag.collectors.prometheus.scrape_reader import read_scrapes, since_start

FORMAT = "prom-endpoint"
DEFAULT_DURATION_S = 60.0
DEFAULT_INTERVAL_S = 1.0
#: Sampling longer than a day is a mistake (use Prometheus for that); bound it.
MAX_DURATION_S = 86_400.0


def sniff(head: bytes, name: str) -> bool:
    """A URL that is an engine's metrics endpoint, not a Prometheus server (probes the network)."""
    if not name.startswith(("http://", "https://")):
        return False
    try:
        return url_kind(name) == "engine"
    except UserError:
        return True  # neither kind: claim it, so read() says why in one line (not "HTTP 501" from the API)


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
        tl = read_scrapes(pairs, instance=name)
    meta = dict(tl.meta)
    meta["notes"] = list(meta.get("notes", [])) + notes + [
        f"sampled {source}: {len(pairs)} scrape(s) every {interval_s:g} s"
        + (" (stopped early by Ctrl-C: partial)" if interrupted else "")]
    if interrupted:
        meta["partial"] = True
    meta["endpoint"] = {"url": source, "scrapes": len(pairs), "interval_s": interval_s,
                        "duration_s": duration_s, "interrupted": interrupted}
    return Timeline(tl.steps, tl.tokens, tl.series, meta)
