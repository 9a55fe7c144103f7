"""Timed ``/metrics`` scrapes into ``DIR/scrapes/<unix_time_s>.prom`` (docs/contracts.md section 1).

A scrape is named by the unix time its request was sent, as Prometheus stamps its samples with
the scrape's start. Ticks are on a fixed grid from the first scrape; a tick missed because the
previous scrape was slow is skipped rather than crowded in, so intervals stay near the period.
"""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


class Scraper(threading.Thread):
    """Scrape ``url`` every ``interval_s`` until :meth:`finish`; counts failures instead of raising."""

    def __init__(self, url: str, out_dir: Path, interval_s: float):
        super().__init__(name="mixdiag-scraper", daemon=True)
        self.url, self.out_dir, self.interval_s = url.rstrip("/") + "/metrics", Path(out_dir), float(interval_s)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._halt = threading.Event()
        self.written = 0
        self.failed = 0
        self.last_error: str | None = None

    def scrape_once(self) -> Path | None:
        """One scrape now; the file written, or None when the server did not answer."""
        t = time.time()
        try:
            with urllib.request.urlopen(self.url, timeout=max(2.0, 3 * self.interval_s)) as r:
                body = r.read()
        except (urllib.error.URLError, OSError) as e:
            self.failed += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        path = self.out_dir / f"{t:.3f}.prom"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(body)
        tmp.rename(path)   # a reader of a live directory never sees half a scrape
        self.written += 1
        return path

    def run(self) -> None:
        t0 = time.monotonic()
        k = 0
        while not self._halt.is_set():
            self.scrape_once()
            k = max(k + 1, int((time.monotonic() - t0) / self.interval_s) + 1)
            self._halt.wait(max(0.0, t0 + k * self.interval_s - time.monotonic()))

    def finish(self) -> None:
        """Stop after the scrape in flight, then take one last scrape (the run's final counters)."""
        self._halt.set()
        self.join(timeout=30)
        self.scrape_once()
