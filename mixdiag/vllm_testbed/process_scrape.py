"""The engine process's CPU time, sampled as a node's process-exporter would serve it:
``DIR/process/<unix_time_s>.prom`` on the scrape grid, in ncabatoff/process-exporter's names
(``namedprocess_namegroup_cpu_seconds_total{groupname, mode="user"|"system"}``, from
``/proc/<pid>/stat`` utime and stime; ``namedprocess_namegroup_num_threads``), the group named
after the process's ``comm`` - process-exporter's ``{{.Comm}}`` template.

Why the testbed records it: on vLLM's CPU backend the EngineCore process *is* the device, so its
CPU time is what DCGM's engine activity is on a GPU - the measured record of when the engine ran.
A SIGSTOP stall, or a neighbour that takes the cores, shows as CPU time the engine did not get
while requests were waiting (docs/testbed-vllm.md). The vLLM ``/metrics`` scrape is left exactly as
served; this is a second exporter's scrape beside it.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_stat(pid: int) -> tuple[str, float, float, int] | None:
    """(comm, user s, system s, threads) of ``pid`` from /proc, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm is in parentheses and may hold spaces; the fields after the last ')' are space-separated
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    f = raw[raw.rindex(")") + 2:].split()
    # after comm: state(0) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(11) stime(12)
    # cutime cstime priority nice num_threads(17)
    return comm, int(f[11]) / _TICK, int(f[12]) / _TICK, int(f[17])


def exposition(comm: str, user_s: float, system_s: float, threads: int) -> str:
    """One scrape's text in process-exporter's families."""
    g = comm.replace("\\", "\\\\").replace('"', '\\"')
    return "\n".join([
        "# HELP namedprocess_namegroup_cpu_seconds_total Cpu user usage in seconds",
        "# TYPE namedprocess_namegroup_cpu_seconds_total counter",
        f'namedprocess_namegroup_cpu_seconds_total{{groupname="{g}",mode="system"}} {system_s:.2f}',
        f'namedprocess_namegroup_cpu_seconds_total{{groupname="{g}",mode="user"}} {user_s:.2f}',
        "# HELP namedprocess_namegroup_num_procs number of processes in this group",
        "# TYPE namedprocess_namegroup_num_procs gauge",
        f'namedprocess_namegroup_num_procs{{groupname="{g}"}} 1',
        "# HELP namedprocess_namegroup_num_threads Number of threads",
        "# TYPE namedprocess_namegroup_num_threads gauge",
        f'namedprocess_namegroup_num_threads{{groupname="{g}"}} {threads}', ""])


class ProcessScraper(threading.Thread):
    """Sample ``pid()``'s CPU time every ``interval_s`` into ``out_dir`` until :meth:`finish`."""

    def __init__(self, pid: Callable[[], int], out_dir: Path, interval_s: float):
        super().__init__(name="mixdiag-process-scraper", daemon=True)
        self._pid, self.out_dir, self.interval_s = pid, Path(out_dir), float(interval_s)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._halt = threading.Event()
        self.written = 0
        self.failed = 0

    def scrape_once(self) -> Path | None:
        t = time.time()
        try:
            got = read_stat(self._pid())
        except Exception:   # noqa: BLE001 - the server may be gone; counted, never raised in the thread
            got = None
        if got is None:
            self.failed += 1
            return None
        path = self.out_dir / f"{t:.3f}.prom"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(exposition(*got))
        tmp.rename(path)
        self.written += 1
        return path

    def run(self) -> None:
        t0 = time.monotonic()
        k = 0
        while not self._halt.is_set():
            self.scrape_once()
            k = max(k + 1, int((time.monotonic() - t0) / self.interval_s) + 1)
            self._halt.wait(max(0.0, t0 + k * self.interval_s - time.monotonic()))

    def finish(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        self.scrape_once()
