"""Data access: nothing outside the data directory, size-capped uploads parsed in a child process."""
import base64
import os
from pathlib import Path

import pytest

from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.dashboard.isolate import parse_isolated
from mixdiag.dashboard.store import DataStore
from mixdiag.errors import UserError
from mixdiag.exporter import DiagnosisExporter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
SGLANG_LOG = FIXTURES / "sglang_log_11648.txt"  # real SGLang lines (tests/fixtures/logs/SOURCES.md)


@pytest.fixture
def data_dir(tmp_path, make_timeline):
    d = tmp_path / "data"
    make_timeline().save(d / "runA")
    make_timeline(period=0).save(d / "nested" / "runB")
    (d / "server.log").write_bytes(SGLANG_LOG.read_bytes())
    (d / "notes.csv").write_text("ignored\n")
    # timed scrapes of the engine's real metrics registry while it runs 3 x 40 steps
    from prometheus_client import generate_latest

    from mixdiag.engine.telemetry.metrics import EngineMetrics

    metrics, tl = EngineMetrics(), make_timeline(n_steps=120)
    (d / "scrapes").mkdir()
    for i in range(3):
        for r in tl.steps[(tl.steps["step"] >= 40 * i) & (tl.steps["step"] < 40 * (i + 1))].itertuples(index=False):
            metrics.observe_step(r)
        (d / "scrapes" / f"{1_700_000_000 + 10 * i}.prom").write_bytes(generate_latest(metrics.registry))
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.log").write_text("top secret\n")
    os.symlink(secret, d / "escape")            # a symlink pointing outside the data directory
    os.symlink(secret / "key.log", d / "key.log")
    return d


@pytest.fixture
def store(data_dir):
    return DataStore(DashboardConfig(data_dir=data_dir, upload_max_bytes=4096), DiagnosisExporter())


def upload(data: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode()


def test_entries_list_runs_and_captures_inside_only(store):
    assert store.entries() == [{"label": "run: nested/runB/", "value": "nested/runB"},
                               {"label": "run: runA/", "value": "runA"},
                               {"label": "scrapes: scrapes/", "value": "scrapes"},
                               {"label": "file: server.log", "value": "server.log"}]


@pytest.mark.parametrize("rel", ["../secret/key.log", "/etc/passwd", "escape/key.log", "key.log", "runA/../../secret",
                                 "a\x00b"])
def test_no_path_outside_the_data_directory(store, rel):
    with pytest.raises(UserError):
        store.load_path(rel)


def test_load_run_and_capture(store):
    ds = store.load_path("runA")
    assert ds.label == "runA" and ds.headline.n_spikes > 0 and store.get(None) is ds
    log = store.load_path("server.log")
    assert log.timeline.meta["sources"][0]["format"] == "sglang-log"
    assert log.timeline.meta["sources"][0]["lines_parsed"] > 0
    scrapes = store.load_path("scrapes")
    assert scrapes.timeline.steps["granularity"].tolist() == ["interval", "interval"]
    assert scrapes.timeline.steps["mixed_steps"].tolist() == [2.0, 1.0]  # steps 45, 75 | 105 (one per 30)


def test_upload_is_parsed_in_a_child_and_leaves_nothing_behind(store, data_dir):
    before = sorted(p.name for p in data_dir.rglob("*"))
    ds = store.load_upload("../../evil name.txt", upload(SGLANG_LOG.read_bytes()[:4000]))
    assert ds.label == "upload: evil_name.txt"  # only the base name, odd characters replaced
    assert ds.timeline.meta["sources"][0]["format"] == "sglang-log"
    assert sorted(p.name for p in data_dir.rglob("*")) == before


def test_nsight_upload(tmp_path):
    """A real Nsight Systems export (tests/fixtures/nsys, MIT, see LICENSE.nsys-ai) through the upload path."""
    sqlite = FIXTURES.parent / "nsys" / "mock.sqlite"
    st = DataStore(DashboardConfig(upload_max_bytes=sqlite.stat().st_size + 1), DiagnosisExporter())
    ds = st.load_upload("capture.sqlite", upload(sqlite.read_bytes()))
    src = ds.timeline.meta["sources"][0]
    assert src["format"] == "nsys-sqlite" and src["path"].endswith("capture.sqlite")
    assert len(ds.timeline.steps) > 0


@pytest.mark.parametrize("contents,msg", [
    (upload(b"x" * 5000), "larger than"),
    ("data:;base64,@@@", "not valid base64"),
    ("", "empty upload"),
    (upload(b"\x00\x01 not any known format \xff" * 10), "upload.bin"),
])
def test_bad_uploads_are_refused_with_one_line(store, contents, msg):
    with pytest.raises(UserError, match=msg) as e:
        store.load_upload("upload.bin", contents)
    assert "\n" not in str(e.value)


def test_parse_isolated_enforces_the_time_limit(tmp_path):
    # A FIFO nobody writes to: the child blocks on open, the parent gives up after the timeout.
    fifo = tmp_path / "stuck.log"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="longer than 1 s"):
        parse_isolated(fifo, "sglang-log", timeout_s=1)


def test_config_validation(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        DashboardConfig(data_dir=tmp_path / "nope")
    with pytest.raises(UserError, match="http"):
        DashboardConfig(prometheus_url="file:///etc/passwd")
    with pytest.raises(UserError, match="unknown model preset"):
        DashboardConfig(ledger_preset="gpt-9")
    cfg = DashboardConfig.from_data_path(SGLANG_LOG)
    assert cfg.data_dir == SGLANG_LOG.parent and cfg.initial == SGLANG_LOG.name
