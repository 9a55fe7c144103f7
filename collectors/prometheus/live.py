"""Live mode: follow an engine's ``/metrics`` or a Prometheus server and produce fresh Timelines.

``LiveFollower.poll()`` fetches what is new and returns the Timeline of the last
``window_s`` seconds; the dashboard re-diagnoses it on every refresh, ``mixdiag watch`` in a loop.
Two kinds of URL:

* an engine (mixdiag's, vLLM, SGLang) ``/metrics`` URL (the path ends in ``/metrics``): each
  poll is one scrape; consecutive scrapes become interval rows (``collectors.prom_text``);
* a Prometheus server (anything else, e.g. ``http://host:9090``): each poll reads the window
  over the HTTP API (``collectors.prom_http``).
"""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import deque
from urllib.parse import urlparse

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

#: A scrape larger than this is refused (an engine's /metrics is a few hundred KiB at most).
MAX_SCRAPE_BYTES = 16 * 2**20
HTTP_TIMEOUT_S = 10.0


def check_url(url: str, what: str = "URL") -> str:
    """``url`` if it is an http(s) URL with a host; UserError otherwise (no file://, no javascript:)."""
    u = urlparse(str(url).strip())
    if u.scheme not in ("http", "https") or not u.netloc:
        raise UserError(f"{what} must be an http:// or https:// URL, got {url!r}")
    return str(url).strip().rstrip("/")


def url_kind(url: str) -> str:
    """``"engine"`` for a ``/metrics`` URL, ``"prometheus"`` for a Prometheus server."""
    return "engine" if urlparse(url).path.rstrip("/").endswith("/metrics") else "prometheus"


def fetch_text(url: str, timeout_s: float = HTTP_TIMEOUT_S, max_bytes: int = MAX_SCRAPE_BYTES) -> str:
    """GET ``url`` as text; UserError (one line) on a network error, an HTTP error or an oversize body."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "mixdiag"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 (http/https checked by check_url)
            body = r.read(max_bytes + 1)
    except urllib.error.HTTPError as e:
        raise UserError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"{url}: cannot connect ({reason})") from None
    if len(body) > max_bytes:
        raise UserError(f"{url}: response larger than {max_bytes // 2**20} MiB")
    return body.decode("utf-8", errors="replace")


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
            self.url, self.kind = url, kind or url_kind(url)
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
        from mixdiag.collectors.prometheus import prom_text

        text = fetch_text(url)
        with self._lock:
            self._scrapes.append((now, text))
            while self._scrapes and self._scrapes[0][0] < now - self.window_s:
                self._scrapes.popleft()
            pairs = list(self._scrapes)
        if len(pairs) < 2:
            return None
        name = self.instance or urlparse(url).netloc
        return prom_text.read_scrapes(pairs, instance=name)

    def _poll_prometheus(self, url: str, now: float) -> Timeline | None:
        from mixdiag.collectors.prometheus import prom_http

        return prom_http.read(url, start=now - self.window_s, end=now, step_s=max(self.refresh_s, 1.0))
