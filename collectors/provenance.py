"""The ``meta["sources"]`` entry every collector writes (docs/contracts.md §4).

One entry per input says how much of it was read, how much could not be, with examples, and
whether the result is partial - so nothing unreadable is dropped silently.
"""
from __future__ import annotations

import os

MAX_EXAMPLES = 5


def source_entry(fmt: str, path, *, total: int, parsed: int, skipped: int, examples=(),
                 partial: bool = False, notes=(), **extra) -> dict:
    """Build one ``meta["sources"]`` entry; ``extra`` adds format-specific JSON-able facts."""
    entry = {
        "format": fmt,
        "path": os.fspath(path) if path is not None else None,
        "lines_total": int(total),
        "lines_parsed": int(parsed),
        "lines_skipped": int(skipped),
        "skipped_examples": [str(e)[:300] for e in list(examples)[:MAX_EXAMPLES]],
        "partial": bool(partial),
        "notes": [str(n) for n in notes],
    }
    entry.update(extra)
    return entry
