"""``mixdiag run``: run the reference engine on a scenario and write a run directory.

Writes (docs/contracts.md §1) ``steps/tokens/series.parquet`` + ``meta.json`` (the Timeline),
``summary.json``, ``truth.csv`` and whatever the instrumentation flags ask for. Refuses to write into
a directory that already holds files.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from mixdiag.errors import UserError


def register(sub, common):
    from mixdiag.engine.telemetry.instrumentation import add_arguments

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
    add_arguments(p)
    p.set_defaults(func=run)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--out {out} already holds files; choose a new directory (nothing is overwritten)")


def run(args, console):
    from mixdiag.engine.testbed import scenario as scen
    from mixdiag.engine.core.engine import Engine
    from mixdiag.engine.testbed.faults import FaultInjector, FaultsConfig
    from mixdiag.engine.telemetry.instrumentation import Instrumentation, config_from_args
    from mixdiag.engine.core.records import to_timeline
    from mixdiag.engine.testbed.runner import run_workload, summarize
    from mixdiag.engine.testbed.truth import TruthRecorder, write_truth
    from mixdiag.engine.testbed.workload import generate

    sc = scen.load(args.scenario)
    if args.seed is not None:
        sc = sc.with_seed(args.seed)
    if args.max_steps is not None and args.max_steps < 1:
        raise UserError(f"--max-steps must be >= 1, got {args.max_steps}")
    max_steps = args.max_steps or sc.max_steps
    out = Path(args.out)
    _check_out(out)
    if sc.instances > 1 and args.instance is None:   # several engines at once, merged (engine/testbed/multi_instance.py)
        from mixdiag.engine.telemetry.instrumentation import cli_args
        from mixdiag.engine.testbed.multi_instance import run_instances

        summary = run_instances(args.scenario, sc.instances, out, seed=sc.seed, max_steps=args.max_steps,
                                child_args=cli_args(config_from_args(args)), console=console)
        console.result(f"{sc.name} seed {sc.seed}: {sc.instances} engine instances, {summary['steps']} steps, "
                       f"{summary['output_tokens']} output tokens in {summary['run_s']:.1f} s\nwrote {out}", summary)
        return 0
    icfg = config_from_args(args)
    engine_cfg = sc.engine if args.instance is None else dataclasses.replace(sc.engine, instance=args.instance)
    faults = FaultsConfig.from_dict(sc.faults).for_instance(engine_cfg.instance)
    config = faults.apply(engine_cfg)
    items = generate(sc.workload, sc.seed, config.model.vocab_size, config.model.max_model_len)

    t0 = time.perf_counter()
    model = None
    if sc.checkpoint is not None:
        from mixdiag.engine.model.checkpoint import load_checkpoint

        model = load_checkpoint(sc.checkpoint, config.device, config.model.dtype)
    engine = Engine(config, model=model)
    out.mkdir(parents=True, exist_ok=True)
    injector = FaultInjector(engine, faults) if faults.active else None
    try:
        inst = Instrumentation(icfg, engine, out)
        if inst.server is not None:
            console.note(f"serving Prometheus metrics on {inst.server.url}")
        try:
            truth = TruthRecorder(engine, injector)
            with console.progress(total=max_steps, desc=f"{sc.name} (seed {sc.seed})", unit="step") as bar:
                res = run_workload(engine, items, time_unit=sc.workload.time_unit, max_steps=max_steps,
                                   progress=bar, submit=injector.add_request if injector else None)
        finally:
            inst_summary = inst.close()
    finally:
        if injector is not None:
            injector.close()
    meta = {"source": "mixdiag-engine", "scenario": sc.name, "scenario_file": sc.source, "seed": sc.seed,
            "policy": config.scheduler.policy,
            "model": {"layers": config.model.num_layers, "hidden_size": config.model.hidden_size,
                      "dtype": config.model.dtype, "checkpoint": sc.checkpoint},
            "faults": faults.active}
    tl = to_timeline(res.records, config.instance, meta, signals=inst.signals())
    tl.save(out)
    write_truth(out / "truth.csv", truth.rows)
    summary = {"scenario": sc.name, "seed": sc.seed, "policy": config.scheduler.policy, "out": str(out),
               **summarize(engine, res, tl), "run_s": time.perf_counter() - t0,
               "instrumentation": inst_summary, "faults": faults.active}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n")
    k = summary["steps_by_kind"]
    itl = summary["itl_s"]
    human = (f"{sc.name} seed {sc.seed}: {summary['steps']} steps (prefill {k['prefill']}, decode {k['decode']}, "
             f"mixed {k['mixed']}), {summary['output_tokens']} output tokens in {summary['run_s']:.1f} s; "
             f"ITL p50 {_ms(itl['p50'])} p99 {_ms(itl['p99'])} max {_ms(itl['max'])}"
             + (" (stopped at --max-steps)" if summary["requests"]["truncated_run"] else "") + f"\nwrote {out}")
    console.result(human, summary)
    return 0


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
