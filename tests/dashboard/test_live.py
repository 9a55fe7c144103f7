"""Live mode against a real engine /metrics endpoint (the engine's metrics registry and server)."""
import pytest

from mixdiag.collectors.prometheus.live import LiveFollower
from mixdiag.collectors.prometheus.prom_http import url_kind
from mixdiag.diagnosis import diagnose
from mixdiag.engine.telemetry.metrics import EngineMetrics
from mixdiag.engine.telemetry.metrics_server import MetricsServer
from mixdiag.errors import UserError
from mixdiag.exporter import DiagnosisExporter


def feed(metrics, tl, lo, hi):
    """Replay steps [lo, hi) of ``tl`` into the engine's metrics, as the engine's observers would."""
    st, tok = tl.steps, tl.tokens
    for r in st[(st["step"] >= lo) & (st["step"] < hi)].itertuples(index=False):
        metrics.observe_step(r)
    for r in tok[(tok["step"] >= lo) & (tok["step"] < hi)].itertuples(index=False):
        metrics.observe_token(r.request_id, r.t_s, r.n_tokens)


@pytest.mark.parametrize("url,kind", [("http://h:8000/metrics", "engine"), ("http://h:8000/metrics/", "engine"),
                                      ("http://prom:9090", "prometheus"), ("https://prom/api", "prometheus")])
def test_url_kind(url, kind):
    assert url_kind(url, probe=False) == kind


def test_engine_scrapes_become_intervals_and_the_slow_one_is_a_spike(make_timeline):
    tl = make_timeline(n_steps=400, period=0, faults={n: dict(dur=0.2) for n in range(250, 262)})
    metrics = EngineMetrics()
    exporter = DiagnosisExporter()
    with MetricsServer(metrics.registry, 0) as srv:
        live = LiveFollower(srv.url, window_s=100.0)
        assert live.kind == "engine"
        got = []
        for i in range(8):
            feed(metrics, tl, 50 * i, 50 * (i + 1))
            got.append(live.poll(now=1000.0 + 10 * i))
            if got[-1] is not None:
                exporter.publish(got[-1], diagnose(got[-1]), now=1000.0 + 10 * i)
    assert got[0] is None  # one scrape is no interval yet
    final = got[-1]
    assert len(final.steps) == 7 and set(final.steps["granularity"]) == {"interval"}
    assert final.steps["itl_count"].tolist() == [400.0] * 7  # 50 steps x 8 requests per interval
    d = diagnose(final)
    assert len(d.spikes) == 1 and d.spikes.iloc[0]["step"] == 4  # the interval holding steps 250..299
    assert sum(exporter.snapshot.spikes_total.values()) == 1  # counted once across 3 overlapping publications


def test_window_forgets_old_scrapes(make_timeline):
    metrics = EngineMetrics()
    with MetricsServer(metrics.registry, 0) as srv:
        live = LiveFollower(srv.url, window_s=25.0)
        for i in range(6):
            feed(metrics, make_timeline(n_steps=20, period=0), 0, 20)
            tl = live.poll(now=100.0 + 10 * i)
    assert len(tl.steps) == 2  # scrapes at t=130, 140, 150 remain


def test_unreachable_and_unset_sources_are_user_errors():
    live = LiveFollower()
    with pytest.raises(UserError, match="live mode is off"):
        live.poll()
    live.start("http://127.0.0.1:9/metrics")
    with pytest.raises(UserError, match="cannot connect"):
        live.poll()
    assert "cannot connect" in live.last_error


@pytest.mark.prometheus
def test_following_a_real_prometheus_server(make_timeline, prometheus_server, metrics_endpoint):
    import threading
    import time

    tl = make_timeline(n_steps=300, period=0)
    metrics = EngineMetrics()
    target = metrics_endpoint(metrics.registry)
    stop = threading.Event()

    def engine():  # 10 steps (80 token events) every 0.1 s, on a loop
        i = 0
        while not stop.is_set():
            feed(metrics, tl, i, i + 10)
            i = (i + 10) % 300
            time.sleep(0.1)

    feeder = threading.Thread(target=engine, daemon=True)
    feeder.start()
    try:
        prom = prometheus_server([target], scrape_interval_s=0.5)
        prom.wait_for_samples("mixdiag_engine_steps_total", min_samples=6)
        live = LiveFollower(prom.url, window_s=30.0, refresh_s=1.0)
        assert live.kind == "prometheus"
        got = live.poll()
    finally:
        stop.set()
    assert got is not None and len(got.steps) >= 2
    assert set(got.steps["granularity"]) == {"interval"}
    assert got.steps["itl_count"].sum() > 0
    assert got.meta["sources"][0]["format"] == "prom-http"
    exporter = DiagnosisExporter()
    exporter.publish(got, diagnose(got))
    assert exporter.snapshot.steps_analyzed == len(got.steps)


def test_dashboard_live_tick_shows_the_latest_window(make_timeline, tmp_path):
    from mixdiag.dashboard.pages import sources
    from mixdiag.dashboard.settings import DashboardConfig
    from mixdiag.dashboard.store import DataStore

    tl = make_timeline(n_steps=100, period=0)
    metrics = EngineMetrics()
    store = DataStore(DashboardConfig(), DiagnosisExporter())
    with MetricsServer(metrics.registry, 0) as srv:
        live = LiveFollower(srv.url)
        feed(metrics, tl, 0, 50)
        key, msg = sources.on_live_tick(store, live)
        assert msg.endswith("waiting for a second scrape")
        feed(metrics, tl, 50, 100)
        key, msg = sources.on_live_tick(store, live)
        key2, _ = sources.on_live_tick(store, live)
    assert key["id"] == key2["id"] and key2["rev"] >= key["rev"]  # one dataset, refreshed in place
    ds = store.get(key2["id"])
    assert ds.label == f"live: {srv.url}" and len(ds.timeline.steps) == 2
    assert store.exporter.snapshot.analyses_total == 2


def test_url_kind_without_probe_never_touches_the_network():
    # port 1 refuses connections: a probe would raise; live mode's rule does not probe at all
    assert url_kind("http://127.0.0.1:1/", probe=False) == "prometheus"
    assert url_kind("http://127.0.0.1:1/metrics") == "engine"  # a /metrics path needs no probe either
    with pytest.raises(UserError, match="neither a Prometheus server"):
        url_kind("http://127.0.0.1:1/", timeout_s=1.0)
