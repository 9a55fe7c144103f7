"""The app factory: a Dash pages app (:mod:`.pages`, inside :mod:`.shell`) and the diagnosis exporter's ``/metrics``.

>>> from mixdiag.dashboard.app import bind, create_app, serve
>>> from mixdiag.dashboard.settings import DashboardConfig
>>> app = create_app(DashboardConfig.from_data_path("runs/demo"))   # doctest: +SKIP
>>> serve(bind(app, "127.0.0.1", 8050))                              # doctest: +SKIP
"""
from __future__ import annotations

import logging
from pathlib import Path

import dash
from flask import Response

from mixdiag.dashboard import pages, shell
from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.dashboard.store import DataStore
from mixdiag.errors import UserError
from mixdiag.exporter import DiagnosisExporter


def create_app(config: DashboardConfig, store: DataStore | None = None,
               exporter: DiagnosisExporter | None = None) -> dash.Dash:
    """A Dash app for ``config``: loads ``config.initial`` (if any), serves the pages and ``/metrics``.

    The returned app carries ``app.mixdiag_store``, ``app.mixdiag_exporter`` and
    ``app.mixdiag_live`` for the CLI and tests. Loading errors of the initial data raise
    :class:`~mixdiag.errors.UserError` before anything is served.
    """
    from mixdiag.collectors.prometheus.live import LiveFollower

    exporter = exporter or DiagnosisExporter()
    store = store or DataStore(config, exporter)
    if config.initial is not None:
        store.load_path(config.initial)
    live = LiveFollower(config.prometheus_url, window_s=config.live_window_s, refresh_s=config.refresh_s)

    # Pages are registered by module name (pages_folder=""): nothing is scanned, installed or not.
    app = dash.Dash(__name__, title="mixdiag", update_title=None, serve_locally=True, use_pages=True,
                    pages_folder="", assets_folder=str(Path(__file__).with_name("assets")))
    # A base64 upload is 4/3 of the file plus the JSON envelope of the callback request.
    app.server.config["MAX_CONTENT_LENGTH"] = config.upload_max_bytes * 4 // 3 + 2 * 2**20
    pages.register_pages(app, store, live)
    page_modules = pages.modules()

    def _layout():
        ds = store.get(None)
        return shell.frame(config, shell.key_of(ds) if ds else None, live=bool(config.prometheus_url),
                           pages=page_modules)

    app.layout = _layout
    shell.register(app, store, page_modules)

    @app.server.route("/metrics")
    def _metrics():
        return Response(exporter.render(), mimetype=None, headers={"Content-Type": exporter.content_type})

    app.mixdiag_store = store
    app.mixdiag_exporter = exporter
    app.mixdiag_live = live
    return app


def bind(app: dash.Dash, host: str = "127.0.0.1", port: int = 8050):
    """A threaded WSGI server for ``app`` bound to ``host:port`` (not yet serving); UserError if the port is taken.

    Binding before anything is printed means a URL the CLI prints is one that answers. No banner
    is written to stdout (``--json`` keeps stdout for its one document); request logs only at -v.
    """
    from werkzeug.serving import make_server

    try:
        return make_server(host, int(port), app.server, threaded=True)
    except OSError as e:
        raise UserError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


def serve(server, verbose: bool = False) -> None:
    """Serve until Ctrl+C (the server from :func:`bind`), then release the port."""
    logging.getLogger("werkzeug").setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
