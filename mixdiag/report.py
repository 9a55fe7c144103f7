"""Human-readable rendering of a :class:`~mixdiag.diagnosis.result.Diagnosis`: the verdict, a table by
cause, the regimes (saturation, excess by cause, episodes) and the top spikes with their evidence (what
``mixdiag analyze`` prints)."""
from __future__ import annotations

import pandas as pd

from mixdiag.causes import CAUSES
from mixdiag.fmt import ms


def evidence_summary(cause: str, ev: dict) -> str:
    """One short line naming the signal values behind a cause."""
    def g(k, fmt="{:g}"):
        v = ev.get(k)
        return None if v is None else (fmt.format(v) if not isinstance(v, str) else v)

    parts: list[str] = []
    if cause in ("mixing", "prefill_stall"):
        parts.append(f"prefill {g('prefill_tokens', '{:.0f}') or '?'} tok + decode {g('decode_rows', '{:.0f}') or '?'} rows")
        if ev.get("graph_mode"):
            parts.append(f"graph {ev['graph_mode']}")
        if ev.get("sm_delta") is not None:
            parts.append(f"SM {ev['sm_delta']:+.2f} vs neighbours")
        if ev.get("periodic"):
            parts.append("in step with prefill arrivals")
    elif cause == "ep_hotspot":
        parts.append(f"expert imbalance {g('expert_imbalance', '{:.2f}')}"
                     + (f" ({ev['imbalance_rel']:.1f}x neighbours)" if ev.get("imbalance_rel") else ""))
    elif cause == "pd_transfer":
        parts.append(f"KV in {g('kv_transfer_bytes', '{:.3g}')} B, wait {ms(ev.get('kv_transfer_s'))}")
    elif cause == "graph_fallback":
        parts.append(f"decode-only, graph {ev.get('graph_mode')} (decodes normally {ev.get('graph_norm')}),"
                     f" {g('decode_reqs', '{:.0f}')} reqs")
    elif cause == "kv_pressure":
        parts.append(f"{g('preempted_reqs', '{:.0f}')} preempted" +
                     (f", KV usage {ev['kv_usage']:.2f}" if ev.get("kv_usage") is not None else ""))
    elif cause == "host_stall":
        stopped = ev.get("host_stopped_s", ev.get("interval_host_stopped_s"))
        # interval rows carry the GC part alone; step rows the interval's measured pause, the OS's part inside it
        gc = ev["host_pause_s"] if ev.get("host_pause_s") is not None else (
            None if ev.get("interval_host_pause_s") is None else ev["interval_host_pause_s"] - (stopped or 0.0))
        gc = gc if gc is not None and gc > 1e-9 else None
        wait = ev.get("interval_host_wait_excess_s")
        if gc is not None or stopped is not None:
            head = ", ".join(([f"GC pause {ms(gc)} (engine-timed)"] if gc is not None else []) +
                             ([f"engine process stopped {ms(stopped)} (OS-sampled)"] if stopped is not None else []))
        elif wait is not None:  # the engine counted its GPU waiting on the host (SGLang)
            head = f"host wait {ms(wait)} beyond usual"
        else:
            head = f"gap before step {ms(ev.get('gap_before_s'))}"
        parts.append(head + (f" ({ev['gap_share_of_excess']:.0%} of excess)" if ev.get("gap_share_of_excess") else ""))
    else:
        parts.append(f"kind {ev.get('kind')}; {ev.get('reason', 'no supported cause')}")
    return ", ".join(parts)


