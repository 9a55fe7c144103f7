"""``--profile START:STOP``: a PyTorch-profiler (Kineto) trace of a window of engine steps.

:class:`ProfileWindow` is an engine observer. It starts ``torch.profiler`` once the step before
``START`` has ended (at once when ``START`` is the first step) and stops after step ``STOP - 1``
(half-open window ``[START, STOP)``; ``START:`` or ``all`` run to the end of the run), then writes the Chrome-trace JSON to ``DIR/trace.json``.
While it records, :class:`~mixdiag.engine.telemetry.nvtx_tracer.NvtxTracer` opens ``record_function``
ranges with the NVTX strings (``step <n> kind=...``, ``schedule``, ``attn L<i>`` ...), so the
trace carries the same ranges an Nsight capture would. A run that ends inside the window still
writes what was recorded (:attr:`ProfileWindow.partial` is then true). ``ops=False``
(``--profile-light``) keeps only the ranges and device activity: a CPU trace of the tiny model
holds ~850 KB of per-operator events per step, too much for whole-run traces.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from mixdiag.errors import UserError

_SPEC = re.compile(r"^\s*(\d+)\s*:\s*(\d*)\s*$")


def parse_window(spec: str) -> tuple[int, int | None]:
    """``"20:60"`` -> ``(20, 60)``: steps 20..59; ``"20:"`` -> ``(20, None)`` and ``"all"`` ->
    ``(0, None)``: to the end of the run. Raises UserError on anything else."""
    if (spec or "").strip().lower() == "all":
        return 0, None
    m = _SPEC.match(spec or "")
    if not m:
        raise UserError(f"--profile expects START:STOP step numbers (e.g. 20:60, 20: or all), got {spec!r}")
    start, stop = int(m.group(1)), (int(m.group(2)) if m.group(2) else None)
    if stop is not None and stop <= start:
        raise UserError(f"--profile window {spec!r} is empty: STOP must be greater than START")
    return start, stop


class ProfileWindow:
    """Record a Kineto trace of steps ``[start, stop)`` into ``path`` (refuses an existing file)."""

    def __init__(self, start: int, stop: int | None, path: str | Path, cuda: bool | None = None, *,
                 ops: bool = True):
        if start < 0 or (stop is not None and stop <= start):
            raise UserError(f"profile window [{start}, {stop}) is empty or negative")
        self.start, self.stop = start, stop
        self.path = Path(path)
        if self.path.exists():
            raise UserError(f"{self.path} already exists; choose another run directory")
        cuda = torch.cuda.is_available() if cuda is None else cuda
        self._activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.ops = ops  # False: drop per-operator (cpu_op) events at export, keep ranges and GPU work
        self._prof: profile | None = None
        self.steps_recorded: list[int] = []
        self.written: Path | None = None
        self.partial = False

    @property
    def recording(self) -> bool:
        return self._prof is not None

    def begin(self, first_step: int = 0) -> None:
        """Call before the engine's first step: starts at once when the window opens there."""
        if self._inside(first_step) and not self.recording and self.written is None:
            self._start()

    def __call__(self, record: Any) -> None:
        self.observe_step(record)

    def observe_step(self, record: Any) -> None:
        """After each step: note it if inside the window; start or stop at the window's edges."""
        step = int(record.step)
        if self.recording and self._inside(step):
            self.steps_recorded.append(step)
        if self.recording and self.stop is not None and step >= self.stop - 1:
            self._finish(partial=False)
        elif not self.recording and self.written is None and self._inside(step + 1):
            self._start()

    def _inside(self, step: int) -> bool:
        return self.start <= step and (self.stop is None or step < self.stop)

    def _start(self) -> None:
        self._prof = profile(activities=self._activities, record_shapes=False, with_stack=False)
        self._prof.__enter__()

    def _finish(self, partial: bool) -> None:
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))
        if not self.ops:
            _drop_cpu_ops(self.path)
        self.written, self.partial = self.path, partial

    def close(self) -> Path | None:
        """End of run: stop a window still open and write it (partial unless open-ended)."""
        if self.recording:
            self._finish(partial=self.stop is not None)
        return self.written


def _drop_cpu_ops(path: Path) -> None:
    """Rewrite a Chrome trace without its ``cpu_op`` events (~99 % of a CPU trace's size)."""
    doc = json.loads(path.read_text())
    doc["traceEvents"] = [e for e in doc.get("traceEvents", []) if e.get("cat") != "cpu_op"]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
