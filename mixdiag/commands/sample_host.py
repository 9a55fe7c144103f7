"""``mixdiag sample-host --pid PID --out FILE.csv``: sample an engine process as the OS sees it (Linux).

Every ``--interval`` seconds: the main thread's state (``T`` = stopped), CPU time and run-queue wait
(``/proc/PID/schedstat``). Read back with the server's other captures (``mixdiag analyze LOG SCRAPES
host.csv``), a stop or a CPU starvation of the engine becomes measured host-stall evidence in the scrape
intervals it fell in (collectors/host/proc_samples.py). Sample the process that runs the engine loop: vLLM's
``VLLM::EngineCore`` (``pgrep -f EngineCore``), SGLang's scheduler.
"""
from __future__ import annotations

import math

from mixdiag.errors import UserError


def register(sub, common):
    p = sub.add_parser("sample-host", parents=[common], help="sample an engine process's stops and CPU waits (Linux /proc)",
                       description="Sample one process every --interval seconds (state, CPU time, run-queue wait from "
                                   "/proc/PID/stat and /proc/PID/schedstat) into a new CSV, for --duration seconds or "
                                   "until the process exits or Ctrl+C.")
    p.add_argument("--pid", type=int, required=True, help="the engine process (vLLM: the VLLM::EngineCore process)")
    p.add_argument("--out", required=True, metavar="FILE.csv", help="CSV to create (never overwritten)")
    p.add_argument("--interval", type=float, default=0.01, metavar="S",
                   help="seconds between samples (default 0.01: a stop is placed within 10 ms)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="seconds to sample (default: until exit)")
    p.set_defaults(func=run)


def run(args, console):
    if not (args.interval > 0 and math.isfinite(args.interval)) or (
            args.duration is not None and not (args.duration > 0 and math.isfinite(args.duration))):
        raise UserError("--interval and --duration must be positive seconds")
    import signal
    import threading

    from mixdiag.collectors.host import proc_samples  # pandas: when sampling, not for --help

    stop = threading.Event()
    # SIGTERM (a supervisor, the vLLM testbed) ends the capture like Ctrl+C: the file is closed whole
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        path = proc_samples.sample(args.pid, args.out, interval_s=args.interval, duration_s=args.duration, stop=stop)
    except KeyboardInterrupt:   # Ctrl+C ends the capture; what was written stays
        path = args.out
    tl = proc_samples.read(str(path))
    ev = tl.series
    stops = ev[(ev["name"] == proc_samples.STOPPED_SERIES) & (ev["value"] > 0)] if len(ev) else ev
    starved = ev[ev["name"] == proc_samples.STARVED_SERIES] if len(ev) else ev
    data = {"out": str(path), "pid": args.pid, "stops": len(stops),
            "stopped_s": float(stops["value"].sum()) if len(stops) else 0.0,
            "cpu_starved": len(starved), "cpu_starved_s": float(starved["value"].sum()) if len(starved) else 0.0}
    console.result(f"{path}: pid {args.pid}, {data['stops']} stop(s) ({data['stopped_s']:.3f} s), "
                   f"{data['cpu_starved']} CPU starvation(s) ({data['cpu_starved_s']:.3f} s)", data)
    return 0
