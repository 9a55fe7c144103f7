"""Inputs are never written: every registered collector reads copies of the fixtures and leaves
them byte-identical, with no new file beside them (no index, journal, cache or lock file)."""
import hashlib
import shutil
from pathlib import Path

import pytest

from mixdiag.collectors import load, registry
from mixdiag.collectors.traces.nsys.db import read_only_uri
from mixdiag.errors import UserError

FIX = Path(__file__).resolve().parents[1] / "fixtures"
URL_FORMATS = ("prom-endpoint", "prom-http")  # read URLs, never files


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    for sub in ("logs", "nsys"):
        shutil.copytree(FIX / sub, root / sub)
    return root


def test_every_collector_leaves_its_inputs_untouched(copies):
    before = _snapshot(copies)
    files = sorted(p for p in copies.rglob("*") if p.is_file())
    read_ok, crashes = set(), []
    for p in files:
        for fmt in registry.formats():
            if fmt in URL_FORMATS:
                continue
            try:
                registry.module(fmt).read(str(p))
                read_ok.add((p.name, fmt))
            except UserError:
                continue  # not this format: refused in one line (the contract), and still nothing may be written
            except Exception as e:  # noqa: BLE001  collected: a foreign file must be refused, never crash a reader
                crashes.append(f"{fmt} on {p.name}: {type(e).__name__}: {e}")
        if _detectable(p):  # the auto path too (sniffing reads heads)
            try:
                load(str(p))
            except UserError:
                pass
    for d in (copies / "logs", copies / "nsys"):
        try:
            load(str(d))
        except UserError:
            pass
    assert _snapshot(copies) == before
    assert crashes == []
    # the check means something only if the real readers ran over their own files
    assert ("mock.sqlite", "nsys-sqlite") in read_ok and ("vllm_log_37307.txt", "vllm-log") in read_ok
    assert ("sglang_log_13023.txt", "sglang-log") in read_ok and ("vllm_metrics_11117.txt", "prom-text") in read_ok


def _detectable(p: Path) -> bool:
    try:
        registry.detect(p)
        return True
    except UserError:
        return False


def test_sqlite_is_opened_read_only_and_immutable(tmp_path):
    uri = read_only_uri(tmp_path / "a b.sqlite")
    assert uri.startswith("file:") and uri.endswith("?mode=ro&immutable=1") and "a%20b" in uri
