"""The inputs of benchmarks/bench_peers.py, cached under benchmarks/.cache/peers/inputs, and what a run
leaves beside its input copy: a simulated Nsight export and 2-rank Kineto trace (tests/helpers/foreign_trace),
a CPU-only Kineto trace recorded from the reference engine, checksums, SQLite index counts."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import peers_env

ROOT = peers_env.ROOT
INPUTS = peers_env.CACHE / "inputs"


def sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def mb(paths) -> float:
    return sum(Path(p).stat().st_size for p in paths) / 1e6


# the simulator runs in a child process: a forked child's peak RSS starts from its parent's, so the
# bench process must stay small for the RSS column to be the tools' own
SIMULATE = """import json, sys
from tests.helpers.foreign_trace import simulate
a = json.loads(sys.argv[1])
t = simulate(a["engine"], a["seed"], a["steps"], None, True, "node", a["fmt"], a["out"], scale=a.get("scale"))
print(json.dumps({"paths": [p.name for p in t.paths], "kernel_rows": t.meta["kernel_rows"]}))
"""


def _simulate(**kw) -> dict:
    out = subprocess.run([sys.executable, "-c", SIMULATE, json.dumps(kw)], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def big_export(kernels: int, say) -> Path:
    path = INPUTS / f"ep2_{kernels}.sqlite"
    if not path.exists():
        INPUTS.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        res = _simulate(engine="ep2", seed=1, steps=400, fmt="nsys", out=str(tmp), scale=kernels)
        tmp.rename(path)
        say(f"simulated {path.name}: {res['kernel_rows']:,} kernel rows, {mb([path]):.0f} MB")
    return path


def kineto_trace(steps: int, say) -> list[Path]:
    folder = INPUTS / f"kineto_ep2_{steps}"
    if not (folder / "done").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        res = _simulate(engine="ep2", seed=3, steps=steps, fmt="kineto", out=str(folder / "trace.json"))
        (folder / "done").write_text(json.dumps(res["paths"]))
        say(f"simulated {folder.name}: {res['kernel_rows']:,} kernel rows, {mb(folder.glob('*.json')):.0f} MB")
    return [folder / n for n in json.loads((folder / "done").read_text())]


def cpu_trace(steps: int, say) -> list[Path]:
    """A Kineto trace of the reference engine on this CPU: real, and without a single GPU kernel."""
    run = INPUTS / f"cpu_run_{steps}"
    if not (run / "trace.json").exists():
        shutil.rmtree(run, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "mixdiag", "run", "--scenario", "mixed-default", "--seed", "7",
                        "--max-steps", str(steps), "--profile", "all", "--out", str(run), "-q"], check=True,
                       cwd=ROOT, capture_output=True)
        say(f"recorded {run.name}/trace.json on CPU: {mb([run / 'trace.json']):.0f} MB")
    return [run / "trace.json"]


def sqlite_indexes(path: Path) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL").fetchone()[0]
    finally:
        con.close()


def copy_fresh(files: list[Path], folder: Path) -> list[Path]:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return [Path(shutil.copy2(f, folder / f.name)) for f in files]


def written_beside(folder: Path, inputs: list[Path], before: set[str]) -> list[str]:
    return sorted(set(os.listdir(folder)) - before - {p.name for p in inputs} - {"_out"})
