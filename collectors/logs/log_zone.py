"""A log's local wall clock placed beside the unix-clock inputs of the same run.

vLLM (``logging``'s asctime) and SGLang print the server's local time without a zone, and the readers
take it as UTC (:func:`~mixdiag.collectors.logs.log_lines.naive_to_unix`). On a server whose clock is
not UTC - a bare-metal host in UTC+8 - the log then lies hours away from its own scrapes, traces or
client records: the join sees two servers and no log evidence reaches the scrape intervals.

When a zone-less log (``meta["clock_zone"] == "naive"``) overlaps none of the unix-clock inputs read
with it, its zone is inferred:

- zones are whole quarter hours from UTC-12 to UTC+14 (every zone in use is one);
- a zone is a candidate when it makes the log's span overlap a unix-clock input's span by at least
  half the shorter of the two;
- among the candidates, the one whose running-request counts agree best with theirs at matched times
  (median absolute difference; vLLM's stats line and SGLang's batch lines print them, both engines
  expose them in ``/metrics``) - or the only candidate, when no counts are shared;
- several candidates and nothing to tell them apart: the log is left as read, and a note says so.

A log that already overlaps a unix-clock input is left alone (a UTC server, a container's clock).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from mixdiag.schema import Timeline

QUARTER_HOUR_S = 900
ZONES_S = [k * QUARTER_HOUR_S for k in range(-12 * 4, 14 * 4 + 1)]
MIN_OVERLAP = 0.5
#: log rows matched to a unix-clock row at most this far apart (a vLLM stats line covers 10 s)
MATCH_S = 5.0
MIN_MATCHED = 3


def _span(tl: Timeline) -> tuple[float, float] | None:
    ts = []
    for frame, cols in ((tl.steps, ("t_start_s", "t_end_s")), (tl.series, ("t_s",)), (tl.tokens, ("t_s",))):
        for c in cols:
            if frame is not None and len(frame) and c in frame:
                v = frame[c].to_numpy(dtype=float)
                v = v[np.isfinite(v)]
                if len(v):
                    ts += [float(v.min()), float(v.max())]
    return (min(ts), max(ts)) if ts else None


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Overlap of two spans as a share of the shorter (spans under a second count as one second)."""
    inter = min(a[1], b[1]) - max(a[0], b[0])
    if inter < 0:
        return 0.0
    return min(1.0, max(inter, 1e-9) / max(min(a[1] - a[0], b[1] - b[0]), 1.0))


