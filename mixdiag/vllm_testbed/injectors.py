"""Carrying out the timed faults of a :class:`~.fault_plan.FaultPlan` against a running server, and
recording when each really happened (the truth rows of ``DIR/truth/faults.csv``).

Each fault runs in a thread of its own that sleeps until its time, so faults overlap as drawn.
Truth is the measured time of the action (``time.time()`` around ``kill``/``spawn``), never the
planned one: on a busy machine a thread may wake late.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mixdiag.vllm_testbed.fault_plan import TimedFault
from mixdiag.vllm_testbed.process_guard import ProcessGuard

#: A busy loop in a separate interpreter: a noisy neighbour on the server's cores.
_HOG = "while True:\n    pass\n"


@dataclass(frozen=True)
class TruthRow:
    """One injected fault: ``[t_start_s, t_end_s]`` unix seconds, its cause and what was done."""

    t_start_s: float
    t_end_s: float
    cause: str
    detail: str


class FaultRunner:
    """Runs timed faults from ``t0`` (unix seconds) on; :attr:`rows` fills as they happen."""

    def __init__(self, guard: ProcessGuard, t0: float, engine_core_pid: Callable[[], int],
                 start_burst: Callable[[TimedFault, int], object], gc_pause_dir: Path | None = None):
        self.guard, self.t0 = guard, t0
        self._gc_dir = gc_pause_dir
        self._engine_core_pid = engine_core_pid
        self._start_burst = start_burst
        self.rows: list[TruthRow] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._cancel = threading.Event()
        self._stopped = 0   # stalls in progress: overlapping stalls keep the process stopped until the last ends

    def schedule(self, faults: tuple[TimedFault, ...]) -> None:
        """Start one waiting thread per fault."""
        for i, f in enumerate(faults):
            th = threading.Thread(target=self._run_one, args=(f, i), name=f"fault-{f.kind}-{i}", daemon=True)
            th.start()
            self._threads.append(th)

    def _wait_until(self, t_unix: float) -> bool:
        """Sleep until ``t_unix``; False when cancelled first."""
        return not self._cancel.wait(max(0.0, t_unix - time.time()))

    def _record(self, row: TruthRow) -> None:
        with self._lock:
            self.rows.append(row)

    def _run_one(self, f: TimedFault, index: int) -> None:
        if not self._wait_until(self.t0 + f.at_s):
            return
        try:
            if f.kind == "host_stall":
                self._stall(f)
            elif f.kind == "gc_pause":
                self._gc_pause(f)
            elif f.kind == "cpu_hog":
                self._hog(f)
            elif f.kind == "saturation":
                self._start_burst(f, index)   # truth from the burst's own request records
            else:
                raise ValueError(f"unknown timed fault {f.kind!r}")
        except Exception as e:  # a fault that could not be injected is reported, the run goes on
            with self._lock:
                self.errors.append(f"{f.kind} at +{f.at_s:.1f} s: {type(e).__name__}: {e}")

    def _stall(self, f: TimedFault) -> None:
        pid = self._engine_core_pid()
        with self._lock:
            t_stop = time.time()
            if self._stopped == 0:
                os.kill(pid, signal.SIGSTOP)
            self._stopped += 1
        # the kernel's word that the engine stopped: state T in /proc (the stop is delivered at once; the
        # engine's own record stamps can hide it behind a front end draining its backlog)
        state = _proc_state(pid, wait_s=0.05)
        try:
            self._cancel.wait(f.duration_s)
        finally:
            # SIGCONT when the last overlapping stall ends (and even if this thread is interrupted);
            # each row keeps its own span, so the rows' union is when the process was stopped
            with self._lock:
                self._stopped -= 1
                if self._stopped == 0:
                    os.kill(pid, signal.SIGCONT)
                t_cont = time.time()
        self._record(TruthRow(t_stop, t_cont, "host_stall",
                              f"SIGSTOP EngineCore pid={pid} for {t_cont - t_stop:.3f} s (state {state})"))

    def _gc_pause(self, f: TimedFault) -> None:
        """Full collections of the EngineCore's heap for ``f.duration_s`` (vllm_side/sitecustomize.py);
        truth is the engine's own start/end of them, read back from the hook's ``done.log``."""
        if self._gc_dir is None:
            raise RuntimeError("the server was started without the GC-pause hook (ServerConfig.gc_debug)")
        pid = self._engine_core_pid()
        done = self._gc_dir / "done.log"
        with self._lock:   # one pause at a time: the request file is shared
            seen = len(done.read_text().splitlines()) if done.exists() else 0
            (self._gc_dir / "request").write_text(f"{f.duration_s:.6f}\n")
            os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + f.duration_s + 30.0   # a full collection takes ~0.3 s on 2 cores
            lines: list[str] = []
            while time.monotonic() < deadline and not self._cancel.is_set():
                lines = done.read_text().splitlines() if done.exists() else []
                if len(lines) > seen:
                    break
                time.sleep(0.02)
        if len(lines) <= seen:
            raise RuntimeError(f"EngineCore pid={pid} did not report the GC pause (no hook in the process?)")
        got_pid, t_a, t_b, n = lines[seen].split()
        self._record(TruthRow(float(t_a), float(t_b), "host_stall",
                              f"gc pause: {n} full collection(s) in EngineCore pid={got_pid} "
                              f"({float(t_b) - float(t_a):.3f} s, SIGUSR1)"))

    def _hog(self, f: TimedFault) -> None:
        n = int(f.magnitude)
        t_start = time.time()
        procs = [self.guard.popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
        try:
            self._cancel.wait(f.duration_s)
        finally:
            for p in procs:
                self.guard.stop(p, grace_s=2.0)
            t_end = time.time()
        self._record(TruthRow(t_start, t_end, "noisy_neighbour", f"{n} busy-loop process(es) on the server's cores"))

    def join(self, timeout_s: float) -> None:
        """Wait for every fault thread (the ones not due yet are cancelled at ``timeout_s``)."""
        end = time.monotonic() + timeout_s
        for th in self._threads:
            th.join(max(0.0, end - time.monotonic()))
        self.cancel()

    def cancel(self) -> None:
        """Cancel faults not yet started; a stall in progress is continued at once."""
        self._cancel.set()
        for th in self._threads:
            th.join(timeout=10)


def _proc_state(pid: int, wait_s: float) -> str:
    """The process's state letter from /proc/<pid>/stat (``T`` stopped), polled up to ``wait_s`` for ``T``;
    ``?`` when it cannot be read."""
    deadline = time.monotonic() + wait_s
    state = "?"
    while True:
        try:
            raw = open(f"/proc/{pid}/stat").read()
            state = raw[raw.rindex(")") + 2]
        except (OSError, ValueError, IndexError):
            return "?"
        if state in ("T", "t") or time.monotonic() >= deadline:
            return state
        time.sleep(0.002)
