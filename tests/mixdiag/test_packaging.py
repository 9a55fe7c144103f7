"""The distribution installs one namespace: mixdiag.* and no generic top-level packages."""
import importlib
import subprocess
import sys
import sysconfig
from pathlib import Path


def test_subpackages_import_under_mixdiag():
    for name in ("mixdiag", "mixdiag.engine", "mixdiag.collectors", "mixdiag.dashboard"):
        assert importlib.import_module(name).__file__


def test_no_generic_top_level_package_in_site_packages():
    purelib = Path(sysconfig.get_paths()["purelib"])
    for generic in ("engine", "collectors", "dashboard"):
        assert not (purelib / generic).exists(), f"{generic} leaked into {purelib}"
    # and from a directory outside the checkout, the generic names do not import at all
    code = "import importlib.util as u, sys; sys.exit(any(u.find_spec(n) for n in ('engine','collectors','dashboard')))"
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0
