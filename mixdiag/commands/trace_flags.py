"""``--step-gap-ms`` and ``--step-range NAME``: how trace collectors find steps; shared by ingest and analyze."""
from __future__ import annotations

from mixdiag.errors import UserError


def add_step_flags(p) -> None:
    """Add the two step-finding flags to a verb's parser."""
    p.add_argument("--step-gap-ms", type=float, default=None,
                   help="trace collectors without step ranges: GPU idle gap that separates steps "
                        "(default: from the trace's own gap distribution)")
    p.add_argument("--step-range", default=None, metavar="NAME",
                   help="trace collectors: treat ranges of this name on the engine thread as steps")


def step_options(args) -> dict:
    """Collector options from the flags (only those given)."""
    out = {}
    gap = getattr(args, "step_gap_ms", None)
    if gap is not None:
        if not gap > 0:
            raise UserError("--step-gap-ms must be > 0")
        out["step_gap_s"] = gap / 1e3
    name = getattr(args, "step_range", None)
    if name is not None:
        if not name.strip():
            raise UserError("--step-range needs a range name")
        out["step_range"] = name.strip()
    if getattr(args, "quiet", False) or getattr(args, "json", False):
        out["progress"] = False  # long trace ingests draw a bar on stderr otherwise (terminals only)
    return out
