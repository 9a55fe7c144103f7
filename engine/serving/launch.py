"""Build a serving engine from a scenario (model, cache, scheduler, faults) and run it under uvicorn.

The scenario file gives the engine (as ``mixdiag run``); its ``[workload]`` is ignored - clients
bring the load. ``--scheduler``/``--chunk-size`` override its scheduler table. Faults apply as in
``mixdiag run`` (step-numbered faults count the server's steps from start-up).
"""
from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from mixdiag.errors import UserError


@dataclass(frozen=True)
class ServeOptions:
    """Engine-side choices of ``mixdiag serve``."""

    scenario: str = "mixed-default"
    seed: int | None = None
    policy: str | None = None          # --scheduler: token_budget | mix_running | prefill_first
    chunk_size: int | None = None      # --chunk-size: max_num_batched_tokens and chunked_prefill_size
    out_dir: str | None = None         # logs, profile, scrapes, metrics.prom go here

    def __post_init__(self):
        from mixdiag.engine.core.schedulers import POLICIES

        if self.policy is not None and self.policy not in POLICIES:
            raise UserError(f"--scheduler must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise UserError(f"--chunk-size must be >= 1, got {self.chunk_size}")


def build_state(opts: ServeOptions, server_cfg, icfg):
    """Engine + instrumentation + tokenizer + engine loop -> a :class:`ServingState`."""
    from mixdiag.engine.core.engine import Engine
    from mixdiag.engine.serving.engine_loop import EngineLoop
    from mixdiag.engine.serving.server import ServingState
    from mixdiag.engine.serving.tokenizer import SHIPPED_DIR, TextTokenizer
    from mixdiag.engine.telemetry.instrumentation import Instrumentation
    from mixdiag.engine.testbed import scenario as scen
    from mixdiag.engine.testbed.faults import FaultInjector, FaultsConfig

    sc = scen.load(opts.scenario)
    if opts.seed is not None:
        sc = sc.with_seed(opts.seed)
    ecfg = sc.engine
    sched = ecfg.scheduler
    if opts.policy is not None:
        sched = dataclasses.replace(sched, policy=opts.policy)
    if opts.chunk_size is not None:
        sched = dataclasses.replace(sched, max_num_batched_tokens=opts.chunk_size, chunked_prefill_size=opts.chunk_size)
    ecfg = dataclasses.replace(ecfg, scheduler=sched)
    faults = FaultsConfig.from_dict(sc.faults).for_instance(ecfg.instance)
    config = faults.apply(ecfg)
    model = None
    tok_dir = SHIPPED_DIR
    if sc.checkpoint is not None:
        from mixdiag.engine.model.checkpoint import load_checkpoint

        model = load_checkpoint(sc.checkpoint, config.device, config.model.dtype)
        tok_dir = Path(sc.checkpoint)
    tokenizer = TextTokenizer(tok_dir, model_vocab_size=config.model.vocab_size)
    engine = Engine(config, model=model)
    injector = FaultInjector(engine, faults) if faults.active else None
    out = Path(opts.out_dir) if opts.out_dir else None
    inst = Instrumentation(icfg, engine, out)
    # the server's truth (as ``mixdiag run``): which cause shaped each step, and when each step ran on
    # the wall clock, so client-seen stalls can be checked against it (evaluation only)
    truth = ServerTruth(engine, injector, out) if out is not None else None
    loop = EngineLoop(engine, injector.add_request if injector else None,
                      on_abort=lambda eng: refresh_gauges(inst.metrics, eng))

    def close():
        inst.close(linger_s=0.0)
        if truth is not None:
            truth.write()
        if injector is not None:
            injector.close()

    state = ServingState(server_cfg, loop, tokenizer, inst.registry, on_shutdown=[close])
    state.scenario = sc
    state.faults = faults.active
    return state


# The state gauges each metrics dialect keeps, by attribute: (running, waiting, KV usage).
_GAUGE_ATTRS = (("running", "waiting", "kv_usage"),      # mixdiag's own and vLLM's
                ("running", "queued", "token_usage"))    # SGLang's


def refresh_gauges(metrics, engine) -> None:
    """Set the running / waiting / KV-usage gauges of ``metrics`` (any dialect) to ``engine``'s state now.

    Step observers set them from each step's record; aborts happen between steps, so without this a
    server that went idle by aborts keeps the last step's values (running > 0, KV in use) forever.
    """
    for names in _GAUGE_ATTRS:
        gauges = [getattr(metrics, n, None) for n in names]
        if all(g is not None for g in gauges):
            sched = engine.scheduler
            for g, v in zip(gauges, (sched.num_running, sched.num_waiting, engine.kv_manager.usage)):
                g.set(v)
            return
    raise TypeError(f"{type(metrics).__name__} has no running/waiting/KV-usage gauges")


class ServerTruth:
    """``truth.csv`` (instance, step, cause) and ``steps.csv`` (step, kind, wall-clock start/end, host
    stall before it) of a served engine, written at shutdown into the ``--out`` directory."""

    def __init__(self, engine, injector, out: Path):
        from mixdiag.engine.testbed.truth import TruthRecorder

        self.out = out
        self.injector = injector
        self.recorder = TruthRecorder(engine, injector)
        self.steps: list[tuple[int, str, float, float]] = []
        engine.observers.append(lambda rec: self.steps.append((rec.step, rec.kind, rec.t_start_s, rec.t_end_s)))

    def write(self) -> None:
        from mixdiag.engine.testbed.truth import write_truth

        write_truth(self.out / "truth.csv", self.recorder.rows, overwrite=True)
        stalls = self.injector.state.stalled_steps if self.injector is not None else {}
        with (self.out / "steps.csv").open("w") as f:
            f.write("step,kind,t_start_s,t_end_s,host_stall_s\n")
            for n, kind, t0, t1 in self.steps:
                f.write(f"{n},{kind},{t0:.6f},{t1:.6f},{stalls.get(n, 0.0):.6f}\n")


def serve(opts: ServeOptions, server_cfg, icfg, *, announce=None) -> int:
    """Bind, print the URL, serve until SIGTERM/SIGINT (draining open streams); returns 0."""
    from mixdiag.engine.serving.server import bind, create_app, make_uvicorn

    # The engine thread holds the GIL for its Python work between torch ops; a short switch interval
    # lets the event loop flush each step's chunks promptly instead of several steps' at once.
    sys.setswitchinterval(0.0005)
    state = build_state(opts, server_cfg, icfg)
    sock = bind(server_cfg.host, server_cfg.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    server = make_uvicorn(create_app(state), server_cfg)
    msg = (f"mixdiag serve: {state.scenario.name} (policy {state.loop.engine.config.scheduler.policy}"
           f"{', faults ' + ','.join(state.faults) if state.faults else ''}) model {server_cfg.model_name!r} "
           f"listening on {url}")
    (announce or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)
    # uvicorn drains on SIGTERM/SIGINT, restores the handlers it found, then re-raises the signal;
    # with these no-op handlers in place the drained server exits 0 instead of dying by the signal.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
    server.run(sockets=[sock])
    return 0