def _running(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(end times, running requests) of the rows that report them, in time order."""
    s = tl.steps
    if s is None or not len(s) or "running_reqs" not in s:
        return np.zeros(0), np.zeros(0)
    t, r = s["t_end_s"].to_numpy(dtype=float), s["running_reqs"].to_numpy(dtype=float)
    ok = np.isfinite(t) & np.isfinite(r)
    o = np.argsort(t[ok], kind="stable")
    return t[ok][o], r[ok][o]


def _disagreement(log: tuple[np.ndarray, np.ndarray], refs: list[tuple[np.ndarray, np.ndarray]],
                  shift: float) -> float:
    """Median |running(log) - running(ref)| over log rows matched within MATCH_S; inf if too few."""
    diffs = []
    lt, lr = log
    for rt, rr in refs:
        if not len(rt):
            continue
        t = lt - shift
        i = np.clip(np.searchsorted(rt, t), 1, len(rt) - 1) if len(rt) > 1 else np.zeros(len(t), int)
        j = i - 1 if len(rt) > 1 else i
        near = np.where(np.abs(rt[j] - t) < np.abs(rt[i] - t), j, i)
        ok = np.abs(rt[near] - t) <= MATCH_S
        diffs.append(np.abs(lr[ok] - rr[near[ok]]))
    d = np.concatenate(diffs) if diffs else np.zeros(0)
    return float(np.median(d)) if len(d) >= MIN_MATCHED else math.inf


def infer_zone(tl: Timeline, refs: list[Timeline]) -> tuple[int | None, str]:
    """(the log's UTC offset in seconds, why) - ``None`` when it stays as read (module doc)."""
    span = _span(tl)
    ref_spans = [s for s in (_span(r) for r in refs) if s is not None]
    if span is None or not ref_spans:
        return None, ""
    if any(_overlap(span, r) > 0 for r in ref_spans):
        return None, ""
    cands = [z for z in ZONES_S if z and any(_overlap((span[0] - z, span[1] - z), r) >= MIN_OVERLAP
                                                for r in ref_spans)]
    if not cands:
        return None, ("its times, read as UTC, overlap no unix-clock input read with it, and no zone "
                      "(UTC-12 to UTC+14) makes them: left as read")
    log_run, ref_runs = _running(tl), [_running(r) for r in refs]
    scores = {z: _disagreement(log_run, ref_runs, z) for z in cands}
    best = min(cands, key=lambda z: (scores[z], abs(z)))
    if math.isfinite(scores[best]):
        tied = [z for z in cands if scores[z] == scores[best]]
        if len(tied) > 1:
            return None, (f"{len(tied)} zones fit its span and its running-request counts equally well: "
                          "left as read")
        return best, (f"read as local time at UTC{_zone_name(best)}: the span it then covers and its running-"
                      f"request counts (median difference {scores[best]:g}) agree with the unix-clock inputs")
    if len(cands) == 1:
        return best, (f"read as local time at UTC{_zone_name(best)}, the one zone that puts it over the "
                      "unix-clock inputs read with it")
    return None, (f"{len(cands)} zones put its times over the unix-clock inputs and no running-request "
                  "counts tell them apart: left as read")


def _zone_name(z: int) -> str:
    sign = "+" if z >= 0 else "-"
    h, m = divmod(abs(z) // 60, 60)
    return f"{sign}{h:02d}:{m:02d}"


def shifted(tl: Timeline, by_s: float) -> Timeline:
    """The timeline with every time column (``t_s`` and ``t_*_s``) moved by ``by_s`` seconds."""
    def move(frame: pd.DataFrame | None) -> pd.DataFrame | None:
        if frame is None or not len(frame):
            return frame
        cols = [c for c in frame.columns if c == "t_s" or (c.startswith("t_") and c.endswith("_s"))]
        if not cols:
            return frame
        out = frame.copy()
        for c in cols:
            out[c] = out[c].astype(float) + by_s
        return out

    return Timeline(move(tl.steps), move(tl.tokens), move(tl.series), dict(tl.meta), move(tl.activity))


def align_naive_zones(timelines: list[Timeline], models: list[frozenset] | None = None) -> list[Timeline]:
    """Zone-less logs moved onto the unix clock of the inputs read with them, where that is known.

    ``models``: each input's model names (collectors/join.py ``hints``); an input that names another
    model than the log is no reference for its clock (it is another server)."""
    models = models or [frozenset()] * len(timelines)
    unix = [(tl, m) for tl, m in zip(timelines, models)
            if tl.meta.get("clock") == "unix" and tl.meta.get("clock_zone") != "naive"]
    if not unix:
        return timelines
    out = []
    for tl, mine in zip(timelines, models):
        if tl.meta.get("clock_zone") != "naive" or tl.meta.get("clock") != "unix":
            out.append(tl)
            continue
        refs = [r for r, m in unix if not (mine and m and not mine & m)]
        zone, why = infer_zone(tl, refs)
        if zone is None:
            if why:
                tl.meta["clock_note"] = f"log clock: {why}"
                note_source(tl, tl.meta["clock_note"])
            out.append(tl)
            continue
        out.append(_placed(tl, zone, why))
    return out


def _placed(tl: Timeline, zone_s: int, why: str) -> Timeline:
    """The log read as local time at UTC+``zone_s``, with the zone and why noted on it and its sources."""
    new = shifted(tl, -float(zone_s))
    new.meta["clock_zone"] = f"UTC{_zone_name(zone_s)}"
    new.meta["utc_offset_s"] = zone_s
    new.meta["clock_note"] = f"log clock: {why}"
    note_source(new, new.meta["clock_note"])
    return new


def note_source(tl: Timeline, text: str) -> None:
    """A note on the timeline's own source entries (what analyze and the report list per input)."""
    for src in tl.meta.get("sources", []):
        src["notes"] = list(src.get("notes", [])) + [text]


def parse_zone(text: str) -> int:
    """``+08:00`` / ``-5`` / ``+0530`` / ``UTC+8`` -> seconds east of UTC (ValueError if not a zone)."""
    m = re.fullmatch(r"\s*(?:UTC|GMT)?\s*([+-])?(\d{1,2})(?::?(\d\d))?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"not a UTC offset: {text!r} (e.g. +08:00, -05:00, +05:30)")
    z = (int(m.group(2)) * 60 + int(m.group(3) or 0)) * 60 * (-1 if m.group(1) == "-" else 1)
    if int(m.group(3) or 0) >= 60 or not -12 * 3600 <= z <= 14 * 3600:
        raise ValueError(f"not a UTC offset: {text!r} (zones run from -12:00 to +14:00)")
    return z


def apply_zone(timelines: list[Timeline], zone_s: int) -> list[Timeline]:
    """Zone-less logs read as local time at UTC+``zone_s`` (the user said so: ``--log-zone``)."""
    out = []
    for tl in timelines:
        if tl.meta.get("clock_zone") != "naive" or tl.meta.get("clock") != "unix" or not zone_s:
            out.append(tl)
            continue
        out.append(_placed(tl, zone_s, f"read as local time at UTC{_zone_name(zone_s)} (--log-zone)"))
    return out
