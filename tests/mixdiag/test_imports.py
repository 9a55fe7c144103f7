"""Imports follow need (issue 11 item 9): the CLI, the collectors, the diagnosis and the outputs never
pull torch or triton; only the engine does. Checked in a fresh interpreter, where sys.modules is clean."""
import subprocess
import sys

import pytest

HEAVY = ("torch", "triton")

CHECKS = {
    # what the light paths import -> which heavy modules must stay out
    "cli parser": ("import mixdiag.cli as c; c.build_parser()", HEAVY + ("pandas", "numpy")),
    "collectors": ("import mixdiag.collectors as m; from mixdiag.collectors import registry\n"
                   "import importlib\n"
                   "for c in registry.COLLECTORS: importlib.import_module('mixdiag.collectors.' + c.module)", HEAVY),
    "diagnosis": ("import mixdiag.diagnosis", HEAVY),
    "outputs": ("import mixdiag.report, mixdiag.exporter, mixdiag.wire", HEAVY),
    "dashboard": ("import mixdiag.dashboard.app", HEAVY),
    "everything light at once": ("import importlib, mixdiag.cli as c; c.build_parser()\n"
                                 "from mixdiag.collectors import registry\n"
                                 "for x in registry.COLLECTORS: importlib.import_module('mixdiag.collectors.' + x.module)\n"
                                 "import mixdiag.diagnosis, mixdiag.report, mixdiag.exporter", HEAVY),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_light_paths_do_not_import_heavy_modules(name):
    code, banned = CHECKS[name]
    probe = code + f"\nimport sys; print(','.join(m for m in {banned!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{name} imported {out.stdout.strip()}"


def test_the_probe_can_fail():
    """The check sees a heavy import when one happens (so the tests above can fail)."""
    out = subprocess.run([sys.executable, "-c", "import numpy, sys; print('numpy' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True"
