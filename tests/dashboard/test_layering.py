"""Layering: the core never reaches into the dashboard; only the dashboard command opens it."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The one module under mixdiag/ allowed to import mixdiag.dashboard.
DOOR = ROOT / "mixdiag" / "commands" / "serve_dashboard.py"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports inside functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_no_module_under_mixdiag_but_the_dashboard_command_imports_the_dashboard():
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m.startswith("mixdiag.dashboard"))
                 for p in sorted((ROOT / "mixdiag").rglob("*.py")) if p != DOOR}
    assert {p: m for p, m in offenders.items() if m} == {}
    assert any(m.startswith("mixdiag.dashboard") for m in imported_modules(DOOR))  # the check sees imports


def test_collectors_do_not_import_the_dashboard():
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "collectors").rglob("*.py"))
                 if any(m.startswith("mixdiag.dashboard") for m in imported_modules(p))]
    assert offenders == []


def test_watch_and_the_live_collector_load_without_the_dashboard_or_torch():
    code = ("import sys, mixdiag.commands.watch, mixdiag.collectors.prometheus.live, mixdiag.exporter; "
            "bad = [m for m in sys.modules if m.startswith('mixdiag.dashboard') or m == 'torch' or m == 'dash']; "
            "print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_dashboard_app_does_not_import_torch():
    code = "import sys, mixdiag.dashboard.app; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
