"""MetricsServer serves a registry on 127.0.0.1 and releases the port; ScrapeWriter writes timed scrapes."""
import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from mixdiag.engine.telemetry.metrics import EngineMetrics
from mixdiag.engine.telemetry.metrics_server import MetricsServer
from mixdiag.engine.core.records import StepRecord
from mixdiag.engine.telemetry.scrape_writer import ScrapeWriter, write_exposition
from mixdiag.errors import UserError


def steps_total(text, kind):
    for fam in text_string_to_metric_families(text):
        if fam.name == "mixdiag_engine_steps":
            for s in fam.samples:
                if s.name == "mixdiag_engine_steps_total" and s.labels["kind"] == kind:
                    return s.value
    return None


def test_serves_metrics_and_stops():
    m = EngineMetrics(CollectorRegistry())
    m(StepRecord(step=0, t_start_s=1.0, t_end_s=1.01, kind="decode", decode_reqs=1, decode_rows=1))
    srv = MetricsServer(m.registry, 0)
    assert srv.port > 0 and srv.url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(srv.url, timeout=5) as r:
        assert steps_total(r.read().decode(), "decode") == 1
    srv.stop()
    srv.stop()  # idempotent
    again = MetricsServer(m.registry, srv.port)  # the port was released
    again.stop()


def test_port_in_use_is_a_user_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UserError, match="cannot serve"):
            MetricsServer(CollectorRegistry(), s.getsockname()[1])
    with pytest.raises(UserError):
        MetricsServer(CollectorRegistry(), 70000)


def test_scrape_writer_timed_and_final(tmp_path):
    m = EngineMetrics(CollectorRegistry())
    w = ScrapeWriter(m.registry, tmp_path, interval_s=0.05)
    for i in range(3):
        m(StepRecord(step=i, t_start_s=1.0, t_end_s=1.01, kind="decode", decode_reqs=1, decode_rows=1))
        time.sleep(0.06)
    final = w.close()
    assert w.close() == final  # once
    scrapes = sorted((tmp_path / "scrapes").glob("*.prom"), key=lambda p: float(p.stem))
    assert len(scrapes) >= 2
    t_names = [float(p.stem) for p in scrapes]
    assert all(abs(t - time.time()) < 60 for t in t_names)  # unix seconds
    counts = [steps_total(p.read_text(), "decode") for p in scrapes]
    assert counts == sorted(counts) and counts[-1] == 3  # counters only grow; the last one is complete
    assert steps_total(final.read_text(), "decode") == 3 and final.name == "metrics.prom"


def test_final_only_and_never_overwrites(tmp_path):
    reg = CollectorRegistry()
    w = ScrapeWriter(reg, tmp_path)
    assert w.close() == tmp_path / "metrics.prom" and not (tmp_path / "scrapes").exists()
    with pytest.raises(FileExistsError):
        write_exposition(reg, tmp_path / "metrics.prom")
    with pytest.raises(UserError):
        ScrapeWriter(reg, tmp_path, interval_s=0)
