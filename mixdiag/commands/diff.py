"""``mixdiag diff BEFORE AFTER``: two captures side by side - ITL, TTFT, the excess by cause, episodes and
step-class kernel times - with what moved beyond noise and which cause moved it (docs/diff.md)."""
from __future__ import annotations

import json
from pathlib import Path

from mixdiag.errors import UserError


def register(sub, common):
    from mixdiag.commands.flags import add_diff_flags, add_step_flags

    p = sub.add_parser("diff", parents=[common], help="compare two captures: what moved and which cause moved it",
                       description="Diagnose two captures (anything 'mixdiag analyze' reads; each side one path or "
                                   "PATH,PATH,... read together on one clock) and set them side by side: ITL P50/P99, "
                                   "TTFT, the excess by cause (budget and regime decomposition, per stream-second), "
                                   "episodes, spikes and step-class kernel times; what moved beyond noise and which "
                                   "cause moved it; with --tuned, mixdiag tune's prediction against AFTER. Inputs are "
                                   "only read. See docs/diff.md.")
    add_diff_flags(p)
    add_step_flags(p)
    p.set_defaults(func=run)


def _side(text: str, args, console):
    """(inputs, Timeline, Diagnosis) of one side."""
    from mixdiag.commands.analyze import load_inputs
    from mixdiag.commands.flags import side_paths, step_options
    from mixdiag.diagnosis import diagnose
    from mixdiag.diagnosis.parallel import default_jobs
    from mixdiag.report import source_warnings

    paths = side_paths(text)
    tl = load_inputs(paths, args.format, **step_options(args))
    for w in source_warnings(tl.meta):  # partial input: analysed, and said so on stderr
        console.note(w)
    return paths, tl, diagnose(tl, jobs=args.jobs or default_jobs())


def _tune_doc(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--tuned {path}: no such file")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"--tuned {path}: not JSON ({type(e).__name__})") from None


def run(args, console):
    from mixdiag.diagnosis.diff import capture_facts, check_prediction, diff, kernel_diff, kernels_of
    from mixdiag.report_diff import diff_json, render, write_html

    from mixdiag.commands.flags import check_report_args
    check_report_args(args)
    doc = _tune_doc(args.tuned) if args.tuned else None
    facts, kernels = [], []
    for text in (args.before, args.after):
        paths, tl, d = _side(text, args, console)
        facts.append(capture_facts(tl, d, tuple(paths)))
        kernels.append(kernels_of(tl, d))  # the device breakdown's kernels frame; None without device activity
    before, after = facts
    if kernels[0] is not None and kernels[1] is not None:
        kd, note = kernel_diff(kernels[0], kernels[1]), ""
    elif before.has_trace or after.has_trace:
        kd, note = None, ("not shown: " + ("only one side has a trace" if before.has_trace != after.has_trace
                                          else "the traces hold no device activity (kernel rows not kept)"))
    else:
        kd, note = None, "no device trace on either side"
    pred = None
    if doc is not None:
        pred = check_prediction(doc, after.itl_p99_s.value, after.ttft_p99_s.value, before_requests=before.requests,
                                after_requests=after.requests, before_duration_s=before.duration_s,
                                after_duration_s=after.duration_s)
    result = diff(before, after, kernels=kd, kernels_note=note, prediction=pred)
    if args.html:
        write_html(result, args.html, title=f"mixdiag diff {args.before} {args.after}")
        console.note(f"wrote {args.html}")
    console.result(render(result, top=args.top), diff_json(result))
    return 0
