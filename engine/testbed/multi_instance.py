"""Multi-instance runs: several engines (``engine0``, ``engine1``, ...) side by side, one Timeline.

A scenario with ``instances = N`` runs N engine *processes* at once, started with ``multiprocessing``
(spawn context: a fresh interpreter each, so no torch state or threads are inherited); each runs
the ``run_child`` function :mod:`.session` hands in (``run_scenario`` for one instance; handed in so
this module never imports the session) for instance ``engineI`` with seed ``SEED+I``,
so every engine gets its own traffic and they compete for the same cores, as data-parallel engines
on one host do. Each writes a full run directory under ``OUT/instances/engineI/`` (its own
instrumentation files included); the parent merges their Timelines
(:meth:`~mixdiag.schema.Timeline.concat`) and ground truth into ``OUT`` and writes one
``summary.json`` with the per-instance summaries. Faults scoped with ``instances = [...]`` in the
``[faults]`` table apply only to those engines. The request's instrumentation applies to every
instance (each names its files after its instance; ``serve_port`` PORT serves instance N on PORT + N).
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable

from mixdiag.errors import UserError


def instance_names(n: int) -> list[str]:
    """The instance names of an ``n``-engine run: ``engine0`` .. ``engine<n-1>``."""
    return [f"engine{i}" for i in range(n)]


def run_instances(request: Any, n: int, *, seed: int, run_child: Callable[[Any], dict],
                  note: Callable[[str], None] | None = None) -> dict:
    """Run ``n`` engines on ``request.scenario`` concurrently, merge their run directories into ``request.out``.

    ``request`` is a :class:`~.session.RunRequest`; each child gets a copy with its own ``out``,
    ``instance`` and ``seed``. ``run_child(child_request)`` runs in a spawned process and returns that
    instance's summary as strict JSON data, so it must be a module-level (picklable) function.
    Returns the merged summary (also written to ``out/summary.json``).
    """
    from mixdiag.schema import Timeline

    from mixdiag.engine.testbed.truth import read_truth, write_truth

    t0 = time.perf_counter()
    out = request.out
    subs = {name: out / "instances" / name for name in instance_names(n)}
    children = {name: dataclasses.replace(request, out=sub, instance=name, seed=seed + i)
                for i, (name, sub) in enumerate(subs.items())}
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(run_child, child) for name, child in children.items()}
        if note is not None:
            note(f"running {n} engine instances of {request.scenario} (instances/engine0..engine{n - 1})")
        summaries, failed = {}, []
        for name, fut in futures.items():
            try:
                summaries[name] = fut.result()
            except Exception as e:  # a UserError or crash in the child (BrokenProcessPool when it died)
                failed.append((name, e))
    if failed:
        name, e = failed[0]
        msg = str(e).strip().splitlines()[-1:] or [type(e).__name__]
        raise UserError(f"instance {name} failed: {msg[0]}")
    timelines = [Timeline.load(sub) for sub in subs.values()]
    merged = Timeline.concat(timelines)
    first = summaries[instance_names(n)[0]]
    merged.meta.update({"source": "mixdiag-engine", "scenario": first.get("scenario"), "seed": seed,
                        "instances": list(subs)})
    merged.save(out)
    rows = [r for sub in subs.values() for r in read_truth(sub / "truth.csv")]
    write_truth(out / "truth.csv", rows)
    summary = {"scenario": first.get("scenario"), "seed": seed, "out": str(out), "instances": summaries,
               "steps": sum(s["steps"] for s in summaries.values()),
               "output_tokens": sum(s["output_tokens"] for s in summaries.values()),
               "faults": sorted({f for s in summaries.values() for f in s.get("faults", [])}),
               "run_s": time.perf_counter() - t0}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
