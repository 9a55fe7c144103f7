"""One testbed run as a library call: scenario -> faults -> engine + instrumentation -> truth -> Timeline, saved.

::

    result = run_scenario(RunRequest(scenario="demo-mix", out=Path("runs/demo")))
    result.summary["itl_s"]["p99"]

This is what ``mixdiag run`` and ``mixdiag demo`` call, and what each process of a multi-instance
run calls (:mod:`.multi_instance`). It writes the run directory of docs/contracts.md §1: the
Timeline (``steps/tokens/series.parquet``, ``meta.json``), ``summary.json``, ``truth.csv`` and what
the instrumentation writes (``engine.log``, ``metrics.prom``, ``scrapes/``, ``trace.json``); a
scenario with ``instances = N`` writes ``instances/engineI/`` (one such directory per engine) and
their merge at the top. Nothing existing is overwritten.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

from mixdiag.errors import UserError

from mixdiag.engine.telemetry.instrumentation import InstrumentationConfig
from mixdiag.engine.testbed.multi_instance import run_instances

#: ``note(msg)``: a side remark for the operator (the serving URL, the instances started).
Note = Callable[[str], None]
#: ``progress(total=, desc=, unit=)``: a context manager whose value has ``update(n)`` (a tqdm bar).
Progress = Callable[..., ContextManager[Any]]


@dataclass(frozen=True)
class RunRequest:
    """What to run and where. Validated on construction (one-line UserError on bad values)."""

    scenario: str                        # shipped scenario name or a .toml path
    out: Path                            # run directory to create (must be new or empty)
    seed: int | None = None              # overrides the scenario's seed (workload and sampling)
    max_steps: int | None = None         # stop after N steps (default: the scenario's)
    instance: str | None = None          # run only this engine instance (default: all the scenario has)
    instrumentation: InstrumentationConfig = field(default_factory=InstrumentationConfig)

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        if not isinstance(self.scenario, str) or not self.scenario:
            raise UserError("a run needs a scenario name or .toml path")
        if self.max_steps is not None and self.max_steps < 1:
            raise UserError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.instance is not None and not self.instance:
            raise UserError("--instance needs a name (engine0, engine1, ...)")


@dataclass(frozen=True)
class RunResult:
    """What a run wrote: its directory, and ``summary`` exactly as ``summary.json`` holds it."""

    out: Path
    scenario: str
    seed: int
    instances: tuple[str, ...]           # the engines that ran (more than one: a merged multi-instance run)
    summary: dict

    @property
    def merged(self) -> bool:
        """True for a multi-instance run (the top directory merges ``instances/engineN/``)."""
        return len(self.instances) > 1


def check_out(out: Path) -> None:
    """UserError unless ``out`` is new or an empty directory (a run never overwrites)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--out {out} already holds files; choose a new directory (nothing is overwritten)")


def _no_progress(**_kw) -> ContextManager[Any]:
    class _Bar:
        def update(self, n: int = 1) -> None:
            pass
    return contextlib.nullcontext(_Bar())


def run_scenario(request: RunRequest, *, progress: Progress | None = None, note: Note | None = None) -> RunResult:
    """Run ``request`` to completion and write its run directory (see the module docstring)."""
    from mixdiag.engine.testbed import scenario as scen

    sc = scen.load(request.scenario)
    if request.seed is not None:
        sc = sc.with_seed(request.seed)
    check_out(request.out)
    if sc.instances > 1 and request.instance is None:   # several engines at once, merged (.multi_instance)
        summary = run_instances(request, sc.instances, seed=sc.seed, run_child=_run_instance, note=note)
        return RunResult(request.out, sc.name, sc.seed, tuple(summary["instances"]), summary)
    return _run_one(request, sc, progress or _no_progress, note or (lambda msg: None))


def _run_instance(request: RunRequest) -> dict:
    """One instance of a multi-instance run, in its own process: its run directory written, its summary
    as strict JSON data (module level, so the spawned child can unpickle it)."""
    return plain(run_scenario(request).summary)


def _run_one(request: RunRequest, sc, progress: Progress, note: Note) -> RunResult:
    from mixdiag.engine.core.engine import Engine
    from mixdiag.engine.core.records import to_timeline
    from mixdiag.engine.telemetry.instrumentation import Instrumentation
    from mixdiag.engine.testbed.faults import FaultInjector, FaultsConfig
    from mixdiag.engine.testbed.runner import run_workload, summarize
    from mixdiag.engine.testbed.truth import TruthRecorder, write_truth
    from mixdiag.engine.testbed.workload import generate

    out = request.out
    max_steps = request.max_steps or sc.max_steps
    engine_cfg = sc.engine if request.instance is None else dataclasses.replace(sc.engine, instance=request.instance)
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
        inst = Instrumentation(request.instrumentation, engine, out)
        if inst.server is not None:
            note(f"serving Prometheus metrics on {inst.server.url}")
        try:
            truth = TruthRecorder(engine, injector)
            with progress(total=max_steps, desc=f"{sc.name} (seed {sc.seed})", unit="step") as bar:
                res = run_workload(engine, items, time_unit=sc.workload.time_unit, max_steps=max_steps,
                                   progress=bar, submit=injector.add_request if injector else None)
        finally:
            inst_summary = inst.close()
    finally:
        if injector is not None:
            injector.close()
    meta = {"source": "mixdiag-engine", "scenario": sc.name, "scenario_file": sc.source, "seed": sc.seed,
            "policy": config.scheduler.policy,
            # the knobs the run used, so `mixdiag tune` can replay "the current setting"
            "scheduler": {k: v for k, v in dataclasses.asdict(config.scheduler).items()
                          if k != "cudagraph_capture_sizes"},
            "cache": dataclasses.asdict(config.cache), "max_model_len": config.model.max_model_len,
            "model": {"layers": config.model.num_layers, "hidden_size": config.model.hidden_size,
                      "dtype": config.model.dtype, "checkpoint": sc.checkpoint},
            "faults": faults.active}
    tl = to_timeline(res.records, config.instance, meta, signals=inst.signals())
    tl.save(out)
    write_truth(out / "truth.csv", truth.rows)
    summary = {"scenario": sc.name, "seed": sc.seed, "policy": config.scheduler.policy, "out": str(out),
               **summarize(engine, res, tl), "run_s": time.perf_counter() - t0,
               "instrumentation": inst_summary, "faults": faults.active}
    text = json.dumps(summary, indent=2, default=_jsonable)
    (out / "summary.json").write_text(text + "\n")
    # the result carries what the file holds (numpy scalars as Python numbers), so callers agree with it
    return RunResult(out, sc.name, sc.seed, (config.instance,), json.loads(text))


def plain(obj: Any) -> Any:
    """``obj`` as strict JSON data: NaN/inf -> None, numpy scalars -> Python numbers (what ``--json`` prints)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
