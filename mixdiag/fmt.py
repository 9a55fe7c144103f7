"""The one place latencies become text: milliseconds for reports, tables and CLI lines.

Stdlib only, so every layer (reports, commands, dashboard) can use it without pulling anything in.
A missing value (None, NaN, inf) is always written ``-``: a report never prints ``nan ms``.
"""
from __future__ import annotations

import math


def ms(seconds, digits: int = 1, unit: str = " ms") -> str:
    """``seconds`` as milliseconds with ``digits`` decimals and ``unit`` ('12.3 ms'); '-' when missing.

    ``unit=""`` for table cells whose header already says ms.
    """
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.{digits}f}{unit}"


def duration(seconds) -> str:
    """A latency in the unit that reads best: '12.3 ms' below one second, '1.20 s' from it; '-' when missing."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return ms(seconds) if abs(seconds) < 1 else f"{seconds:.2f} s"
