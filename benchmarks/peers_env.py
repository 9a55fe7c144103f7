"""The peer analyzers' virtualenvs under benchmarks/.cache/peers/ (gitignored), from the package registry only.

* nsys-ai 0.3.0 requires ``duckdb>=1.0.0`` with no upper bound, so pip picks the newest DuckDB (2.0.x);
  DuckDB then downloads its ``sqlite_scanner`` extension at run time, which fails offline, and nsys-ai falls
  back to plain sqlite3 and creates indexes inside the export it reads. The registry's newest
  ``duckdb-extension-sqlite-scanner`` is 1.5.5 and itself pins ``duckdb==1.5.5``: that is the matching pair.
  ``duckdb-extensions`` installs the packaged extension file into DuckDB's extension folder, which lives
  under ``$HOME/.duckdb``; the peers run with ``HOME`` = a folder of the cache so nothing lands in the
  user's home.
* HTA 0.5.0 with ``pandas<3`` (pandas 3 crashes it loading a small trace: an int16 dtype error); a second
  HTA venv with pandas 3 exists only to observe that failure.

A venv is reused when its stamp names the same packages; ``install=False`` never installs.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache" / "peers"
HOME = CACHE / "home"  # HOME of every peer process: DuckDB's extension folder, nsys-ai's ~/.nsys-ai
STAMP = ".mixdiag-peer-stamp"

NSYS_AI_PKGS = ("nsys-ai==0.3.0", "duckdb==1.5.5", "duckdb-extension-sqlite-scanner==1.5.5",
                "duckdb-extensions==1.5.5")
HTA_PKGS = ("HolisticTraceAnalysis==0.5.0", "pandas<3")
HTA_PANDAS3_PKGS = ("HolisticTraceAnalysis==0.5.0", "pandas>=3")  # only to observe the failure the pin avoids
# run once after pip: puts the packaged sqlite_scanner where DuckDB looks, and checks DuckDB sees it
DUCKDB_EXT = ("from duckdb_extensions import import_extension; import duckdb; import_extension('sqlite_scanner'); "
              "ok = duckdb.sql(\"SELECT installed FROM duckdb_extensions() WHERE extension_name = 'sqlite_scanner'\")"
              ".fetchone()[0]; print(duckdb.__version__, ok); raise SystemExit(0 if ok else 1)")


@dataclass
class Peer:
    name: str
    venv: Path
    packages: tuple[str, ...]
    post: str | None = None  # python run in the venv after pip (with the peers' HOME)
    ready: bool = False
    note: str = ""  # one line: reused / installed / why not available

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def version(self, dist: str) -> str:
        out = subprocess.run([str(self.python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                             capture_output=True, text=True)
        return out.stdout.strip() or "?"


def peers() -> dict[str, Peer]:
    return {"nsys-ai": Peer("nsys-ai", CACHE / "nsys-ai", NSYS_AI_PKGS, DUCKDB_EXT),
            "HTA": Peer("HTA", CACHE / "hta", HTA_PKGS),
            "HTA+pandas3": Peer("HTA+pandas3", CACHE / "hta-pandas3", HTA_PANDAS3_PKGS)}


def peer_env() -> dict[str, str]:
    """The environment every peer runs in: its own HOME, no proxy variables of ours changed."""
    HOME.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "HOME": str(HOME), "PYTHONWARNINGS": "ignore"}


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return lines[-1].strip()[:200] if lines else "no output"


def _run(cmd: list[str], timeout: int = 1200) -> tuple[bool, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=peer_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{type(e).__name__}: {e}"
    return out.returncode == 0, _last_line(out.stderr or out.stdout)


def ensure(peer: Peer, install: bool = True) -> Peer:
    """Make ``peer`` usable: reuse its venv when the stamp matches, else (when allowed) build it.
    Never raises: ``peer.ready`` and ``peer.note`` say what happened in one line."""
    stamp = peer.venv / STAMP
    want = "\n".join(peer.packages)
    if stamp.exists() and stamp.read_text() == want and peer.python.exists():
        peer.ready, peer.note = True, f"reused {peer.venv.relative_to(ROOT)}"
        return peer
    if not install:
        peer.note = f"{peer.name}: no usable venv at {peer.venv.relative_to(ROOT)} and --no-install given"
        return peer
    if not peer.python.exists():
        ok, msg = _run([sys.executable, "-m", "venv", str(peer.venv)])
        if not ok:
            peer.note = f"{peer.name}: install failed (venv: {msg})"
            return peer
    ok, msg = _run([str(peer.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *peer.packages])
    if not ok:
        peer.note = f"{peer.name}: install failed (pip: {msg})"
        return peer
    if peer.post:
        ok, msg = _run([str(peer.python), "-c", peer.post])
        if not ok:
            peer.note = f"{peer.name}: install failed (post-install: {msg})"
            return peer
    stamp.write_text(want)
    peer.ready, peer.note = True, f"installed {' '.join(peer.packages)}"
    return peer
