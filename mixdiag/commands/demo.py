"""``mixdiag demo``: run the reference engine on the demo scenario, diagnose it, write the report, serve it.

The first thing a new user runs (``make demo``). Nothing existing is overwritten: when ``--out``
already holds something, the run goes to the first free ``OUT/run-N``.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from mixdiag.commands.flags import add_serve_flags
from mixdiag.errors import UserError

DEFAULT_SCENARIO = "demo-mix"


def pick_run_dir(out: Path) -> Path:
    """``out`` when it does not exist or is empty, else the first ``out/run-N`` (N >= 1) that does not exist."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory")
    if not out.exists() or not any(out.iterdir()):
        return out
    for n in range(1, 10_000):
        cand = out / f"run-{n}"
        if not cand.exists():
            return cand
    raise UserError(f"{out} already holds 9999 runs; choose another --out")


def register(sub, common):
    p = sub.add_parser("demo", parents=[common], help="run the engine on the demo scenario, diagnose it, serve it",
                       description="Run the reference engine on a scenario with several causes of TPOT spikes, "
                                   "write the run directory and report.html, print the verdict and serve the "
                                   "dashboard (unless --no-serve).")
    p.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="where the run goes (default runs/demo; an existing run is kept: DIR/run-N is used)")
    p.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"engine scenario (default {DEFAULT_SCENARIO})")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help="stop the engine after N steps (default: the scenario's; for a quick look)")
    p.add_argument("--no-serve", action="store_true", help="stop after writing the report (headless)")
    add_serve_flags(p)
    p.set_defaults(func=run)


def run_engine(scenario: str, run_dir: Path, console, max_steps: int | None = None) -> float:
    """Run the engine on ``scenario`` into ``run_dir`` (what ``mixdiag run`` does); the seconds it took."""
    from mixdiag.engine.testbed.session import RunRequest, run_scenario

    t = time.perf_counter()
    # as when it was a child `mixdiag run`: its progress bar on stderr, unless -q or --json
    run_scenario(RunRequest(scenario=scenario, out=run_dir, max_steps=max_steps),
                 progress=None if console.json_mode else console.progress, note=console.note)
    return time.perf_counter() - t


def write_report(run_dir: Path) -> Path:
    """``mixdiag analyze RUN_DIR --html RUN_DIR/report.html`` (the same report ``analyze`` writes)."""
    path = run_dir / "report.html"
    cmd = [sys.executable, "-m", "mixdiag", "analyze", str(run_dir), "--html", str(path), "-q"]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stderr or "").strip().splitlines()[-1:]
        raise UserError(f"writing {path} failed" + (f": {tail[0]}" if tail else ""))
    return path


def check_port_free(host: str, port: int) -> None:
    """UserError now, not after minutes of engine work, when ``host:port`` cannot be bound."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as e:
            raise UserError(f"cannot serve on {host}:{port}: {e.strerror or e} (use --port or --no-serve)") from None


def run(args, console):
    from mixdiag.exporter import check_address

    out = Path(args.out)
    run_dir = pick_run_dir(out)
    # Validate serving flags before minutes of engine work.
    host, port = check_address(args.host, args.port)
    if not args.no_serve:
        check_port_free(host, port)
    console.note(f"running the engine on scenario '{args.scenario}' into {run_dir}")
    if args.max_steps is not None and args.max_steps < 1:
        raise UserError(f"--max-steps must be >= 1, got {args.max_steps}")
    took = run_engine(args.scenario, run_dir, console, max_steps=args.max_steps)
    report = write_report(run_dir)

    from mixdiag.commands.serve_dashboard import open_run, serve_forever

    h, server = open_run(out, run_dir, host, port, serve=not args.no_serve)
    url = f"http://{host}:{port}/"
    causes = {c: n for c, n in h.by_cause.items() if n}
    lines = [f"run:     {run_dir} ({h.n_steps:,} steps, engine {took:.0f} s)",
             f"report:  {report}",
             f"verdict: {h.verdict}",
             "spikes:  " + (", ".join(f"{n} {c}" for c, n in causes.items()) or "none")]
    if not args.no_serve:
        lines.append(f"dashboard: {url}  (metrics: {url}metrics; Ctrl+C to stop)")
    console.result("\n".join(lines), {"run_dir": str(run_dir), "report": str(report), "verdict": h.verdict,
                                      "by_cause": h.by_cause, "steps": h.n_steps, "engine_s": took,
                                      "url": None if args.no_serve else url})
    if args.no_serve:
        return 0
    serve_forever(server, verbose=console.verbosity > 0)
    return 0