def budget_lines(d) -> list[str]:
    """The budget table of each instance: excess token-time and P99 without each cause."""
    b = getattr(d, "budget", None)
    out: list[str] = []
    for inst, ib in (b.instances.items() if b is not None else ()):
        if not ib.n_units:
            continue
        out += ["", f"ITL excess budget, {inst} ({ib.n_units} {ib.source.replace('_', ' ')}): baseline "
                    f"{ms(ib.baseline_s)}, P99 {ms(ib.p99_s)} (all excess removed: {ms(ib.p99_floor_s)}), "
                    f"excess token-time {ib.excess_s:.3f} s",
                f"{'cause':<16} {'spikes':>7} {'excess s':>9} {'share':>7} {'tail':>6} {'P99 without':>12} {'P99 -':>10}",
                "-" * 72]
        for c, cb in ib.by_cause.items():
            if not cb.spikes and cb.excess_s <= 0:
                continue
            out.append(f"{c:<16} {cb.spikes:>7} {cb.excess_s:>9.3f} {cb.share_of_excess:>7.0%} {cb.tail_share:>6.0%} "
                       f"{ms(cb.p99_without_s):>12} {ms(cb.p99_reduction_s):>10}")
    return out


#: ignored input files named one per warning line; the rest are counted in one more line
MAX_IGNORED_LINES = 10
#: a warning line quotes this much of the first unreadable line
EXAMPLE_CHARS = 120


def _reasons(src: dict) -> dict[str, int]:
    """Skip reasons with counts; older entries (no ``skipped_reasons``) give one lump."""
    reasons = dict(src.get("skipped_reasons") or {})
    n = int(src.get("lines_skipped") or 0)
    if n and not reasons:
        reasons = {"unreadable": n}
    return reasons


def skipped_by_source(meta: dict) -> list[dict]:
    """Per input source what could not be read (the ``sources`` list of ``analyze --json``)."""
    out = []
    for s in meta.get("sources", []):
        n = int(s.get("lines_skipped") or 0)
        out.append({"path": s.get("path"), "format": s.get("format"), "lines_total": s.get("lines_total"),
                    "lines_parsed": s.get("lines_parsed"), "partial": bool(s.get("partial") or n),
                    "skipped": {"count": n, "reasons": _reasons(s)},
                    "partial_reasons": list(s.get("partial_reasons") or []),
                    "bytes_replaced": int(s.get("bytes_replaced") or 0)})
    return out


def source_warnings(meta: dict) -> list[str]:
    """One ``warning: PATH: ...`` line per input source that was not read whole, and per input file
    that was not read at all (no known format)."""
    out = []
    for s in skipped_by_source(meta):
        parts = []
        n = s["skipped"]["count"]
        if n:
            raw = next(iter(meta_examples(meta, s["path"])), None)
            if raw and len(raw) > EXAMPLE_CHARS:
                raw = raw[:EXAMPLE_CHARS] + "..."
            parts.append(f"{n} of {s['lines_total']} lines unreadable" + (f" (first: {raw})" if raw else ""))
        parts += s["partial_reasons"]
        if s["bytes_replaced"]:
            parts.append(f"{s['bytes_replaced']} undecodable byte sequence(s) replaced")
        if s["partial"] and not parts:
            parts.append("read only in part")
        if parts:
            out.append(f"warning: {s['path']}: " + "; ".join(parts))
    ignored = list(meta.get("inputs_ignored") or [])
    for path in ignored[:MAX_IGNORED_LINES]:
        out.append(f"warning: {path}: not read (no known format)")
    if len(ignored) > MAX_IGNORED_LINES:
        out.append(f"warning: {len(ignored) - MAX_IGNORED_LINES} more file(s) not read (no known format)")
    return out


def meta_examples(meta: dict, path) -> list[str]:
    """The kept examples of skipped lines of source ``path``."""
    for s in meta.get("sources", []):
        if s.get("path") == path:
            return [str(e) for e in s.get("skipped_examples") or []]
    return []


