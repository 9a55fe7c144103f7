"""The shipped Prometheus rules (deploy/prometheus/mixdiag-rules.yml): valid for promtool, their unit tests
pass, and every series they read is one the exporter publishes.

promtool comes with Debian's ``prometheus`` package, which ``make test`` installs (scripts/setup_system.sh):
without it these tests fail and say so, they do not skip.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mixdiag.causes import CAUSES
from mixdiag.exporter import DiagnosisExporter

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "mixdiag-rules.yml"
RULE_TESTS = RULES_DIR / "mixdiag-rules.test.yml"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found on PATH: install Debian's 'prometheus' package (make system-deps)")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=RULES_DIR, timeout=120)


def test_promtool_checks_the_rules():
    r = run("check", "rules", RULES.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 6 rules found" in r.stdout


def test_promtool_unit_tests_of_the_rules_pass():
    r = run("test", "rules", RULE_TESTS.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_a_broken_rule_fails_its_unit_test(tmp_path):
    # the unit tests can fail: without its floor on the excess the mixing alert fires on a tiny excess
    broken = RULES.read_text().replace("rate5m > 0.05", "rate5m > 0.001")
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    r = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode != 0 and "MixdiagMixingShareHigh" in r.stdout + r.stderr


def test_every_series_the_rules_read_is_exported_with_a_real_cause():
    text = RULES.read_text() + RULE_TESTS.read_text()
    exported = set(re.findall(r"^(mixdiag_\w+?)(?:\{|\s)", DiagnosisExporter().render().decode(), re.M))
    read = set(re.findall(r"\b(mixdiag_\w+_total)\b", text))
    assert read == {"mixdiag_itl_excess_seconds_total", "mixdiag_episodes_total"} and read <= exported
    assert set(re.findall(r'cause="(\w+)"', text)) <= set(CAUSES)
