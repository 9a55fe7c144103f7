"""The Prometheus fixture really starts a server that scrapes a served registry."""
import pytest
from prometheus_client import CollectorRegistry, Counter


@pytest.mark.prometheus
def test_prometheus_scrapes_served_registry(prometheus_server, metrics_endpoint):
    reg = CollectorRegistry()
    c = Counter("fixture_probe", "probe counter", registry=reg)
    c.inc(7)
    target = metrics_endpoint(reg)
    prom = prometheus_server([target], scrape_interval_s=0.5)
    prom.wait_for_samples("up", min_samples=2)
    res = prom.wait_until("fixture_probe_total", lambda r: len(r) == 1)
    assert float(res[0]["value"][1]) == 7.0
    assert res[0]["metric"]["instance"] == target
    prom.stop()
    assert prom.proc.poll() is not None
