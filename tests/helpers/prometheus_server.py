"""A real Prometheus server for integration tests (Debian ``prometheus`` binary).

Usage in a test module (the root ``tests/conftest.py`` re-exports the fixtures)::

    @pytest.mark.prometheus
    def test_scrape(prometheus_server, metrics_endpoint):
        target = metrics_endpoint(registry)              # serve a prometheus_client registry
        prom = prometheus_server([target], scrape_interval_s=0.5)
        prom.wait_for_samples("up", min_samples=3)       # a few scrapes landed
        prom.query('sum(my_counter_total)')              # instant query -> list of result dicts
        prom.url                                        # http://127.0.0.1:PORT for the HTTP API

The server listens on 127.0.0.1 on a free port, keeps its TSDB in a temporary directory, scrapes
the given ``host:port`` targets under one job, and is stopped (and waited for) at teardown. Without
the binary the fixtures skip with the reason (a missing system package, not missing work).
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

import pytest

PROMETHEUS_BINARY = "prometheus"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _duration(seconds: float) -> str:
    """Prometheus duration string; milliseconds keep sub-second intervals exact."""
    return f"{max(1, int(round(seconds * 1000)))}ms"


class PrometheusServer:
    """One ``prometheus`` process: config, TSDB and log under ``workdir``; start/stop; queries."""

    def __init__(self, targets: Sequence[str], workdir: Path, *, scrape_interval_s: float = 0.5,
                 job: str = "mixdiag", binary: str | None = None, extra_labels: dict | None = None):
        self.targets = list(targets)
        self.workdir = Path(workdir)
        self.scrape_interval_s = float(scrape_interval_s)
        self.job = job
        self.binary = binary or shutil.which(PROMETHEUS_BINARY)
        if self.binary is None:
            raise FileNotFoundError("prometheus binary not found on PATH (Debian package 'prometheus')")
        self.extra_labels = dict(extra_labels or {})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "prometheus.log"

    def _config(self) -> str:
        interval = _duration(self.scrape_interval_s)
        static = {"targets": self.targets}
        if self.extra_labels:
            static["labels"] = self.extra_labels
        # JSON is valid YAML, so no YAML library is needed.
        cfg = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
               "scrape_configs": [{"job_name": self.job, "scrape_interval": interval,
                                   "scrape_timeout": interval, "static_configs": [static]}]}
        return json.dumps(cfg, indent=2)

    def start(self, timeout_s: float = 60.0, attempts: int = 3) -> "PrometheusServer":
        """Write the config, start the process, wait until ``/-/ready`` answers 200.

        The free port is only free when it was picked; if another process took it meanwhile,
        Prometheus exits with "address already in use" and a new port is tried.
        """
        for attempt in range(attempts):
            try:
                return self._start_once(timeout_s)
            except RuntimeError as e:
                if "address already in use" not in str(e) or attempt == attempts - 1:
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> "PrometheusServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(self._config())
        tsdb = self.workdir / "tsdb"
        tsdb.mkdir(exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus not ready after {timeout_s:.0f}s: {self.log_tail()}")

    def stop(self) -> None:
        """Terminate the process and wait for it (kill after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> "PrometheusServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- HTTP API helpers -------------------------------------------------------------------
    def api(self, path: str, **params) -> dict:
        """GET ``/api/v1/<path>`` and return ``data`` (raises on a non-success answer)."""
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{q}", timeout=10) as r:
            doc = json.loads(r.read())
        if doc.get("status") != "success":
            raise RuntimeError(f"prometheus API {path}: {doc}")
        return doc["data"]

    def query(self, promql: str, t: float | None = None) -> list[dict]:
        """Instant query; the ``result`` list."""
        params = {"query": promql}
        if t is not None:
            params["time"] = f"{t:.3f}"
        return self.api("query", **params)["result"]

    def wait_until(self, promql: str, predicate: Callable[[list[dict]], bool] = bool,
                   timeout_s: float = 30.0) -> list[dict]:
        """Poll an instant query until ``predicate(result)`` holds; returns that result."""
        deadline = time.monotonic() + timeout_s
        last: list[dict] = []
        while time.monotonic() < deadline:
            last = self.query(promql)
            if predicate(last):
                return last
            time.sleep(min(0.25, self.scrape_interval_s / 2))
        raise TimeoutError(f"prometheus: {promql!r} did not satisfy the condition in {timeout_s:.0f}s; "
                           f"last result {last}; targets {self.api('targets').get('activeTargets')}")

    def wait_for_samples(self, selector: str = "up", min_samples: int = 2, timeout_s: float = 30.0) -> None:
        """Wait until every target has ``min_samples`` successful scrapes of ``selector``."""
        window = _duration(self.scrape_interval_s * (min_samples + 20))
        self.wait_until(f"count_over_time({selector}[{window}])",
                        lambda r: len(r) >= len(self.targets) and
                        all(float(x["value"][1]) >= min_samples for x in r), timeout_s)


def serve_registry(registry) -> tuple[str, Callable[[], None]]:
    """Serve a ``prometheus_client`` registry on 127.0.0.1:<free port>; returns (target, stop)."""
    from prometheus_client import start_http_server

    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return f"127.0.0.1:{port}", stop


@pytest.fixture
def prometheus_server(tmp_path_factory):
    """Factory fixture: ``prometheus_server(targets, **kw)`` -> a started :class:`PrometheusServer`."""
    if shutil.which(PROMETHEUS_BINARY) is None:
        pytest.fail("Debian package 'prometheus' not installed: run `make test` (scripts/setup_system.sh "
                    "installs it) or deselect with -m 'not prometheus'")
    started: list[PrometheusServer] = []

    def make(targets: Sequence[str], **kw) -> PrometheusServer:
        srv = PrometheusServer(targets, tmp_path_factory.mktemp("prometheus"), **kw)
        started.append(srv)
        return srv.start()

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def metrics_endpoint():
    """Factory fixture: ``metrics_endpoint(registry)`` -> ``"127.0.0.1:PORT"`` serving /metrics."""
    stops: list[Callable[[], None]] = []

    def make(registry) -> str:
        target, stop = serve_registry(registry)
        stops.append(stop)
        return target

    yield make
    for stop in stops:
        stop()
