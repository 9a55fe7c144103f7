"""Live mode: follow an engine's ``/metrics`` or a Prometheus server and produce fresh Timelines.

``LiveFollower.poll()`` fetches what is new and returns the Timeline of the last
``window_s`` seconds; the dashboard re-diagnoses it on every refresh, ``mixdiag watch`` in a loop.
Two kinds of URL:

* an engine (mixdiag's, vLLM, SGLang) ``/metrics`` URL (the path ends in ``/metrics``): each
  poll is one scrape; consecutive scrapes become interval rows (:mod:`.scrape_reader`);
* a Prometheus server (anything else, e.g. ``http://host:9090``): each poll reads the window
  over the HTTP API through ``collectors.load`` (:mod:`.server_reader`, DCGM series -> ``sm_active``).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from urllib.parse import urlparse

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus.prom_http import check_url, fetch_text, url_kind
from mixdiag.collectors.prometheus.scrape_reader import read_scrapes


class LiveFollower:
    """Polls one URL; thread-safe (the dashboard's callbacks and ``watch`` may call it concurrently)."""

    def __init__(self, url: str | None = None, *, window_s: float = 900.0, refresh_s: float = 5.0,
                 instance: str | None = None):
        self._lock = threading.Lock()
        self.window_s = float(window_s)
        self.refresh_s = float(refresh_s)
        self.instance = instance
        self.url: str | None = None
        self.kind: str | None = None
        self.dataset_id: str | None = None
        self.polls = 0
        self.last_error: str | None = None
        self._scrapes: deque[tuple[float, str]] = deque()
        if url:
            self.start(url)

    @property
    def active(self) -> bool:
        return self.url is not None

    def start(self, url: str, refresh_s: float | None = None, kind: str | None = None) -> None:
        """Follow ``url`` from now on (forgetting scrapes of a previous URL); ``kind`` overrides :func:`url_kind`."""
        url = check_url(url, "live URL")
        if kind not in (None, "engine", "prometheus"):
            raise UserError(f"unknown live source kind {kind!r}")
        with self._lock:
            self.url, self.kind = url, kind or url_kind(url, probe=False)
            self.dataset_id = None
            self._scrapes.clear()
            self.polls = 0
            if refresh_s is not None:
                self.refresh_s = float(refresh_s)

    def stop(self) -> None:
        with self._lock:
            self.url = self.kind = None
            self._scrapes.clear()

    def label(self) -> str:
        return f"live: {self.url}" if self.url else "live: off"

    def poll(self, now: float | None = None) -> Timeline | None:
        """Fetch what is new; the Timeline of the window, or None while there is too little data.

        An engine needs two scrapes before the first interval row exists.
        """
        with self._lock:
            url, kind = self.url, self.kind
        if url is None:
            raise UserError("live mode is off: give a URL first")
        now = time.time() if now is None else float(now)
        try:
            tl = self._poll_engine(url, now) if kind == "engine" else self._poll_prometheus(url, now)
        except UserError as e:
            self.last_error = str(e)
            raise
        self.polls += 1
        self.last_error = None
        return tl

    def _poll_engine(self, url: str, now: float) -> Timeline | None:
        text = fetch_text(url)
        with self._lock:
            self._scrapes.append((now, text))
            while self._scrapes and self._scrapes[0][0] < now - self.window_s:
                self._scrapes.popleft()
            pairs = list(self._scrapes)
        if len(pairs) < 2:
            return None
        name = self.instance or urlparse(url).netloc
        return read_scrapes(pairs, instance=name)

    def _poll_prometheus(self, url: str, now: float) -> Timeline | None:
        from mixdiag.collectors import load  # the registry's reader, then GPU filling, as for any input

        return load(url, format="prom-http", start=now - self.window_s, end=now, step_s=max(self.refresh_s, 1.0))
