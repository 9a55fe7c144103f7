"""The reference engine's own records: a run directory on disk (the engine's in-process records are its own
to convert, ``mixdiag.engine.core.records.to_timeline``: collectors never import the engine).

A run directory (docs/contracts.md §1) holds the Timeline the engine saved (``steps.parquet``,
``tokens.parquet``, ``series.parquet``, ``meta.json``). ``truth.csv`` is never read here: it is
ground truth for benchmarks and tests, and diagnosis must not see it. The optional side files
(``engine.log``, ``trace.json``, ``metrics.prom``, ``scrapes/``) are other formats; read them
with their own collectors (``mixdiag ingest DIR/trace.json``).
"""
from __future__ import annotations

import os
from pathlib import Path

from mixdiag.collectors.provenance import source_entry
from mixdiag.errors import UserError
from mixdiag.schema import SchemaError, Timeline

FORMAT = "mixdiag-run"
SIDE_FILES = ("engine.log", "trace.json", "metrics.prom", "scrapes")


def is_run_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` is a directory holding any of the files :meth:`Timeline.save` writes
    (a run directory or a saved ingest): the one test of "this is a run" everywhere."""
    d = Path(path)
    return d.is_dir() and any((d / f).exists() for f in Timeline.FILES.values())


def sniff(head: bytes, name: str) -> bool:
    """A run directory (:func:`is_run_dir`)."""
    return is_run_dir(name)


def read(source, *, instance: str | None = None, **options) -> Timeline:
    """Load a run directory; ``instance`` renames its only instance (refused if it has several)."""
    d = Path(os.fspath(source))
    if not d.is_dir():
        raise UserError(f"{d}: not a run directory")
    try:
        tl = Timeline.load(d)
    except SchemaError as e:
        raise UserError(f"{d}: not a readable mixdiag run ({str(e).splitlines()[0]})") from None
    except (OSError, ValueError) as e:  # a cut parquet file or meta.json
        raise UserError(f"{d}: damaged run directory ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    missing = [f for f in Timeline.FILES.values() if not (d / f).exists()]
    notes = [f"{f} missing" for f in missing]
    side = [f for f in SIDE_FILES if (d / f).exists()]
    if side:
        notes.append("also here, read with their own collectors: " + ", ".join(side))
    entry = source_entry(FORMAT, d, total=len(tl.steps) + len(tl.tokens) + len(tl.series),
                         parsed=len(tl.steps) + len(tl.tokens) + len(tl.series), skipped=0,
                         partial=bool(missing), notes=notes, instances=tl.instances)
    meta = dict(tl.meta)
    # Keep any provenance the engine wrote, and add this read.
    meta["sources"] = [s for s in meta.get("sources", []) if isinstance(s, dict)] + [entry]
    tl = Timeline(tl.steps, tl.tokens, tl.series, meta)
    if instance:
        tl = _rename_single(tl, instance, d)
    return tl


def _rename_single(tl: Timeline, instance: str, d: Path) -> Timeline:
    from mixdiag.collectors import rename_instances

    if len(tl.instances) > 1:
        raise UserError(f"{d}: holds instances {', '.join(tl.instances)}; --instance renames only a single one")
    if not tl.instances:
        return tl
    return rename_instances(tl, {tl.instances[0]: instance})
