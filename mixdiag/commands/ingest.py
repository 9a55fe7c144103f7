"""``mixdiag ingest INPUT... [--format auto|...] [--out DIR|FILE.csv]``: read sources into a Timeline.

Detects each input's format by content, reads it with its collector, aligns several inputs on
one clock, prints what was read (rows, skipped lines, time span, which Timeline columns and
signals the source could fill) and optionally writes the Timeline (a directory, as ``Timeline.save``
does, or the steps frame as CSV). Never overwrites.
"""
from __future__ import annotations

import math
from pathlib import Path

from mixdiag.errors import UserError

_IDENTITY = {"instance", "step", "t_start_s", "t_end_s", "granularity"}


def register(sub, common):
    from mixdiag.collectors import registry

    p = sub.add_parser(
        "ingest", parents=[common], help="read traces, logs, scrapes or run directories into a Timeline",
        description="Read each INPUT (format detected by content unless --format is given) into one Timeline "
                    "and summarise what was read. Formats: " + ", ".join(registry.formats()) + ".")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="file, directory or Prometheus URL")
    p.add_argument("--format", default="auto", choices=["auto"] + registry.formats(),
                   help="read every input as this format (default: detect)")
    p.add_argument("--out", metavar="DIR|FILE.csv",
                   help="write the Timeline to DIR (Parquet + meta.json) or the steps to FILE.csv; never overwrites")
    p.add_argument("--strict", action="store_true",
                   help="exit 2 when any input line or file could not be read (default: warn and go on)")
    p.add_argument("--instance", help="name of the instance (single input only)")
    from mixdiag.commands.flags import add_source_flags, add_step_flags
    add_step_flags(p)
    add_source_flags(p)
    p.set_defaults(func=run)


def _check_out(out: str) -> Path:
    p = Path(out)
    if p.suffix.lower() == ".csv":
        if p.exists():
            raise UserError(f"{p} exists; choose another path (ingest never overwrites)")
        if not p.parent.is_dir():
            raise UserError(f"{p.parent}: no such directory")
        return p
    if p.exists() and not p.is_dir():
        raise UserError(f"{p} exists and is not a directory")
    from mixdiag.schema import Timeline

    clash = [f for f in Timeline.FILES.values() if (p / f).exists()]
    if clash:
        raise UserError(f"{p} already holds {', '.join(clash)}; choose another directory (ingest never overwrites)")
    return p


def filled_columns(tl: Timeline) -> list[str]:
    """Steps columns with at least one known value (not NaN, not 'unknown')."""
    from mixdiag.schema import columns

    out = []
    for c in columns("steps"):
        if c.name in _IDENTITY or c.name not in tl.steps:
            continue
        s = tl.steps[c.name]
        known = (s != "unknown") if c.dtype == "str" else s.notna()
        if len(s) and bool(known.any()):
            out.append(c.name)
    return out


def summarize(tl: Timeline) -> dict:
    """The JSON summary of an ingested Timeline."""
    import numpy as np

    times = np.concatenate([tl.steps["t_start_s"].to_numpy(), tl.steps["t_end_s"].to_numpy(),
                            tl.tokens["t_s"].to_numpy(), tl.series["t_s"].to_numpy()])
    t0, t1 = (float(times.min()), float(times.max())) if len(times) else (math.nan, math.nan)
    sources = tl.meta.get("sources", [])
    kinds = tl.steps["kind"].value_counts().to_dict() if len(tl.steps) else {}
    return {
        "instances": tl.instances,
        "rows": {"steps": len(tl.steps), "tokens": len(tl.tokens), "series": len(tl.series)},
        "steps_by_kind": {k: int(v) for k, v in kinds.items()},
        "granularity": sorted(set(tl.steps["granularity"])) if len(tl.steps) else [],
        "clock": tl.meta.get("clock"),
        "time_span": {"t0_s": t0, "t1_s": t1, "duration_s": t1 - t0},
        "filled_columns": filled_columns(tl),
        "signals": tl.meta.get("signals", {}),
        "partial": bool(tl.meta.get("partial")) or any(s.get("partial") for s in sources),
        "inputs_ignored": tl.meta.get("inputs_ignored", []),
        "sources": [{k: s.get(k) for k in ("format", "path", "lines_total", "lines_parsed", "lines_skipped",
                                           "skipped_examples", "skipped_reasons", "partial", "partial_reasons",
                                           "bytes_replaced", "notes", "step_source")
                     if k in s} for s in sources],
    }


def _human(summary: dict, out: str | None) -> str:
    lines = []
    for s in summary["sources"]:
        flag = "  PARTIAL" if s.get("partial") else ""
        lines.append(f"{s.get('format')}: {s.get('path')}  read {s.get('lines_parsed')}/{s.get('lines_total')}"
                     f" (skipped {s.get('lines_skipped')}){flag}")
        for n in s.get("notes") or []:
            lines.append(f"    note: {n}")
        for e in (s.get("skipped_examples") or [])[:3]:
            lines.append(f"    skipped: {e}")
    if summary["inputs_ignored"]:
        ign = summary["inputs_ignored"]
        lines.append(f"ignored {len(ign)} file(s) in no known format, e.g. {ign[0]}")
    r = summary["rows"]
    lines.append(f"instances: {', '.join(summary['instances']) or '-'}")
    kinds = ", ".join(f"{k} {v}" for k, v in summary["steps_by_kind"].items())
    lines.append(f"rows: steps {r['steps']}" + (f" ({kinds})" if kinds else "") +
                 f", tokens {r['tokens']}, series {r['series']}")
    span = summary["time_span"]
    if span["t0_s"] is not None and not math.isnan(span["t0_s"]):
        lines.append(f"time span: {span['duration_s']:.6g} s on the {summary['clock']} clock "
                     f"({span['t0_s']:.6f} .. {span['t1_s']:.6f})")
    lines.append("columns filled: " + (", ".join(summary["filled_columns"]) or "none"))
    for inst, sig in summary["signals"].items():
        have = [k for k, v in sig.items() if v != "absent"]
        lines.append(f"signals {inst}: " + (", ".join(f"{k}={sig[k]}" for k in have) or "none"))
    if summary["partial"]:
        lines.append("PARTIAL: some input could not be read whole (see notes)")
    if out:
        lines.append(f"wrote {out}")
    return "\n".join(lines)


def run(args, console):
    from mixdiag.collectors import load

    out = _check_out(args.out) if args.out else None
    from mixdiag.commands.flags import source_options, step_options

    options = source_options(args)
    if args.instance:
        options["instance"] = args.instance
    options.update(step_options(args))
    console.note(f"reading {len(args.inputs)} input(s)", level=1)
    tl = load(args.inputs, format=args.format, **options)
    from mixdiag.report import source_warnings, strict_failure
    if args.strict and (failure := strict_failure(tl.meta)):
        raise UserError(failure)
    for w in source_warnings(tl.meta):
        console.note(w)
    summary = summarize(tl)
    if out is not None:
        if out.suffix.lower() == ".csv":
            tl.to_csv(out)
        else:
            tl.save(out)
        summary["out"] = str(out)
    console.result(_human(summary, summary.get("out")), summary)
    return 0
