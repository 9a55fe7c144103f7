"""The strict scoring rule of accuracy tier (g): a spike's named cause against what the real engine
recorded (docs/analyze.md, "Tier (g)"). Only benchmarks and tests use it; ``analyze`` never does.

Truth units, each a time window in unix seconds:
- ``mixing``: one per vLLM iteration with >= ``MIXING_MIN_PROMPT_TOKENS`` context tokens and at
  least one generation request (a mixed step carrying a real prompt chunk), from
  ``truth/iterations.log``;
- ``host_stall``: one per injected stall (SIGSTOP..SIGCONT, or a GC pause as the engine timed it:
  ``truth/faults.csv``) that held decodes: the first iteration logged after it ended ran generation
  requests (they waited through it; a stall while only a prompt was computed delays a first token, no ITL);
- ``kv_pressure``: one per scrape interval in which ``vllm:num_preemptions_total`` rose (the
  engine's own counter; iterations.log has no preemption field).

A spike naming one of those causes is right when its window overlaps a unit of that cause; any
other named cause is a false positive; ``unknown`` is counted and neither right nor wrong.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

from mixdiag.vllm_testbed.truth import read_faults, read_iterations

#: a chunk this large costs >= 8x a decode step on the testbed's model (docs/testbed-vllm.md); a
#: few short prompts admitted together stay below it
MIXING_MIN_PROMPT_TOKENS = 256
#: the iteration stamp is when the API server logged the record, typically 1-50 ms after the step
#: ended (docs/testbed-vllm.md): the step is taken to have run in [stamp - elapsed - lag, stamp]
LOG_LAG_S = 0.05
SCORED_CAUSES = ("mixing", "host_stall", "kv_pressure")
UNKNOWN = "unknown"
_PREEMPT = re.compile(r"^vllm:num_preemptions_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)")


@dataclass(frozen=True)
class Unit:
    """One truth unit: ``cause`` happened in [t0_s, t1_s]."""

    cause: str
    t0_s: float
    t1_s: float


@dataclass(frozen=True)
class Call:
    """One spike as judged: its window, the cause it was named, and whether that was right
    (None for ``unknown``)."""

    t0_s: float
    t1_s: float
    cause: str
    right: bool | None


def overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    """Closed windows overlap (a zero-length window touching another counts)."""
    return a0 <= b1 and b0 <= a1


def mixing_units(iterations_log: Path) -> list[Unit]:
    """The mixed iterations with a prompt chunk of >= MIXING_MIN_PROMPT_TOKENS."""
    return [Unit("mixing", it.t_s - it.elapsed_s - LOG_LAG_S, it.t_s)
            for it in read_iterations(iterations_log)
            if it.context_tokens >= MIXING_MIN_PROMPT_TOKENS and it.generation_requests > 0 and not it.dummy]


def small_mixed_units(iterations_log: Path) -> list[Unit]:
    """Mixed iterations whose prompt work is below the threshold (short prompts joining decodes):
    not truth, only to tell a threshold miss from a call with no mixed step at all."""
    return [Unit("small_mixed", it.t_s - it.elapsed_s - LOG_LAG_S, it.t_s)
            for it in read_iterations(iterations_log)
            if 0 < it.context_tokens < MIXING_MIN_PROMPT_TOKENS and it.generation_requests > 0 and not it.dummy]


def stall_units(faults_csv: Path, iterations_log: Path | None = None) -> list[Unit]:
    """Every injected host stall as measured (stop..continue, or the GC pause's own timing); with
    ``iterations_log``, only those that held decodes (the module doc)."""
    rows = [r for r in read_faults(faults_csv) if r.cause == "host_stall"]
    if iterations_log is not None:
        its = sorted(read_iterations(iterations_log), key=lambda it: it.t_s)
        stamps = [it.t_s for it in its]
        keep = []
        for r in rows:
            i = bisect.bisect_right(stamps, r.t_end_s)
            if i < len(its) and its[i].generation_requests > 0:
                keep.append(r)
        rows = keep
    return [Unit("host_stall", r.t_start_s, r.t_end_s) for r in rows]


def preemption_units(scrapes: Path) -> list[Unit]:
    """Scrape intervals (named by send time) in which the engine's preemption counter rose."""
    series = []
    for p in sorted(scrapes.glob("*.prom"), key=lambda p: float(p.stem)):
        total = None
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            m = _PREEMPT.match(line)
            if m:
                total = (total or 0.0) + float(m.group(1))
        if total is not None:
            series.append((float(p.stem), total))
    return [Unit("kv_pressure", t0, t1) for (t0, v0), (t1, v1) in zip(series, series[1:]) if v1 > v0]


def truth_units(run: Path) -> list[Unit]:
    """All truth units of one testbed run directory."""
    its = run / "truth" / "iterations.log"
    return (mixing_units(its) + stall_units(run / "truth" / "faults.csv", its)
            + preemption_units(run / "scrapes"))


def judge(spikes: list[tuple[float, float, str]], units: list[Unit]) -> list[Call]:
    """Each spike ``(t_start_s, t_end_s, cause)`` judged by the strict rule."""
    out = []
    for t0, t1, cause in spikes:
        if cause == UNKNOWN:
            out.append(Call(t0, t1, cause, None))
            continue
        hit = any(u.cause == cause and overlaps(t0, t1, u.t0_s, u.t1_s) for u in units)
        out.append(Call(t0, t1, cause, hit))
    return out


def tally(calls: list[Call], units: list[Unit]) -> dict[str, dict[str, int]]:
    """Per cause: calls, right calls, truth units, truth units some right call of that cause
    overlaps (recall's numerator). Causes named but never true appear with 0 units."""
    causes = {c.cause for c in calls if c.cause != UNKNOWN} | {u.cause for u in units}
    out = {}
    for cause in sorted(causes):
        mine = [c for c in calls if c.cause == cause]
        cu = [u for u in units if u.cause == cause]
        found = sum(any(overlaps(c.t0_s, c.t1_s, u.t0_s, u.t1_s) for c in mine) for u in cu)
        out[cause] = {"called": len(mine), "right": sum(bool(c.right) for c in mine), "units": len(cu),
                      "found": found}
    return out


def prf(t: dict[str, int]) -> tuple[float | None, float | None, float | None]:
    """(precision, recall, F1) of one cause's tally; None where undefined (nothing called / no truth)."""
    p = t["right"] / t["called"] if t["called"] else None
    r = t["found"] / t["units"] if t["units"] else None
    if p is None and r is None:
        return None, None, None
    f = 2 * p * r / (p + r) if p is not None and r is not None and p + r > 0 else 0.0
    return p, r, f


def macro_f1(tallies: dict[str, dict[str, int]]) -> float | None:
    """Mean F1 over every cause with truth units or calls (a cause named but never true scores 0)."""
    f1s = [prf(t)[2] for t in tallies.values() if t["units"] or t["called"]]
    return sum(f1s) / len(f1s) if f1s else None


def merge(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Sum two tallies (runs of one view)."""
    out = {k: dict(v) for k, v in a.items()}
    for cause, t in b.items():
        cur = out.setdefault(cause, {k: 0 for k in t})
        for k, v in t.items():
            cur[k] += v
    return out
