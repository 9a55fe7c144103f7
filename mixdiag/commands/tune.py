"""``mixdiag tune INPUT... --knob NAME=V1,V2``: sweep scheduler knobs on a replay of the user's own
traffic and step costs; print the Pareto frontier and the setting to use under the SLOs."""
from __future__ import annotations

from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.fmt import ms


def register(sub, common):
    p = sub.add_parser("tune", parents=[common], help="recommend a chunk size / token budget from your own data",
                       description="Estimate the workload and a step-cost model from INPUT (anything 'mixdiag "
                                   "analyze' reads), replay it through the engine's real schedulers for every "
                                   "knob setting, and print the Pareto frontier (P99 ITL vs P99 TTFT, with "
                                   "throughput), the recommended setting under the SLOs and its predicted "
                                   "change from the current one. See docs/tune.md.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="run directory or capture file(s)")
    p.add_argument("--format", default="auto", help="input format for every INPUT (default: auto-detect)")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="knob to sweep (chunk_size, max_batched_tokens, long_prefill_threshold, max_running, "
                        "mixed_chunk, policy); repeat for a grid")
    p.add_argument("--current", action="append", default=[], metavar="NAME=V",
                   help="the setting the input ran with, where the input does not record it")
    p.add_argument("--slo-itl-p99", type=float, default=None, metavar="S", help="P99 ITL objective (seconds)")
    p.add_argument("--slo-ttft-p99", type=float, default=None, metavar="S", help="P99 TTFT objective (seconds)")
    p.add_argument("--window", type=float, default=None, metavar="S", help="tune on the first S seconds of traffic")
    p.add_argument("--jobs", type=int, default=0, metavar="N", help="replay processes (default: up to 2)")
    p.add_argument("--html", metavar="FILE", help="also write the frontier plot as a self-contained HTML file")
    p.add_argument("--save", metavar="FILE", help="also write the --json document to FILE (never overwrites): "
                                                 "'mixdiag diff BEFORE AFTER --tuned FILE' checks the recommendation")
    h = p.add_argument_group("fallback step costs (inputs without per-step durations)")
    h.add_argument("--model", default="glm-5.3", metavar="PRESET", help="ledger model preset (default glm-5.3)")
    h.add_argument("--device", default="h200", help="device model (h200, h100, a100; default h200)")
    p.set_defaults(func=run)


def run(args, console):
    from mixdiag.commands.analyze import load_inputs
    from mixdiag.tuning import frontier, sweep
    from mixdiag.tuning.frontier_report import headline

    if args.html and Path(args.html).exists():
        raise UserError(f"{args.html} exists; choose another path for --html (mixdiag never overwrites your files)")
    if args.save and Path(args.save).exists():
        raise UserError(f"{args.save} exists; choose another path for --save (mixdiag never overwrites your files)")
    if args.window is not None and args.window <= 0:
        raise UserError("--window must be > 0 seconds")
    if args.jobs < 0:
        raise UserError("--jobs must be >= 0")
    knobs = [frontier.parse_knob(k) for k in args.knob]
    current = {}
    for c in args.current:
        name, vals = frontier.parse_knob(c)
        if len(vals) != 1:
            raise UserError(f"--current {c!r}: one value per knob")
        current[name] = vals[0]
    tl = load_inputs(args.inputs, args.format)
    tl, traffic_tl = sweep.sources(tl, lambda p: load_inputs([p], args.format), args.inputs)
    res = sweep.run(tl, knobs, slo_itl=args.slo_itl_p99, slo_ttft=args.slo_ttft_p99, current=current,
                   window_s=args.window, jobs=args.jobs, ledger_model=args.model, ledger_device=args.device,
                   traffic_tl=traffic_tl)
    if args.html:
        from mixdiag.tuning.frontier_report import write_html

        write_html(res, args.html, title=f"mixdiag tune {' '.join(args.inputs)}")
        console.note(f"wrote {args.html}")
    if args.save:
        from mixdiag.console import json_text

        with open(args.save, "x", encoding="utf-8") as f:  # "x": never overwrite, even if created meanwhile
            f.write(json_text(res))
        console.note(f"wrote {args.save}")
    console.result(render(res, headline(res)), res)
    return 0


def render(res: dict, head: str) -> str:
    """The human report: headline, model quality, one line per setting."""
    from mixdiag.tuning.frontier import extrapolated
    cm = res["cost_model"]
    fit = (f"step costs fitted on {cm['steps']} steps: R² {cm['r2']:.3f}, held-out MAPE {100 * cm['mape_heldout']:.1f} %"
           if cm["kind"] == "fitted" else "step costs: shape ledger + device model (no per-step durations)")
    w = res["workload"]
    lines = [head, f"workload: {w['requests']} requests over {w['span_s']:.1f} s ({w['source']}; "
             + ", ".join(f"{k} {v}" for k, v in w["quality"].items()) + f"); {fit}",
             f"{'setting':34} {'P99 ITL':>10} {'95% run':>10} {'P99 TTFT':>10} {'tok/s':>8}"]
    for r in res["settings"]:
        mark = ("*" if r["pareto"] else " ") + ("<" if r["current"] else " ") + \
            (f" x{r['extrapolation_x']:.1f}" if extrapolated(r) else "")
        hi = r.get("itl_p99_hi_s", r["itl_p99_s"])
        lines.append(f"{r['label']:34} {ms(r['itl_p99_s'], unit='ms'):>10} {ms(hi, unit='ms'):>10} {r['ttft_p99_s']:9.2f}s "
                     f"{r['throughput_tok_s']:8.0f} {mark}")
    lines.append("(* on the Pareto frontier, < the current setting; 95% run: the P99 ITL one run stays under "
                 "with 95 % probability, which the recommendation uses; xN: steps N times larger than any the "
                 "cost was fitted on - a prediction beyond your data)")
    lines += [f"note: {n}" for n in res["notes"]]
    return "\n".join(lines)
