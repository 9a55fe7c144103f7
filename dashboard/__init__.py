"""The Dash dashboard and the Prometheus exporter of the diagnosis.

``create_app(DashboardConfig(...))`` builds the app (:mod:`.app`); layout (:mod:`.layout`),
callbacks (:mod:`.callbacks`), data access (:mod:`.store`, :mod:`.live`, :mod:`.isolate`), page
data (:mod:`.views`, :mod:`.stats`) and figure builders (:mod:`.figures`, :mod:`.downsample`) are
separate modules. Dash is imported only when the app is built.
"""

__all__ = ["DashboardConfig", "bind", "create_app", "serve"]


def __getattr__(name):  # lazy: the exporter and figure builders must not pay for importing Dash
    if name in ("bind", "create_app", "serve"):
        from mixdiag.dashboard import app

        return getattr(app, name)
    if name == "DashboardConfig":
        from mixdiag.dashboard.settings import DashboardConfig

        return DashboardConfig
    raise AttributeError(f"module 'mixdiag.dashboard' has no attribute {name!r}")
