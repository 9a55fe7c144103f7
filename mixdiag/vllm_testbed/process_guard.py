"""Every process the testbed starts, and their end on exit, exception, Ctrl+C or SIGTERM.

Each child runs in a session (and process group) of its own, so one ``killpg`` reaches what it
spawned too (``vllm serve`` starts its EngineCore and worker in its group). Stopping a group sends
SIGCONT first - a host-stall fault may have left the EngineCore SIGSTOPped, and a stopped process
would hold SIGTERM until continued - then SIGTERM, then SIGKILL after a grace period.

:class:`ProcessGuard` is a context manager: on leaving it (normally or by an exception) and from
``atexit`` it stops every group it started; while it is active, SIGTERM and SIGHUP raise
``SystemExit`` in the main thread so the same cleanup runs (Ctrl+C raises KeyboardInterrupt already).
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import time


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Continue, terminate, then kill ``proc``'s process group; reap ``proc``."""
    pgid = proc.pid   # start_new_session=True: the child leads its own group
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # children of the group may outlive its leader: kill what is left either way
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class ProcessGuard:
    """Starts children in their own process groups and stops them all when done."""

    def __init__(self):
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._old_handlers: dict[int, object] = {}

    def popen(self, args: list[str], **kw) -> subprocess.Popen:
        """``subprocess.Popen`` in a new session, remembered for cleanup."""
        proc = subprocess.Popen(args, start_new_session=True, **kw)
        with self._lock:
            self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace_s: float = 15.0) -> None:
        """Stop one child's group now."""
        stop_group(proc, grace_s)
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)

    def stop_all(self) -> None:
        """Stop every group still running, the newest first (load before server)."""
        with self._lock:
            procs, self._procs = self._procs[::-1], []
        for p in procs:
            stop_group(p)

    def _on_signal(self, signum, frame):
        raise SystemExit(128 + signum)

    def __enter__(self) -> "ProcessGuard":
        atexit.register(self.stop_all)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop_all()
        finally:
            for sig, old in self._old_handlers.items():
                signal.signal(sig, old)
            self._old_handlers.clear()
            atexit.unregister(self.stop_all)


def wait_until(pred, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Poll ``pred()`` until it is true or ``timeout_s`` passed; returns its last value."""
    end = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)
