"""Output conventions shared by every CLI verb.

* ``--json``: exactly one JSON document on stdout, nothing else (progress and logs go to stderr).
* human output otherwise; ``-q`` silences progress and notes, ``-v`` adds detail.
* progress bars (tqdm, on stderr) for work longer than a second or two.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterable, TypeVar

T = TypeVar("T")


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null, numpy scalars as Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_text(data: Any) -> str:
    """``data`` as the JSON text ``--json`` prints (NaN/inf as null, numpy scalars as numbers), newline-ended.

    The text is ``json.dumps(_clean(data), indent=2, allow_nan=False)``, byte for byte, built by
    :func:`_indented` in one pass: with ``indent`` the json module encodes in Python generators (its C
    encoder is compact only), ~1 s for the 20 000 spikes of a 10-minute log, and ``_clean`` copied the
    whole document before that."""
    parts: list[str] = []
    _indented(data, 0, parts)
    parts.append("\n")
    return "".join(parts)


_esc = json.encoder.encode_basestring_ascii  # what json.dumps (ensure_ascii) writes a str with
_INDENT = ["\n" + "  " * i for i in range(64)]


def _indented(obj: Any, level: int, parts: list[str]) -> None:
    """Append to ``parts`` the text ``json.dumps(_clean(obj), indent=2, allow_nan=False)`` writes for
    ``obj`` nested ``level`` deep. Plain dicts, lists, tuples, str, int, float, bool and None are written
    here as the json module writes them; any other object (numpy scalars, subclasses) goes through
    ``_clean`` and ``json.dumps`` itself, its newlines indented to ``level``."""
    t = type(obj)
    if t is str:
        parts.append(_esc(obj))
    elif t is float:
        parts.append(float.__repr__(obj) if math.isfinite(obj) else "null")
    elif t is int:
        parts.append(int.__repr__(obj))
    elif obj is None:
        parts.append("null")
    elif obj is True:
        parts.append("true")
    elif obj is False:
        parts.append("false")
    elif t is dict and len(obj) and level + 1 < len(_INDENT):
        inner = _INDENT[level + 1]
        sep = "{" + inner
        for k, v in obj.items():
            parts.append(sep)
            parts.append(_esc(str(k)))
            parts.append(": ")
            _indented(v, level + 1, parts)
            sep = "," + inner
        parts.append(_INDENT[level] + "}")
    elif (t is list or t is tuple) and len(obj) and level + 1 < len(_INDENT):
        inner = _INDENT[level + 1]
        sep = "[" + inner
        for v in obj:
            parts.append(sep)
            _indented(v, level + 1, parts)
            sep = "," + inner
        parts.append(_INDENT[level] + "]")
    else:
        text = json.dumps(_clean(obj), indent=2, sort_keys=False, allow_nan=False)
        parts.append(text.replace("\n", _INDENT[level]) if level else text)


class Console:
    """Where a verb writes: one JSON document, or human lines; notes and progress on stderr."""

    def __init__(self, json_mode: bool = False, verbosity: int = 0, stream=None, err=None):
        self.json_mode = json_mode
        self.verbosity = verbosity  # -1 quiet, 0 normal, >0 verbose
        self.out = stream or sys.stdout
        self.err = err or sys.stderr

    def result(self, human: str | None, data: Any) -> None:
        """Print the verb's result: ``data`` as JSON in --json mode, else ``human``."""
        if self.json_mode:
            # one write: json.dump would write each token (millions for 20 000 spikes)
            self.out.write(json_text(data))
        elif human is not None:
            self.out.write(human.rstrip("\n") + "\n")
        self.out.flush()

    def note(self, msg: str, level: int = 0) -> None:
        """A side remark on stderr, shown when verbosity >= level."""
        if self.verbosity >= level:
            self.err.write(msg.rstrip("\n") + "\n")

    def progress(self, iterable: Iterable[T] | None = None, total: int | None = None, desc: str = "",
                 unit: str = "it"):
        """A tqdm progress bar on stderr (disabled with -q); use as iterator or context manager."""
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, file=self.err,
                    disable=self.verbosity < 0, leave=False, dynamic_ncols=True, mininterval=0.5)
