"""Multi-instance runs: several engines (``engine0``, ``engine1``, ...) side by side, one Timeline.

A scenario with ``instances = N`` runs N engine *processes* at once (``mixdiag run --instance
engineI --seed SEED+I`` each, so every engine gets its own traffic and they compete for the same
cores, as data-parallel engines on one host do). Each child writes a full run directory under
``OUT/instances/engineI/`` (its own instrumentation files included); the parent merges their
Timelines (:meth:`~mixdiag.schema.Timeline.concat`) and ground truth into ``OUT`` and writes one
``summary.json`` with the per-instance summaries. Faults scoped with ``instances = [...]`` in the
``[faults]`` table apply only to those engines. Instrumentation flags given to the parent are
passed to every instance (each names its files after its instance; ``--serve PORT`` serves
instance N on PORT + N).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from mixdiag.errors import UserError


def instance_names(n: int) -> list[str]:
    return [f"engine{i}" for i in range(n)]


def run_instances(scenario: str, n: int, out: Path, *, seed: int, max_steps: int | None = None,
                  child_args: list[str] = (), console=None) -> dict:
    """Run ``n`` engines on ``scenario`` concurrently, merge their run directories into ``out``.

    Returns the merged summary (also written to ``out/summary.json``).
    """
    from mixdiag.schema import Timeline

    from mixdiag.engine.testbed.truth import read_truth, write_truth

    t0 = time.perf_counter()
    subs = {name: out / "instances" / name for name in instance_names(n)}
    procs = {}
    for i, (name, sub) in enumerate(subs.items()):
        cmd = [sys.executable, "-m", "mixdiag", "run", "--scenario", scenario, "--out", str(sub),
               "--instance", name, "--seed", str(seed + i), "--json", "-q", *child_args]
        if max_steps is not None:
            cmd += ["--max-steps", str(max_steps)]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if console is not None:
        console.note(f"running {n} engine instances of {scenario} (instances/engine0..engine{n - 1})")
    results = {name: p.communicate() for name, p in procs.items()}
    failed = [(name, procs[name].returncode, err) for name, (_, err) in results.items() if procs[name].returncode]
    if failed:
        name, rc, err = failed[0]
        tail = (err or "").strip().splitlines()[-1:] or [""]
        raise UserError(f"instance {name} failed (exit {rc}): {tail[0]}")
    summaries = {name: json.loads(stdout) for name, (stdout, _) in results.items()}
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
