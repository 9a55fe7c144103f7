"""The columnar fast path for vLLM ``Iteration(N): ...`` lines (a 10-minute log holds a million).

The text is split into lines and matched by one RE2 pattern in Arrow (C++), and the captured
fields become numpy columns at once; no Python object is made per Iteration line. The pattern is
a strict subset of what the per-line walk in :mod:`vllm_log` reads: plain or process-tagged
prefix, ASCII digits, the Iteration text right after the prefix and nothing after it. Every other
line (docker-stamped, coloured, with undecodable bytes, ``Engine N:`` keys, trailing text,
SchedulerIterationDetails, stats...) stays with the per-line walk, which gets the line numbers of
the fast lines to keep its state (clock year, last time, an open CUDA-graph table) exact.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Digits are ASCII and counts at most 15 of them, so every value converts exactly (int64, float64
# below 2**53, fractions as n / 10**k); a line outside this shape is read by the per-line walk.
_N = "[0-9]{1,15}"
FAST_ITERATION = (
    r"^(?:\((?P<proc>[A-Za-z0-9_.:-]+) pid=[0-9]+\) +)?[A-Z]+ (?P<mo>[0-9]{2})-(?P<d>[0-9]{2}) "
    r"(?P<h>[0-9]{2}):(?P<mi>[0-9]{2}):(?P<s>[0-9]{2})(?:\.(?P<frac>[0-9]{1,9}))? \[?[A-Za-z0-9_.]+:[0-9]+\] ?"
    rf"Iteration\((?P<n>{_N})\): (?P<cr>{_N}) context requests, (?P<ct>{_N}) context tokens, "
    rf"(?P<gr>{_N}) generation requests, (?P<gt>{_N}) generation tokens, "
    rf"iteration elapsed time: (?P<ms>{_N}(?:\.{_N})?) ms\r?$")
_DP = re.compile(r"_DP(\d+)")


@dataclass
class SplitLines:
    """A log's lines: those for the per-line walk, and the fast Iteration lines as columns."""

    n: int                       # lines in the text
    slow: list[str]              # per-line walk, in line order (a final ``\\r`` taken off)
    slow_ln: np.ndarray          # their line numbers
    fast_ln: np.ndarray          # line numbers of the fast Iteration lines
    fast: dict[str, np.ndarray]  # their columns: mo, d, h, mi, s, frac_s, key, n, cr, ct, gr, gt, elapsed_s


#: Characters matched per Arrow call: the text is split a chunk at a time (at a newline), so its
#: lines and captures never exist whole beside it (a 10-minute log is 200 MB).
CHUNK_CHARS = 8 << 20
_FIELDS = ("mo", "d", "h", "mi", "s", "n", "cr", "ct", "gr", "gt")


def split(text: str | bytes, fast: bool = True) -> SplitLines:
    """Split like :func:`text_input.split_lines` (``text``: str, or ASCII bytes); with ``fast``, Iteration
    lines come back as columns."""
    nl = b"\n" if isinstance(text, bytes) else "\n"
    buf = pa.py_buffer(text) if isinstance(text, bytes) else None
    n, slow, slow_ln, fast_ln, parts = 0, [], [], [], []
    keys: dict[str | None, str] = {}
    start = 0
    while start < len(text):
        end = text.find(nl, start + CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        if buf is not None:  # ASCII: Arrow reads the bytes in place
            chunk = pa.Array.from_buffers(pa.large_string(), 1, [None, pa.array([0, end - start], pa.int64()).buffers()[1],
                                                                 buf.slice(start, end - start)])
        else:
            chunk = pa.array([text[start:end]], pa.large_string())
        lines = pc.list_flatten(pc.split_pattern(chunk, "\n"))
        if text[end - 1:end] == nl:  # a chunk ends at a newline: no line after it
            lines = lines.slice(0, len(lines) - 1)
        start = end
        if not fast:
            slow += lines.to_pylist()
            slow_ln.append(np.arange(n, n + len(lines)))
            n += len(lines)
            continue
        m = pc.extract_regex(lines, FAST_ITERATION)
        mask = m.is_valid()
        is_fast = mask.to_numpy(zero_copy_only=False)
        slow += lines.filter(pc.invert(mask)).to_pylist()
        slow_ln.append(n + np.flatnonzero(~is_fast))
        fast_ln.append(n + np.flatnonzero(is_fast))
        n += len(lines)
        parts.append(_columns(m.filter(mask), keys))
    fast_cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}
    cat = (lambda a: np.concatenate(a) if a else np.zeros(0, np.int64))
    return SplitLines(n, _strip_cr(slow), cat(slow_ln), cat(fast_ln), fast_cols)


def _columns(cap: pa.StructArray, keys: dict) -> dict[str, np.ndarray]:
    """The captured fields of one chunk's fast lines as numpy columns (values exact, see above)."""
    col = {name: cap.field(name) for name in ("proc", "frac", "ms") + _FIELDS}
    out = {name: pc.cast(col[name], pa.int64()).to_numpy() for name in _FIELDS}
    # float(x) / 1e3 per line in the walk; Arrow's string -> float64 is correctly rounded, as float() is
    out["elapsed_s"] = pc.cast(col["ms"], pa.float64()).to_numpy() / 1e3
    digits = pc.utf8_length(col["frac"]).to_numpy()
    num = pc.cast(pc.if_else(pc.equal(col["frac"], ""), "0", col["frac"]), pa.int64()).to_numpy()
    # float("0." + frac) is the double nearest num / 10**k, and so is this one IEEE division
    out["frac_s"] = num.astype(np.float64) / np.power(10.0, digits)
    procs = pc.dictionary_encode(col["proc"])
    names = procs.dictionary.to_pylist()
    for p in names:
        if p not in keys:
            keys[p] = _proc_key(p)
    out["key"] = np.array([keys[p] for p in names] or ["0"], dtype=object)[procs.indices.to_numpy(zero_copy_only=False)]
    return out


def _strip_cr(lines: list[str]) -> list[str]:
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _proc_key(proc: str | None) -> str:
    """The engine key of a process tag (``EngineCore_DP3`` -> ``3``), as the per-line walk finds it."""
    dp = _DP.search(proc or "")
    return str(int(dp.group(1))) if dp else "0"
