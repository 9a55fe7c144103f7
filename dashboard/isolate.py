"""Parse a user's file in a separate, resource-limited process.

An upload (or a file picked in the data directory) may be huge, malformed or hostile; parsing it
in the server process could exhaust its memory or hang it. :func:`parse_isolated` runs
``mixdiag.collectors.load`` in a child Python with a CPU-time and address-space limit and a
wall-clock timeout, and reads back the Timeline the child saved. Run as ``python -m
mixdiag.dashboard.isolate SOURCE OUTDIR [FORMAT]`` it is that child.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

#: Defaults: generous for a real Nsight export, small enough to protect a laptop.
TIMEOUT_S = 180.0
MEMORY_BYTES = 6 * 1024 ** 3


def _limits(memory_bytes: int, cpu_s: int):
    def apply():  # runs in the child between fork and exec
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    return apply


def parse_isolated(source: str | os.PathLike, fmt: str = "auto", *, timeout_s: float = TIMEOUT_S,
                   memory_bytes: int = MEMORY_BYTES) -> Timeline:
    """The Timeline of ``source`` as ``collectors.load`` reads it, parsed in a child process.

    Raises :class:`UserError` with the child's one-line reason when it fails, runs out of
    time or memory.
    """
    src = Path(source)
    with tempfile.TemporaryDirectory(prefix="mixdiag-parse-") as tmp:
        out = Path(tmp) / "timeline"
        cmd = [sys.executable, "-m", "mixdiag.dashboard.isolate", str(src), str(out), fmt]
        preexec = _limits(memory_bytes, int(timeout_s) + 5) if os.name == "posix" else None
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, preexec_fn=preexec,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise UserError(f"{src.name}: parsing took longer than {timeout_s:.0f} s; stopped") from None
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            reason = lines[-1] if lines else f"parser exited with status {proc.returncode}"
            if proc.returncode < 0 or "MemoryError" in reason:
                reason = f"parser stopped ({reason}); the file may be too large for the memory limit"
            raise UserError(f"{src.name}: {reason.removeprefix('error: ')}")
        return Timeline.load(out)


def _child(argv: list[str]) -> int:
    source, out = argv[0], argv[1]
    fmt = argv[2] if len(argv) > 2 else "auto"
    try:
        from mixdiag import collectors

        tl = collectors.load(source, format=fmt)
        tl.save(out)
    except MemoryError:
        sys.stderr.write("error: out of memory while parsing\n")
        return 3
    except Exception as e:  # the parent shows this one line to the user
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        sys.stderr.write(f"error: {msg}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
