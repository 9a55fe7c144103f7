"""``mixdiag analyze INPUT...``: find TPOT spikes and say what caused each, with evidence."""
from __future__ import annotations

from pathlib import Path

from mixdiag.errors import UserError


def register(sub, common):
    p = sub.add_parser("analyze", parents=[common], help="find TPOT spikes and attribute each to a cause",
                       description="Detect TPOT/ITL spikes and attribute each to mixing, prefill_stall, ep_hotspot, "
                                   "pd_transfer, graph_fallback, kv_pressure, host_stall or unknown, with "
                                   "evidence and confidence. INPUT: anything 'mixdiag ingest' reads (a run "
                                   "directory, an Nsight SQLite export, a Kineto trace, engine logs, a scrape "
                                   "directory); several inputs are analysed together on one clock. Never reads "
                                   "truth.csv. The --json document is described in docs/analyze.md.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="run directory or capture file(s)")
    p.add_argument("--format", default="auto", help="input format for every INPUT (default: auto-detect)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="spikes listed in the human report (default 10)")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (never overwrites)")
    p.add_argument("--strict", action="store_true",
                   help="exit 2 when any input line or file could not be read (default: warn on stderr and "
                        "analyse what was readable)")
    p.add_argument("--no-breakdown", action="store_true",
                   help="skip the device breakdown (kernels, idle split, comm overlap, copies, stragglers by step "
                        "class) and keep no per-kernel rows of traces: faster on exports of millions of kernels")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes diagnosing a fleet's instances (default: the CPUs other work leaves idle; 1: serial)")
    h = p.add_argument_group("predicted spike height (HTML report)")
    h.add_argument("--model", default="glm-5.3", metavar="PRESET", help="ledger model preset (default glm-5.3)")
    h.add_argument("--model-config", metavar="FILE", help="ledger model config file (JSON/TOML) instead of --model")
    h.add_argument("--device", default="h200", help="device model (h200, h100, a100; default h200)")
    h.add_argument("--context-len", type=int, default=4096, metavar="C", help="decode context length assumed (default 4096)")
    from mixdiag.commands.flags import add_instance_flags, add_source_flags, add_step_flags
    add_step_flags(p)
    add_source_flags(p)
    add_instance_flags(p)
    p.set_defaults(func=run)


def load_inputs(paths: list[str], fmt: str = "auto", **options) -> Timeline:
    """One Timeline from one or several inputs on one clock (via ``mixdiag.collectors.load``)."""
    from mixdiag.schema import SchemaError, Timeline  # pandas: imported when a verb runs, not for --help

    for path in paths:
        if not path.startswith(("http://", "https://")) and not Path(path).exists():
            raise UserError(f"no such input: {path}")
    try:
        from mixdiag.collectors import load  # every supported format, aligned on one clock
    except ImportError:
        load = None
    if load is not None:
        return load(paths if len(paths) > 1 else paths[0], format=fmt, **options)
    # Without collectors: run directories written by Timeline.save.
    if not all(Path(p).is_dir() for p in paths):
        raise UserError("only run directories can be read (mixdiag.collectors is not installed)")
    tls = [Timeline.load(p) for p in paths]
    try:
        return tls[0] if len(tls) == 1 else Timeline.concat(tls)
    except SchemaError as e:
        raise UserError(f"cannot analyse these inputs together: {e}") from None


def run(args, console):
    from mixdiag.diagnosis import diagnose
    from mixdiag.report import render

    from mixdiag.commands.flags import check_report_args
    check_report_args(args)
    from mixdiag.commands.flags import instance_options, source_options, step_options
    joined = instance_options(args)
    inputs = list(args.inputs)  # paths named only by --instance are inputs too
    inputs += [p for paths in joined.get("join", {}).values() for p in paths if p not in inputs]
    tl = load_inputs(inputs, args.format, **step_options(args), **source_options(args), **joined,
                     **({"device_activity": False} if args.no_breakdown else {}))
    console.note(f"loaded {tl!r}", level=1)
    from mixdiag.report import skipped_by_source, source_warnings, strict_failure
    if args.strict and (failure := strict_failure(tl.meta)):
        raise UserError(failure)
    warnings = source_warnings(tl.meta)
    for w in warnings:  # stderr, so --json's stdout stays one document
        console.note(w)
    from mixdiag.diagnosis.parallel import default_jobs
    d = diagnose(tl, jobs=args.jobs or default_jobs())
    if tl.meta.get("since_start"):  # one dump: the run's totals since process start are the verdict, no spikes
        from mixdiag.report_since_start import as_summary
        d = as_summary(d, tl)
    bd = None
    if not args.no_breakdown:
        from mixdiag.diagnosis.breakdown import breakdown
        bd = breakdown(tl, d)
    if args.html:
        from mixdiag.ledger.device_model import device
        from mixdiag.ledger.shapes import resolve
        from mixdiag.report_html import write_html

        write_html(d, args.html, model=resolve(args.model, args.model_config), device=device(args.device),
                   context_len=args.context_len, title=f"mixdiag analyze {' '.join(inputs)}", breakdown=bd)
        console.note(f"wrote {args.html}")
    from mixdiag.report_breakdown import breakdown_lines
    # --json prints the document alone: the human report (a pass over every spike) is not built for it
    human = None if console.json_mode else render(d, top=args.top, warnings=warnings,
                                                  sections=breakdown_lines(bd) if bd is not None else ())
    doc = {**d.to_json(), "sources": skipped_by_source(tl.meta), "inputs_ignored": list(tl.meta.get("inputs_ignored", []))}
    if bd is not None:
        doc["breakdown"] = bd.to_json()
    if tl.meta.get("since_start"):  # one dump: the run's totals since process start, not spikes
        from mixdiag.report import warnings_section
        from mixdiag.report_since_start import HOW_TO_LOCATE, summary_lines, summary_rows
        human = "\n".join([d.verdict, "", *summary_lines(tl), *warnings_section(warnings), f"({HOW_TO_LOCATE})"])
        doc = {**doc, "since_start": summary_rows(tl)}
    # the frames (hundreds of MB at a million steps) are done with: freed before the JSON text is built
    del d, tl
    console.result(human, doc)
    return 0
