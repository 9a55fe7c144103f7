"""CLI verbs: dashboard (bad input -> exit 2), watch (follows a real engine /metrics), demo (never clobbers)."""
import io
import json
import socket
import threading
import time
import urllib.request
from contextlib import redirect_stdout

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mixdiag.cli import main as cli_main
from mixdiag.commands.demo import pick_run_dir
from mixdiag.engine.telemetry.metrics import EngineMetrics
from mixdiag.engine.telemetry.metrics_server import MetricsServer
from mixdiag.errors import UserError


def run_cli(argv):
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli_main(argv)
    return rc, out.getvalue()


@pytest.mark.parametrize("argv,msg", [
    (["dashboard", "--data", "/no/such/place"], "error: data path does not exist"),
    (["dashboard", "--prometheus", "file:///etc/passwd"], "error: --prometheus must be an http"),
    (["dashboard", "--port", "70000"], "error: --port must be 1..65535"),
    (["dashboard", "--host", "example.com"], "error: --host must be an IP address"),
    (["watch", "--engine", "http://127.0.0.1:9/metrics", "--interval", "0.1"], "error: --interval must be"),
    (["demo", "--port", "0"], "error: --port must be 1..65535"),
])
def test_bad_input_is_one_line_and_exit_2(argv, msg, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(msg) and err.count("\n") == 1


def test_pick_run_dir_never_clobbers(tmp_path):
    assert pick_run_dir(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert pick_run_dir(tmp_path / "empty") == tmp_path / "empty"
    full = tmp_path / "full"
    (full / "run-1").mkdir(parents=True)
    (full / "steps.parquet").write_bytes(b"")
    assert pick_run_dir(full) == full / "run-2"
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        pick_run_dir(tmp_path / "file")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_watch_follows_an_engine_and_serves_the_diagnosis(make_timeline):
    tl = make_timeline(n_steps=300, period=0)
    metrics = EngineMetrics()
    port = free_port()
    stop = threading.Event()

    def engine():  # a live engine: 10 more steps every 0.1 s
        i = 0
        while not stop.is_set():
            st = tl.steps[(tl.steps["step"] >= i) & (tl.steps["step"] < i + 10)]
            for r in st.itertuples(index=False):
                metrics.observe_step(r)
            i = (i + 10) % 300
            time.sleep(0.1)

    with MetricsServer(metrics.registry, 0) as srv:
        feeder = threading.Thread(target=engine, daemon=True)
        feeder.start()
        result = {}
        watcher = threading.Thread(target=lambda: result.update(zip(("rc", "out"), run_cli(
            ["watch", "--engine", srv.url, "--interval", "0.5", "--count", "6", "--port", str(port), "--json"]))))
        watcher.start()
        scraped = None
        deadline = time.time() + 60
        while time.time() < deadline and watcher.is_alive():
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            fams = {f.name: f for f in text_string_to_metric_families(body)}
            if fams["mixdiag_analyses"].samples[0].value >= 1:
                scraped = fams
                break
            time.sleep(0.2)
        watcher.join(60)
        stop.set()
    assert scraped is not None, "watch never published a diagnosis on /metrics"
    assert {s.labels["cause"] for s in scraped["mixdiag_spikes"].samples if s.name.endswith("_total")} >= {"mixing"}
    assert scraped["mixdiag_steps_analyzed"].samples[0].value >= 1
    assert result["rc"] == 0
    doc = json.loads(result["out"])
    assert doc["polls"] == 6 and doc["diagnoses"] >= 4 and doc["source"] == srv.url
    assert set(doc["spikes_total"]) >= {"mixing", "unknown"}


@pytest.mark.slow
def test_demo_no_serve_writes_the_run_and_a_report_naming_three_causes(tmp_path):
    out = tmp_path / "demo"
    rc, text = run_cli(["demo", "--out", str(out), "--no-serve", "--json"])
    assert rc == 0
    doc = json.loads(text)
    run_dir = out
    assert doc["run_dir"] == str(run_dir) and doc["url"] is None
    assert (run_dir / "steps.parquet").exists() and (run_dir / "truth.csv").exists()
    html = (run_dir / "report.html").read_text()
    named = [c for c, n in doc["by_cause"].items() if n]
    assert len(named) >= 3, doc["by_cause"]
    assert all(c in html for c in named)
    # a second demo keeps the first run
    rc, text = run_cli(["demo", "--out", str(out), "--no-serve", "--json", "--max-steps", "5"])
    assert rc == 0 and json.loads(text)["run_dir"] == str(out / "run-1")
    assert (run_dir / "report.html").read_text() == html


def test_demo_refuses_a_taken_port_before_running_the_engine(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert cli_main(["demo", "--out", str(tmp_path / "d"), "--port", str(port)]) == 2
    assert "cannot serve on 127.0.0.1" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # nothing was run or written
