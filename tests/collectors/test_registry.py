"""Collector registry: lazy modules, content sniffing with extension tie-break, clear failures."""
import sys
import types
from pathlib import Path

import pytest

from mixdiag.collectors import registry
from mixdiag.errors import UserError

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_every_importable_collector_declares_its_registered_format():
    for c in registry.COLLECTORS:
        mod = registry._import(c)
        if not isinstance(mod, Exception):
            assert mod.FORMAT == c.format, c.module


def test_text_engineers_formats_are_listed():
    assert {"prom-text", "sglang-log", "vllm-log", "dcgm", "nvml-csv"} <= set(registry.formats())


@pytest.mark.parametrize("path,fmt", [
    (FIX / "nsys" / "mock.sqlite", "nsys-sqlite"),
    (FIX / "nsys" / "healthy_1pct.sqlite", "nsys-sqlite"),
])
def test_detect_by_content(path, fmt):
    assert registry.detect(path) == fmt


def test_detect_run_directories_and_traces(tmp_path):
    import gzip

    from mixdiag.engine.core.records import StepRecord, to_timeline

    to_timeline([StepRecord(step=0, t_start_s=1.8e9, t_end_s=1.8e9 + 1, kind="idle")]).save(tmp_path / "run")
    trace = b'{"schemaVersion": 1, "traceEvents": []}'
    (tmp_path / "t.json").write_bytes(trace)
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(trace))
    assert registry.detect(tmp_path / "run") == "mixdiag-run"
    assert registry.detect(tmp_path / "t.json") == registry.detect(tmp_path / "t.json.gz") == "kineto-json"


def test_detect_ignores_a_misleading_extension(tmp_path):
    p = tmp_path / "trace.json"
    p.write_bytes((FIX / "nsys" / "mock.sqlite").read_bytes())
    assert registry.detect(p) == "nsys-sqlite"


def _fake(monkeypatch, name, fmt, claims):
    mod = types.ModuleType(f"mixdiag.collectors.{name}")
    mod.FORMAT, mod.sniff, mod.read = fmt, (lambda head, n: claims), (lambda *a, **k: None)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return registry.Collector(fmt, name, (".aa",) if fmt == "fmt-a" else (".bb",))


@pytest.fixture
def fakes(monkeypatch):
    cols = (_fake(monkeypatch, "fake_a", "fmt-a", True), _fake(monkeypatch, "fake_b", "fmt-b", True),
            registry.Collector("fmt-gone", "no_such_module_here"))
    monkeypatch.setattr(registry, "COLLECTORS", cols)
    monkeypatch.setattr(registry, "BY_FORMAT", {c.format: c for c in cols})
    monkeypatch.setattr(registry, "_cache", {})


def test_extension_breaks_ties_then_order(fakes, tmp_path):
    (tmp_path / "x.bb").write_text("data")
    (tmp_path / "x.zz").write_text("data")
    assert registry.detect(tmp_path / "x.bb") == "fmt-b"
    assert registry.detect(tmp_path / "x.zz") == "fmt-a"


def test_missing_module_makes_only_its_format_unavailable(fakes):
    with pytest.raises(UserError, match="format fmt-gone unavailable"):
        registry.module("fmt-gone")
    assert registry.available()["fmt-a"] is None and "unavailable" in registry.available()["fmt-gone"]
    with pytest.raises(UserError, match="unknown format 'nope'"):
        registry.module("nope")


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_bytes(bytes(range(256)) * 4), "no known format"),
    (lambda p: None, "no such file"),
])
def test_undetectable_input_is_a_user_error(tmp_path, make, message):
    p = tmp_path / "input.bin"
    make(p)
    with pytest.raises(UserError, match=message):
        registry.detect(p)
