"""``mixdiag watch``: headless live diagnosis of a Prometheus server or an engine, exported on ``/metrics``.

Every ``--interval`` seconds: poll the source, re-diagnose the last ``--window`` seconds, publish
the result (spike counters only count spikes not seen before). Alert on
``increase(mixdiag_spikes_total{cause="mixing"}[5m])`` like on any other counter.
"""
from __future__ import annotations

import math
import time

from mixdiag.commands.flags import add_serve_flags
from mixdiag.errors import UserError


def register(sub, common):
    p = sub.add_parser("watch", parents=[common], help="follow a Prometheus server or engine; serve the diagnosis on /metrics",
                       description="Headless: poll a Prometheus server or an engine's /metrics, keep the diagnosis "
                                   "of the last --window seconds current and serve it on /metrics.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus server, e.g. http://127.0.0.1:9090")
    src.add_argument("--engine", metavar="URL", help="an engine's metrics URL, e.g. http://127.0.0.1:8000/metrics")
    p.add_argument("--interval", type=float, default=5.0, metavar="S", help="poll every S seconds (default 5)")
    p.add_argument("--window", type=float, default=900.0, metavar="S",
                   help="diagnose the last S seconds (default 900)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N polls (default: run until Ctrl+C)")
    p.add_argument("--no-serve", action="store_true", help="do not serve /metrics (print each update only)")
    add_serve_flags(p, port=9108)
    p.set_defaults(func=run)


def run(args, console):
    from prometheus_client import start_http_server

    from mixdiag.collectors.prometheus.live import LiveFollower
    from mixdiag.diagnosis import diagnose
    from mixdiag.exporter import DiagnosisExporter, check_address

    if not (0.5 <= args.interval <= 3600):
        raise UserError(f"--interval must be 0.5..3600 s, got {args.interval}")
    if not args.window > args.interval:
        raise UserError("--window must be longer than --interval")
    if args.count < 0:
        raise UserError("--count must be >= 0")
    check_address(args.host, args.port)
    url = args.prometheus or args.engine
    follower = LiveFollower(window_s=args.window, refresh_s=args.interval)
    follower.start(url, kind="prometheus" if args.prometheus else "engine")
    exporter = DiagnosisExporter()
    server = None
    if not args.no_serve:
        try:
            server = start_http_server(args.port, addr=args.host, registry=exporter.registry)
        except OSError as e:
            raise UserError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}") from None
        console.note(f"serving the diagnosis on http://{args.host}:{args.port}/metrics")
    console.note(f"following {url} every {args.interval:g} s (window {args.window:g} s)")
    updates, polls, last_verdict = [], 0, None
    try:
        while True:
            t0 = time.monotonic()
            polls += 1
            try:
                tl = follower.poll()
            except UserError as e:
                console.note(f"poll {polls}: {e}")
                tl = None
            if tl is not None and len(tl.steps):
                t_diag = time.perf_counter()
                d = diagnose(tl)
                took = time.perf_counter() - t_diag
                snap = exporter.publish(tl, d, duration_s=took)
                n_new = sum(snap.spikes_total.values())
                update = {"poll": polls, "steps": len(tl.steps), "spikes_total": dict(snap.spikes_total),
                          "verdict": d.verdict, "analysis_s": took}
                updates.append(update)
                if d.verdict != last_verdict:
                    console.note(f"{time.strftime('%H:%M:%S')} {d.verdict} (spikes so far: {n_new})")
                    last_verdict = d.verdict
            if args.count and polls >= args.count:
                break
            time.sleep(max(args.interval - (time.monotonic() - t0), 0.0))
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server[0].shutdown()
    last = updates[-1] if updates else {}
    s = exporter.snapshot
    human = (f"{polls} polls, {len(updates)} diagnoses; spikes by cause: "
             + (", ".join(f"{n} {c}" for c, n in s.spikes_total.items() if n) or "none")
             + (f"\nlast verdict: {last['verdict']}" if last else ""))
    console.result(human, {"source": url, "polls": polls, "diagnoses": len(updates),
                           "spikes_total": s.spikes_total, "verdict": last.get("verdict"),
                           "mixed_steps_ratio": None if math.isnan(s.mixed_steps_ratio) else s.mixed_steps_ratio})
    return 0