def strict_failure(meta: dict) -> str | None:
    """The one-line ``--strict`` error when any input was skipped or read in part, else None."""
    bad = [s for s in skipped_by_source(meta) if s["partial"]]
    ignored = list(meta.get("inputs_ignored") or [])
    if not bad and not ignored:
        return None
    first = (f"{bad[0]['path']}: {bad[0]['skipped']['count']} of {bad[0]['lines_total']} lines unreadable"
             if bad else f"{ignored[0]}: not read")
    return (f"--strict: {len(bad)} input source(s) read in part and {len(ignored)} not read "
            f"(first: {first}); drop --strict to analyse what was readable")


def excess_rows(regimes) -> list[tuple[str, float, float]]:
    """(cause, token-seconds, share of all excess) for every cause with excess, largest first: the
    decomposition's exact numbers, for the text, HTML and dashboard surfaces alike."""
    total = regimes.excess_by_cause() if regimes is not None else {}
    whole = sum(total.values())
    rows = [(c, v, v / whole) for c, v in total.items() if v > 0 and whole > 0]
    return sorted(rows, key=lambda r: -r[1])


def saturation_lines(regimes) -> list[str]:
    """One line per saturated instance: how long requests waited and the batch limit they waited at."""
    out = []
    for inst, s in sorted((regimes.saturation if regimes is not None else {}).items()):
        if s.get("saturated"):
            why = " for capacity" if s.get("waiting_column") == "waiting_capacity_reqs" else ""
            out.append(f"saturated: {inst} - requests waited{why} after {s['waiting_share']:.0%} of its rows, the running "
                       f"batch at its limit ({s['running_max']:.0f}) in {s['running_at_limit_share']:.0%} of those")
    return out


def episode_label(cause: str, shares: dict) -> str:
    """'ep_hotspot (92%)': an episode's cause with its share of the episode's excess."""
    share = (shares or {}).get(cause)
    return f"{cause} ({share:.0%})" if share is not None else cause


def regime_lines(d, top: int = 10) -> list[str]:
    """The "Regimes" section: saturation, excess over the healthy reference by cause, the top ``top``
    episodes by excess. Empty when there is none of the three (the report then reads as before)."""
    reg = getattr(d, "regimes", None)
    sat, rows = saturation_lines(reg), excess_rows(reg)
    eps = reg.episodes if reg is not None else None
    n_eps = 0 if eps is None else len(eps)
    if not sat and not rows and not n_eps:
        return []
    out = ["", "Regimes", *sat]
    if rows:
        out += ["latency over the healthy reference by cause (token-seconds: seconds summed over every decode token):",
                f"{'cause':<16} {'token-s':>10} {'share':>7}", "-" * 35]
        out += [f"{c:<16} {v:>10.3f} {share:>7.0%}" for c, v, share in rows]
    if not n_eps:
        return out + ["no sustained episode of elevated latency"]
    t0 = d.steps["t_start_s"].min() if len(d.steps) else 0.0
    shown = eps.sort_values("excess_s", ascending=False, kind="stable").head(top)
    out += [f"{n_eps} sustained episode(s), {'top ' + str(len(shown)) + ' ' if len(shown) < n_eps else ''}by excess:",
            f"{'instance':<10} {'start s':>10} {'end s':>10} {'rows':>6} {'reference':>10} {'ratio':>6} "
            f"{'token-s':>9}  cause (share of its excess)"]
    for r in shown.itertuples(index=False):
        line = (f"{r.instance:<10} {r.t_start_s - t0:>10.3f} {r.t_end_s - t0:>10.3f} {int(r.rows):>6} "
                f"{ms(r.reference_s):>10} {r.ratio:>5.2f}x {r.excess_s:>9.3f}  {episode_label(r.cause, r.shares)}")
        # why: for an unknown episode what was missing; for one inside another, which (a named one has none)
        out.append(line + (f" - {r.why}" if isinstance(r.why, str) and r.why else ""))
    if n_eps > len(shown):
        out.append(f"... and {n_eps - len(shown)} more episode(s) (analyze --json lists all)")
    return out


