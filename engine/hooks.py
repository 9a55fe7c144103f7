"""Extension points: the ``Tracer`` seam (NVTX / profiler ranges), no-op by default.

The engine opens ``schedule``, ``prepare_inputs``, ``forward``, ``sample`` and ``step`` ranges and the
model opens ``attn L<i>`` / ``moe L<i>`` per layer (names as docs/contracts.md §2). A tracer that
records nothing must cost next to nothing: :class:`NullTracer` hands back one shared
``nullcontext``. :func:`step_stats_message` builds the ``step_stats`` range text here, so the core
reaches telemetry only through this seam.

An engine-level module (beside :mod:`mixdiag.engine.config`): core and model both import it, it imports
neither. May import: the standard library, mixdiag.wire.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Protocol, runtime_checkable

from mixdiag import wire

_NULL = contextlib.nullcontext()


@runtime_checkable
class Tracer(Protocol):
    """Opens a named range around a phase; ``payload`` is an integer (e.g. scheduled tokens)."""

    def range(self, name: str, message: str | None = None, payload: Any = None) -> ContextManager: ...

    def recording(self) -> bool:
        """True when a range opened now is recorded (callers skip building costly messages otherwise)."""
        ...


class NullTracer:
    """The default tracer: every range is the same no-op context manager."""

    def range(self, name: str, message: str | None = None, payload: Any = None) -> ContextManager:
        return _NULL

    def recording(self) -> bool:
        return False


class RecordingTracer:
    """Keeps (name, message, payload) of every range opened, in order; for tests and debugging."""

    def __init__(self):
        self.ranges: list[tuple[str, str | None, Any]] = []

    def range(self, name: str, message: str | None = None, payload: Any = None) -> ContextManager:
        self.ranges.append((name, message, payload))
        return _NULL

    def recording(self) -> bool:
        return True


NULL_TRACER = NullTracer()


def step_stats_message(rec) -> str:
    """The ``step_stats`` range message of contracts §2 for a finished :class:`StepRecord`.

    ``expert_imbalance``/``per_rank_tokens`` only when the step measured them (EP active).
    """
    return wire.format_step_stats(rec.step, rec.preempted_reqs, rec.kv_transfer_bytes,
                                  rec.expert_imbalance, rec.per_rank_tokens)
