"""NVTX ranges (and mirrored Kineto ``record_function`` ranges) for the engine's phases.

:class:`NvtxTracer` implements the engine's ``Tracer`` seam: ``tracer.range(name, message=None,
payload=None)`` returns a context manager around one phase. Naming follows docs/contracts.md §2
and docs/instrumentation.md: domain ``mixdiag``; the range text is ``message`` when given (the
``step`` range's ``step <n> kind=... graph=...``, ``attn L<i>``) else ``name``; the integer payload
(total scheduled tokens for ``step``) rides as an NVTX int64 payload; the category is the phase
(:data:`CATEGORIES`).

Cost: NVTX tools inject themselves at process start (``nsys`` sets ``NVTX_INJECTION64_PATH``), and
the ``nvtx`` package hands out a dummy domain when none is attached. With neither an NVTX tool nor
an active PyTorch profiler, :meth:`NvtxTracer.range` returns one shared no-op context manager
after a single ~40 ns check, so instrumentation stays on by default.
"""
from __future__ import annotations

import contextlib
from typing import Any

import nvtx as nvtx_lib
import torch
from torch.autograd.profiler import record_function

from mixdiag import wire
from mixdiag.wire import DOMAIN


#: Phase category of each range name; ranges not listed fall in "other".
CATEGORIES: dict[str, str] = {
    wire.STEP: "step",
    wire.SCHEDULE: "host",
    wire.PREPARE_INPUTS: "host",
    wire.SAMPLE: "host",
    wire.FORWARD: "forward",
    wire.ATTN: "forward",
    wire.MOE: "forward",
    wire.KV_TRANSFER: "transfer",
    wire.STEP_STATS: "step",
}

#: ARGB colours per category, so Nsight's timeline separates phases at a glance.
COLORS: dict[str, int] = {
    "step": 0xFF4C72B0,
    "host": 0xFFDD8452,
    "forward": 0xFF55A868,
    "transfer": 0xFFC44E52,
    "other": 0xFF8C8C8C,
}

_NULL = contextlib.nullcontext()
_profiler_enabled = torch._C._autograd._profiler_enabled


def range_text(name: str, message: str | None = None) -> str:
    """The text an NVTX/Kineto range carries: the message when given, else the name."""
    return message if message else name


def step_message(step: int, kind: str, prefill_tokens: int, decode_reqs: int, decode_rows: int,
                 graph: str, **extra: Any) -> str:
    """The ``step`` range message of contracts §2 (:func:`mixdiag.wire.format_step`)."""
    return wire.format_step(step, kind, prefill_tokens, decode_reqs, decode_rows, graph, **extra)


class _NvtxRange:
    """push on enter, pop on exit (and the mirrored record_function when Kineto records)."""

    __slots__ = ("_domain", "_attrs", "_kineto")

    def __init__(self, domain, attrs, kineto):
        self._domain = domain
        self._attrs = attrs
        self._kineto = kineto

    def __enter__(self):
        if self._attrs is not None:
            self._domain.push_range(self._attrs)
        if self._kineto is not None:
            self._kineto.__enter__()
        return self

    def __exit__(self, *exc):
        if self._kineto is not None:
            self._kineto.__exit__(*exc)
        if self._attrs is not None:
            self._domain.pop_range()
        return False


class NvtxTracer:
    """A ``Tracer``: NVTX push/pop ranges in domain ``mixdiag`` plus Kineto ``record_function``.

    ``domain`` is the ``nvtx`` domain object to emit into (default: ``nvtx.get_domain("mixdiag")``,
    a dummy when no NVTX tool is attached); ``kineto=False`` stops mirroring into the PyTorch
    profiler, ``nvtx=False`` keeps only the Kineto mirror (``--no-nvtx`` with ``--profile``);
    ``enabled=False`` makes every range a no-op.
    """

    def __init__(self, domain=None, *, nvtx: bool = True, kineto: bool = True, enabled: bool = True):
        self.enabled = enabled
        self.kineto = kineto and enabled
        self._domain = None
        if enabled and nvtx:
            d = nvtx_lib.get_domain(DOMAIN) if domain is None else domain
            # nvtx gives a DummyDomain (no handle) when no tool is attached: treat as off.
            self._domain = d if hasattr(d, "push_range") and not _is_dummy(d) else None
        self._fixed: dict[str, Any] = {}  # text -> EventAttributes for payload-less fixed names

    @property
    def nvtx_active(self) -> bool:
        """True when an NVTX tool (e.g. Nsight Systems) receives the ranges."""
        return self._domain is not None

    def recording(self) -> bool:
        """True when a range opened now reaches an NVTX tool or an active PyTorch profiler."""
        return self._domain is not None or (self.kineto and _profiler_enabled())

    def range(self, name: str, message: str | None = None, payload: int | None = None):
        """Context manager around one phase; see the module docstring for the naming."""
        kineto = self.kineto and _profiler_enabled()
        if self._domain is None and not kineto:
            return _NULL
        text = message if message else name
        attrs = self._attributes(name, text, payload) if self._domain is not None else None
        return _NvtxRange(self._domain, attrs, record_function(text) if kineto else None)

    def _attributes(self, name: str, text: str, payload: int | None):
        if payload is None and message_is_fixed(name, text):
            attrs = self._fixed.get(text)
            if attrs is None:
                attrs = self._fixed[text] = self._make(name, text, None)
            return attrs
        return self._make(name, text, None if payload is None else int(payload))

    def _make(self, name: str, text: str, payload: int | None):
        cat = CATEGORIES.get(name, "other")
        return self._domain.get_event_attributes(message=text, color=COLORS[cat], category=cat, payload=payload)


def message_is_fixed(name: str, text: str) -> bool:
    """Texts that repeat every step (phase names, ``attn L3``) are cached; step messages are not."""
    return name not in wire.VARIABLE_RANGES


def _is_dummy(domain) -> bool:
    return type(domain).__name__ == "DummyDomain"