def render(d, top: int = 10, warnings: list[str] | tuple = (), sections: list[str] | tuple = ()) -> str:
    """The human report of ``analyze``; ``sections``: more lines before the warnings (the device
    breakdown); ``warnings`` (:func:`source_warnings`) end it in a section of their own, so a report on
    partly read input says so where it is read."""
    out = [d.verdict, ""]
    itl = d.itl
    out.append(f"ITL ({itl.get('source')}): p50 {ms(itl.get('p50_s'))}, p99 {ms(itl.get('p99_s'))}, "
               f"max {ms(itl.get('max_s'))}")
    sp = d.spikes
    if len(sp):
        out += ["", f"{'cause':<16} {'spikes':>7} {'share':>7} {'mean conf':>10} {'mean height':>12}", "-" * 56]
        height = sp["itl_s"] / sp["baseline_s"].where(sp["baseline_s"] > 0)
        for c in CAUSES:
            n = d.by_cause.get(c, 0)
            if not n:
                continue
            m = sp["cause"] == c
            out.append(f"{c:<16} {n:>7} {n / len(sp):>7.0%} {sp.loc[m, 'confidence'].mean():>10.2f} "
                       f"{height[m].mean():>11.1f}x")
    out += budget_lines(d)
    out += regime_lines(d, top)
    if len(sp):
        out += ["", f"top {min(top, len(sp))} spikes (by height over baseline):",
                f"{'instance':<10} {'step':>7} {'t_s':>10} {'itl':>10} {'baseline':>10} {'cause':<15} {'conf':>5}  evidence"]
        t0 = d.steps["t_start_s"].min() if len(d.steps) else 0.0
        for i in height.sort_values(ascending=False, kind="stable").index[:top]:
            r = sp.loc[i]
            out.append(f"{r['instance']:<10} {int(r['step']):>7} {r['t_s'] - t0:>10.3f} {ms(r['itl_s']):>10} "
                       f"{ms(r['baseline_s']):>10} {r['cause']:<15} {r['confidence']:>5.2f}  "
                       f"{evidence_summary(r['cause'], r['evidence'])}")
    if d.instances:
        out.append("")
    for inst, info in d.instances.items():
        if len(info.get("sources", ())) > 1:  # one server read from several inputs (collectors/join.py)
            out.append(f"{inst}: one server from {len(info['sources'])} inputs ({info.get('joined_by')}): "
                       + ", ".join(f"{s['path']} ({s['format']})" for s in info["sources"]))
        elif info.get("sources"):  # several inputs, this server from one of them: which one
            s = info["sources"][0]
            out.append(f"{inst}: one server from {s['path']} ({s['format']}; {info.get('joined_by')})")
        out += [f"{inst}: {n}" for n in info.get("clock_notes") or ()]  # a log read in another zone
        if "signals" not in info:
            continue
        missing = [s for s, q in info["signals"].items() if q == "absent"]
        est = [s for s, q in info["signals"].items() if q in ("estimated", "inferred")]
        note = f"{inst}: latency from {info['latency_source']}"
        if missing:
            note += f"; missing signals: {', '.join(missing)}"
        if est:
            note += f"; estimated/inferred: {', '.join(est)}"
        out.append(note)
    out += list(sections)
    out += warnings_section(warnings)
    return "\n".join(out)


def warnings_section(warnings) -> list[str]:
    """The report's input-warnings section (empty when every input was read whole)."""
    if not warnings:
        return []
    return ["", "input not read whole (results use only what was readable):"] + \
        ["  " + w.removeprefix("warning: ") for w in warnings]


def spikes_table(d) -> pd.DataFrame:
    """Spikes with height and a one-line evidence summary (for tables in HTML and the dashboard)."""
    sp = d.spikes.copy()
    sp["height_x"] = sp["itl_s"] / sp["baseline_s"].where(sp["baseline_s"] > 0)
    sp["evidence_summary"] = [evidence_summary(c, e) for c, e in zip(sp["cause"], sp["evidence"])]
    return sp
