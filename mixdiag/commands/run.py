"""``mixdiag run``: run the reference engine on a scenario and write a run directory.

Writes (docs/contracts.md §1) ``steps/tokens/series.parquet`` + ``meta.json`` (the Timeline),
``summary.json``, ``truth.csv`` and whatever the instrumentation flags ask for. Refuses to write into
a directory that already holds files. The orchestration is a library call,
:func:`mixdiag.engine.testbed.session.run_scenario`; this verb only maps flags onto its request.
"""
from __future__ import annotations

from pathlib import Path

from mixdiag.fmt import ms


def register(sub, common):
    from mixdiag.commands.flags import add_instrumentation_flags  # torch-free: --help stays fast

    p = sub.add_parser("run", parents=[common], help="run the reference engine on a scenario, write a run directory",
                       description="Run the reference mixed-batch engine on a scenario (a shipped name or a TOML "
                                   "file; see docs/scenarios.md) and write a Timeline directory with summary.json "
                                   "and truth.csv.")
    p.add_argument("--scenario", required=True, metavar="NAME|FILE",
                   help="shipped scenario name (steady-decode, mixed-default, prefill-first, ...) or a .toml path")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed (workload and sampling)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N", help="stop after N steps (default: scenario's)")
    p.add_argument("--out", required=True, metavar="DIR", help="run directory to create (must be new or empty)")
    p.add_argument("--instance", default=None, metavar="NAME",
                   help="run only this engine instance (engine0, engine1, ...; default: all the scenario has)")
    add_instrumentation_flags(p)
    p.set_defaults(func=run)


def run(args, console):
    """Build a :class:`RunRequest` from the flags, run it (engine/testbed/session.py), print the summary."""
    from mixdiag.commands.flags import instrumentation_config
    from mixdiag.engine.testbed.session import RunRequest, run_scenario

    request = RunRequest(scenario=args.scenario, out=Path(args.out), seed=args.seed, max_steps=args.max_steps,
                         instance=args.instance, instrumentation=instrumentation_config(args))
    result = run_scenario(request, progress=console.progress, note=console.note)
    summary, out = result.summary, result.out
    if result.merged:
        console.result(f"{result.scenario} seed {result.seed}: {len(result.instances)} engine instances, "
                       f"{summary['steps']} steps, {summary['output_tokens']} output tokens in "
                       f"{summary['run_s']:.1f} s\nwrote {out}", summary)
        return 0
    k = summary["steps_by_kind"]
    itl = summary["itl_s"]
    human = (f"{result.scenario} seed {result.seed}: {summary['steps']} steps (prefill {k['prefill']}, "
             f"decode {k['decode']}, mixed {k['mixed']}), {summary['output_tokens']} output tokens in "
             f"{summary['run_s']:.1f} s; ITL p50 {ms(itl['p50'])} p99 {ms(itl['p99'])} max {ms(itl['max'])}"
             + (" (stopped at --max-steps)" if summary["requests"]["truncated_run"] else "") + f"\nwrote {out}")
    console.result(human, summary)
    return 0
