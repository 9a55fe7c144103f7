"""Timed text-exposition scrapes of an engine's registry, written to the run directory.

Tier-(c) analysis (Prometheus-only users) needs scrapes, not a server: :class:`ScrapeWriter`
writes ``DIR/scrapes/<unix_time_s>.prom`` every ``interval_s`` from a daemon thread and, on
:meth:`ScrapeWriter.close`, the final state to ``DIR/metrics.prom``. Files are created
exclusively: an existing file is never overwritten.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from mixdiag.errors import UserError


def write_exposition(registry: CollectorRegistry, path: str | Path) -> Path:
    """Write one scrape of ``registry`` to ``path`` (refuses to replace an existing file)."""
    p = Path(path)
    body = generate_latest(registry)
    with open(p, "xb") as f:
        f.write(body)
    return p


class ScrapeWriter:
    """Scrape ``registry`` into ``out_dir/scrapes/`` every ``interval_s`` seconds (None: only the final one)."""

    def __init__(self, registry: CollectorRegistry, out_dir: str | Path, interval_s: float | None = None,
                 clock=time.time, *, subdir: str = "scrapes", final_name: str = "metrics.prom"):
        if interval_s is not None and not interval_s > 0:
            raise UserError(f"--scrape-interval must be > 0 seconds, got {interval_s}")
        self.registry = registry
        self.out_dir = Path(out_dir)
        self.interval_s = interval_s
        self.scrape_dir = self.out_dir / subdir
        self.final_name = final_name
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.written: list[Path] = []
        self.final: Path | None = None
        if interval_s is not None:
            self.scrape_dir.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._loop, name="mixdiag-scrapes", daemon=True)
            self._thread.start()

    def scrape_now(self) -> Path:
        """Write one timed scrape immediately; the file name is the scrape's unix time (ms precision)."""
        t = self._clock()
        name = f"{t:.3f}.prom"
        p = self.scrape_dir / name
        while p.exists():  # two scrapes in one millisecond: keep both, never overwrite
            t += 0.001
            p = self.scrape_dir / f"{t:.3f}.prom"
        self.written.append(write_exposition(self.registry, p))
        return p

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scrape_now()

    def close(self) -> Path:
        """Stop the timer, take a last timed scrape (when timed) and write ``metrics.prom`` (once)."""
        if self.final is not None:
            return self.final
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
            self.scrape_now()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.final = write_exposition(self.registry, self.out_dir / self.final_name)
        self.written.append(self.final)
        return self.final
