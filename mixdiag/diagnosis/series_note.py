"""What an input without steps or intervals still holds: its gauge/counter series, said in the verdict.

A DP engine's log of only EPLB and KV-transfer lines (or a gauge-only export) has nothing to diagnose per
step, but the operator who handed it in should see what was read - not just "nothing to diagnose"."""
from __future__ import annotations

import pandas as pd

SHOWN = 4  # series listed by name; the rest are counted


def series_note(series: pd.DataFrame | None) -> str:
    """One sentence on the series read (name, range, samples), or "" when there are none."""
    if series is None or not len(series) or not {"name", "value"} <= set(series.columns):
        return ""
    v = pd.to_numeric(series["value"], errors="coerce")
    g = v.groupby(series["name"].astype(str), sort=True).agg(["count", "min", "max"])
    g = g[g["count"] > 0]
    if not len(g):
        return ""
    parts = [f"{name} {_num(r['min'])}" + ("" if r["min"] == r["max"] else f"-{_num(r['max'])}") + f" ({int(r['count'])})"
             for name, r in g.head(SHOWN).iterrows()]
    more = f" and {len(g) - SHOWN} more" if len(g) > SHOWN else ""
    return (f"It holds {int(g['count'].sum())} samples of {len(g)} series without step or interval latency "
            f"(range, samples): {', '.join(parts)}{more}.")


def _num(x: float) -> str:
    return f"{x:.4g}"
