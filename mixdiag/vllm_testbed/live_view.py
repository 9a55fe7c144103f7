"""The live view of a testbed run (accuracy tier g5): ``mixdiag analyze <url>/metrics`` polling the
running server for the length of the traffic, its ``--json`` kept in the run directory.

Replaying the saved scrapes afterwards would test the scrape reader, not the live path (its own
polling clock, its own handling of a server that answers slowly while it prefills), so the
analyzer runs beside the load, as a user would run it, in a child process the guard stops.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mixdiag.vllm_testbed.process_guard import ProcessGuard

#: where the live view writes, relative to the run directory
LIVE_JSON = Path("live") / "analyze.json"


@dataclass
class LiveView:
    """One running ``mixdiag analyze URL --duration S --json``."""

    proc: subprocess.Popen
    out: Path
    err: Path

    def finish(self, guard: ProcessGuard, timeout_s: float) -> str | None:
        """Wait for the analyzer to end by itself; stop it after ``timeout_s``. Returns an error line
        or None."""
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            guard.stop(self.proc, grace_s=5.0)
            return f"live analyze still running {timeout_s:.0f} s after the traffic; stopped (see {self.err})"
        if rc != 0:
            last = (self.err.read_text(errors="replace").strip().splitlines() or [f"exit {rc}"])[-1]
            return f"live analyze exited {rc}: {last}"
        return None


def argv(url: str, duration_s: float, interval_s: float) -> list[str]:
    """The analyzer's command line: the server's /metrics for ``duration_s``, JSON out."""
    return [sys.executable, "-m", "mixdiag", "analyze", f"{url.rstrip('/')}/metrics", "--duration", f"{duration_s:g}",
            "--interval", f"{interval_s:g}", "--json"]


def start(guard: ProcessGuard, url: str, duration_s: float, interval_s: float, run_dir: Path) -> LiveView:
    """Start the live analyzer; its JSON goes to ``run_dir/live/analyze.json``."""
    out = Path(run_dir) / LIVE_JSON
    out.parent.mkdir(parents=True, exist_ok=True)
    err = out.with_suffix(".err")
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = guard.popen(argv(url, duration_s, interval_s), stdout=o, stderr=e, stdin=subprocess.DEVNULL)
    return LiveView(proc, out, err)
