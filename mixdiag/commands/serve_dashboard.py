"""``mixdiag dashboard``: serve the Dash dashboard (and the diagnosis' ``/metrics``) on one port."""
from __future__ import annotations

from mixdiag.commands.flags import add_serve_flags
from mixdiag.errors import UserError


def register(sub, common):
    p = sub.add_parser("dashboard", parents=[common], help="serve the web dashboard and /metrics",
                       description="Serve the Dash dashboard: Overview, Timeline, Spike and Sources pages, "
                                   "with the diagnosis exported on /metrics of the same port. The server reads "
                                   "nothing outside --data.")
    p.add_argument("--data", metavar="PATH",
                   help="a run directory, a folder of runs and captures, or one capture file (the only "
                        "place the server reads)")
    p.add_argument("--prometheus", metavar="URL",
                   help="start in live mode: a Prometheus server (http://host:9090) or an engine /metrics URL")
    p.add_argument("--refresh", type=float, default=5.0, metavar="S", help="live refresh interval (default 5 s)")
    p.add_argument("--upload-max-mib", type=float, default=64.0, metavar="MIB",
                   help="largest upload accepted (default 64 MiB)")
    add_serve_flags(p)
    p.set_defaults(func=run)


def run(args, console):
    from mixdiag.dashboard.app import bind, create_app, serve
    from mixdiag.dashboard.settings import DashboardConfig

    if args.upload_max_mib <= 0:
        raise UserError("--upload-max-mib must be positive")
    config = DashboardConfig.from_data_path(args.data, prometheus_url=args.prometheus, host=args.host,
                                            port=args.port, refresh_s=args.refresh,
                                            upload_max_bytes=int(args.upload_max_mib * 2**20))
    app = create_app(config)
    server = bind(app, config.host, config.port)
    ds = app.mixdiag_store.get(None)
    url = f"http://{config.host}:{config.port}/"
    lines = [f"dashboard: {url}", f"metrics:   {url}metrics"]
    if ds is not None:
        lines.insert(0, f"{ds.label}: {ds.headline.verdict}")
    if config.prometheus_url:
        lines.append(f"live:      following {config.prometheus_url} every {config.refresh_s:g} s")
    console.result("\n".join(lines), {"url": url, "metrics_url": f"{url}metrics",
                                      "verdict": ds.headline.verdict if ds else None,
                                      "by_cause": ds.headline.by_cause if ds else None,
                                      "live": config.prometheus_url})
    console.note("press Ctrl+C to stop")
    serve(server, verbose=console.verbosity > 0)
    return 0


def open_run(out, run_dir, host: str, port: int, serve: bool = True):
    """The dashboard over ``out`` with ``run_dir`` loaded (``mixdiag demo``): (headline, bound server or None).

    The only door from ``mixdiag/`` into ``mixdiag.dashboard`` besides :func:`run`.
    """
    from pathlib import Path

    from mixdiag.dashboard.app import bind, create_app
    from mixdiag.dashboard.settings import DashboardConfig
    from mixdiag.dashboard.store import DataStore
    from mixdiag.exporter import DiagnosisExporter

    out, run_dir = Path(out), Path(run_dir)
    config = DashboardConfig(data_dir=out, host=host, port=port)
    exporter = DiagnosisExporter()
    store = DataStore(config, exporter)
    ds = store.load_path(str(run_dir.relative_to(out)) if run_dir != out else ".")
    server = bind(create_app(config, store=store, exporter=exporter), config.host, config.port) if serve else None
    return ds.headline, server


def serve_forever(server, verbose: bool = False) -> None:
    """Serve a server from :func:`open_run` until Ctrl+C."""
    from mixdiag.dashboard.app import serve

    serve(server, verbose=verbose)
